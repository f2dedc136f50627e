"""Models from Hugging Face transformers itself: tiny random-weight configs of architectures whose norms are spelled
differently, exported with torch's dynamo exporter (and its raw translation, without its own optimization), fused
(target custom), run and compared through `verify`.

The expected count comes from the torch module, not from the graph: every call of a module whose class is an
RMSNorm (``*RMSNorm``, ``*RMSNormGated``) must become one fused node, and a LayerNorm written out without a bias
(Cohere) or without parameters (OLMo) must stay as it is. No weights are downloaded: the configs are built here.
transformers is pinned by scripts/setup; without it this module is skipped.
"""

from __future__ import annotations

from collections import Counter

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from export.fusing import fuse_file, op_counts  # noqa: E402

from ort_rmsnorm import verify  # noqa: E402
from ort_rmsnorm.builders.exporters import TORCH_DTYPES, export  # noqa: E402

pytestmark = pytest.mark.torch

VOCAB = 128
COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              vocab_size=VOCAB, max_position_embeddings=64, pad_token_id=0)

# model_type -> config overrides, and what each shows.
ARCHITECTURES = {
    "llama": {},  # float32 statistic, cast back, then the weight; residual adds become SkipRMSNorm
    "qwen3": dict(head_dim=16),  # q_norm / k_norm over head_dim of [batch, sequence, heads, head_dim]
    "gemma3_text": dict(head_dim=16),  # (1 + w) in float32, the cast after the scale; four norms per layer
    "olmo2": {},  # post-norms on the sublayers' outputs, q/k norms over the whole projection
    "bitnet": {},  # extra norms inside attention and MLP
    "mamba2": dict(num_heads=8, head_dim=16, state_size=16, n_groups=1, chunk_size=8),  # gated norm, float32 residual
    "falcon_h1": dict(head_dim=16, mamba_d_ssm=64, mamba_n_heads=4, mamba_d_head=16, mamba_d_state=16,
                      mamba_n_groups=1, mamba_rms_norm=True),  # attention and Mamba side by side
    "cohere": {},  # LayerNorm without bias, written out: must not fuse
    "olmo": {},  # LayerNorm without parameters: must not fuse
}
# Each export takes 5-25 s (qwen3_next's gated norm exports in 160 s: checked by hand, see docs/fusion.md):
# float16 where its casts are spelled differently from float32's.
FLOAT16 = ("llama", "gemma3_text", "mamba2")
COMBINATIONS = [(model_type, "float32") for model_type in ARCHITECTURES] + [(name, "float16") for name in FLOAT16]
# dynamo's raw translation (optimize=False), at the default opset and at 23: axes from Reshape(Constant, Constant).
UNOPTIMIZED = [(model_type, opset) for model_type in ("llama", "qwen3", "gemma3_text") for opset in (18, 23)]


def _norm_calls(model, input_ids) -> Counter:
    """How often each norm module runs in one forward pass, by class name."""
    calls: Counter = Counter()
    hooks = [module.register_forward_hook(lambda module, *_: calls.update([type(module).__name__]))
             for module in model.modules() if "Norm" in type(module).__name__]
    with torch.no_grad():
        model(input_ids=input_ids, use_cache=False)
    for hook in hooks:
        hook.remove()
    return calls


class _Logits(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, use_cache=False).logits


def _build(model_type: str, dtype: str):
    transformers.logging.set_verbosity_error()  # reference-implementation fallbacks (Mamba) are expected on CPU
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(model_type, **{**COMMON, **ARCHITECTURES[model_type]})
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # norm weights away from their ones/zeros init, so that a lost scale shows
        for module in model.modules():
            if "Norm" in type(module).__name__:
                for parameter in module.parameters(recurse=False):
                    parameter.add_(0.1 * torch.randn_like(parameter))
    return model.to(TORCH_DTYPES[dtype]).eval()


@pytest.mark.parametrize("model_type, dtype", COMBINATIONS)
def test_transformers_model_fuses_every_rmsnorm(model_type, dtype, tmp_path):
    _check_fuses_every_rmsnorm(model_type, dtype, tmp_path)


@pytest.mark.parametrize("model_type, opset", UNOPTIMIZED)
def test_unoptimized_export_fuses_as_the_optimized_one(model_type, opset, tmp_path):
    report = _check_fuses_every_rmsnorm(model_type, "float32", tmp_path, opset=opset, optimize=False)
    assert not report.skipped, report.summary()


def _check_fuses_every_rmsnorm(model_type, dtype, tmp_path, *, opset=None, optimize=True):
    model = _build(model_type, dtype)
    input_ids = torch.randint(1, VOCAB, (2, 8), generator=torch.Generator().manual_seed(0))
    calls = _norm_calls(model, input_ids)
    rmsnorms = sum(count for name, count in calls.items() if "RMSNorm" in name)
    assert rmsnorms or any("LayerNorm" in name for name in calls), calls

    original = tmp_path / f"{model_type}.onnx"
    export(_Logits(model), (input_ids,), original, exporter="dynamo", input_names=["input_ids"],
           output_names=["logits"], dynamic_dims={"input_ids": {0: "batch", 1: "sequence"}}, opset=opset,
           optimize=optimize)
    fused, report = fuse_file(original)

    before, after = op_counts(original), op_counts(fused)
    assert len(report.fusions) == rmsnorms == after["RMSNorm"] + after["SkipRMSNorm"], (calls, report.summary())
    if not rmsnorms:  # LayerNorm models come out as they went in; a written-out one is named as such
        assert after == before
        assert all("LayerNorm" in skipped.reason for skipped in report.skipped), report.summary()
    result = verify.verify(original, fused)
    assert result.ok, result.describe()
    return report


class _MaskedLogits(torch.nn.Module):
    """Logits with an all-ones attention mask: without one, transformers' mask code calls aten::diff, which the
    TorchScript exporter cannot write."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), use_cache=False).logits


def test_torchscript_bitnet_fuses_the_sub_norms_scales(tmp_path):
    """BitNet's attn_sub_norm normalizes the attention output reshaped to [batch, sequence, -1]: ONNX's shape
    inference leaves that last dim unknown (repeat_kv's Expand of a computed shape), the graph fixes it (symbolic
    shape inference follows the dims through). Every norm is fused with its scale."""
    model = _build("bitnet", "float32")
    model.config._attn_implementation = "eager"
    input_ids = torch.randint(1, VOCAB, (1, 8), generator=torch.Generator().manual_seed(0))
    calls = _norm_calls(model, input_ids)
    original = tmp_path / "bitnet.onnx"
    export(_MaskedLogits(model), (input_ids,), original, exporter="torchscript", input_names=["input_ids"],
           output_names=["logits"], dynamic_dims={})
    fused, report = fuse_file(original)

    assert not report.skipped, report.summary()
    assert len(report.fusions) == sum(calls.values()) and all(f.scale == "tensor" for f in report.fusions)
    result = verify.verify(original, fused)
    assert result.ok, result.describe()
