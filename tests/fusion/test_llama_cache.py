"""The onnx.helper Llama with a KV cache (``build_llama_onnx(kv_cache=True)``): a prefill then a decode step through
the cache compute what one forward over all the tokens computes, and the pass fuses every norm of it as it does
without the cache."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import ort_rmsnorm
from ort_rmsnorm import runtime
from ort_rmsnorm.builders.llama import LlamaConfig, build_llama_onnx
from ort_rmsnorm.verify import verify

CONFIG = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2)


def _cache(model: onnx.ModelProto, length: int, dtype=np.float32) -> dict[str, np.ndarray]:
    return {value.name: np.zeros((1, CONFIG.num_heads, length, CONFIG.head_dim), dtype)
            for value in model.graph.input if value.name.startswith("past_key_values.")}


def test_cached_steps_match_one_forward():
    ids = np.random.default_rng(0).integers(0, CONFIG.vocab_size, (1, 7), dtype=np.int64)
    whole = runtime.run(runtime.make_session(build_llama_onnx(CONFIG)), {"input_ids": ids})[0].astype(np.float64)
    cached = build_llama_onnx(CONFIG, kv_cache=True)
    session = runtime.make_session(cached)
    names = [output.name for output in session.get_outputs()]
    assert names[0] == "logits" and len(names) == 1 + 2 * CONFIG.num_layers
    prefill = runtime.run(session, {"input_ids": ids[:, :5], **_cache(cached, 0)})
    past = {name.replace("present.", "past_key_values."): value for name, value in zip(names[1:], prefill[1:])}
    decode = runtime.run(session, {"input_ids": ids[:, 5:], **past})
    assert decode[1].shape == (1, CONFIG.num_heads, 7, CONFIG.head_dim)
    scale = np.abs(whole).max()
    np.testing.assert_allclose(prefill[0], whole[:, :5], rtol=0, atol=1e-5 * scale)
    np.testing.assert_allclose(decode[0], whole[:, 5:], rtol=0, atol=1e-5 * scale)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_every_norm_fuses_with_the_cache(dtype):
    original = build_llama_onnx(CONFIG, dtype, kv_cache=True)
    fused, report = ort_rmsnorm.fuse(original)
    assert len(report.fusions) == CONFIG.norm_count and not report.skipped
    feeds = {"input_ids": np.array([[3]], np.int64), **_cache(original, 4, np.dtype(dtype))}
    assert verify(original, fused, inputs=feeds).ok
