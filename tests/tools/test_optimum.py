"""optimum on a fused folder: ``ORTModelForCausalLM`` with our session options generates the tokens of the unfused
export, and ``ORTOptimizer`` (which opens its own session) works inside ``everywhere()`` and fails outside with the
message docs/deploy.md names.

optimum-onnx is no test extra: its releases up to 0.1.0 require transformers < 4.58, and the tests pin transformers
5.24 for genai's model builder. These tests skip without it; in a venv of its own (``pip install optimum-onnx`` and
this package) they run.
"""

from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch", reason="optimum's exporter needs torch")
optimum_onnxruntime = pytest.importorskip(
    "optimum.onnxruntime",
    reason="optimum-onnx is not installed (it requires transformers < 4.58; the tests pin 5.24): "
           "pip install optimum-onnx in a venv of its own to run these tests",
)
transformers = pytest.importorskip("transformers")

import ort_rmsnorm  # noqa: E402

pytestmark = pytest.mark.torch
PROMPT = [[1, 5, 9, 3]]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """(unfused, fused): optimum's export of a tiny random Llama, and the folder ``fuse_folder`` writes."""
    root = tmp_path_factory.mktemp("optimum")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    transformers.LlamaForCausalLM(config).eval().save_pretrained(root / "hf")
    optimum_onnxruntime.ORTModelForCausalLM.from_pretrained(root / "hf", export=True).save_pretrained(root / "onnx")
    report = ort_rmsnorm.fuse_folder(root / "onnx", root / "fused")
    assert "5 fused" in report.summary(), report.summary()
    return root / "onnx", root / "fused"


def _tokens(model) -> list[list[int]]:
    ids = torch.tensor(PROMPT)
    return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                          pad_token_id=0).tolist()


def test_ort_model_with_our_session_options_generates_the_same_tokens(folders):
    unfused, fused = folders
    expected = _tokens(optimum_onnxruntime.ORTModelForCausalLM.from_pretrained(unfused))
    got = _tokens(optimum_onnxruntime.ORTModelForCausalLM.from_pretrained(
        fused, session_options=ort_rmsnorm.session_options()))
    assert got == expected


def test_ort_optimizer(folders, tmp_path):
    from optimum.onnxruntime.configuration import OptimizationConfig

    unfused, fused = folders
    expected = _tokens(optimum_onnxruntime.ORTModelForCausalLM.from_pretrained(unfused))
    model = optimum_onnxruntime.ORTModelForCausalLM.from_pretrained(fused, session_options=ort_rmsnorm.session_options())
    with pytest.raises(Exception, match=re.escape("ort_rmsnorm:RMSNorm(-1) is not a registered function/op")):
        optimum_onnxruntime.ORTOptimizer.from_pretrained(model).optimize(OptimizationConfig(optimization_level=2),
                                                                         save_dir=tmp_path / "outside")
    with ort_rmsnorm.everywhere():
        optimum_onnxruntime.ORTOptimizer.from_pretrained(model).optimize(OptimizationConfig(optimization_level=2),
                                                                         save_dir=tmp_path / "optimized")
        optimized = optimum_onnxruntime.ORTModelForCausalLM.from_pretrained(tmp_path / "optimized",
                                                                            file_name="model_optimized.onnx")
        assert _tokens(optimized) == expected
