"""Fixtures of the tool tests: the demo's Llama-style model, float32 and int4, unfused and fused (built once)."""

from __future__ import annotations

import onnx
import pytest

from ort_rmsnorm.model.write import save_model
from ort_rmsnorm.builders import int4
from ort_rmsnorm.builders.llama import build_llama_onnx
from tools.tool_models import CONFIG, Pair, fused_pair


@pytest.fixture(scope="session")
def llama_models(tmp_path_factory) -> dict[str, Pair]:
    """``float`` (shapes of every value stored, as the demo writes it) and ``int4`` (MatMulNBits)."""
    folder = tmp_path_factory.mktemp("llama")
    source = folder / "llama.onnx"
    save_model(onnx.shape_inference.infer_shapes(build_llama_onnx(CONFIG), strict_mode=True, data_prop=True),
               source)
    pairs = {"float": fused_pair(folder, "llama", source)}
    if int4.unavailable() is None:
        quantized = folder / "llama.int4.onnx"
        int4.quantize(source, quantized)
        pairs["int4"] = fused_pair(folder, "llama.int4", quantized)
    return pairs


@pytest.fixture(scope="session", params=["float", "int4"])
def llama(request, llama_models) -> Pair:
    if request.param not in llama_models:
        pytest.skip(int4.unavailable())
    return llama_models[request.param]


