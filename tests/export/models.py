"""Small torch modules with the RMSNorm spellings real models use, and LayerNorms that must stay unfused.

Each :class:`Case` builds a module whose norms are counted from the module itself (:func:`count_modules`), never
from the exported graph. Importing this module imports torch.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch
from torch import nn

from ort_rmsnorm.builders.llama import LlamaConfig
from ort_rmsnorm.builders.exporters import LlamaMLP, LlamaModel, LlamaRMSNorm, build_llama

HIDDEN = 16


def _gain(shape) -> nn.Parameter:
    """A learned gain that is not all ones, so that a lost scale shows."""
    return nn.Parameter(1.0 + 0.1 * torch.randn(shape))


class T5LayerNorm(nn.Module):
    """Hugging Face's T5LayerNorm: no mean subtraction, variance in float32, weight multiply in the weight's type."""

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = _gain(hidden_size)
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        if self.weight.dtype in (torch.float16, torch.bfloat16):
            hidden_states = hidden_states.to(self.weight.dtype)
        return self.weight * hidden_states


class GemmaRMSNorm(nn.Module):
    """Hugging Face's GemmaRMSNorm: float32 throughout, scale ``(1 + weight)``, one cast back at the end."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(0.1 * torch.randn(dim))

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        output = self._norm(x.float())
        output = output * (1.0 + self.weight.float())
        return output.type_as(x)


class ManualLayerNorm(nn.Module):
    """A LayerNorm written out (mean subtracted over the same axis as the variance): looks like an RMSNorm of
    ``x - mean(x)``, and must never be fused as one."""

    def __init__(self, hidden_size: int, eps: float = 1e-5):
        super().__init__()
        self.weight = _gain(hidden_size)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        centered = x - x.mean(-1, keepdim=True)
        return self.weight * centered / torch.sqrt(centered.pow(2).mean(-1, keepdim=True) + self.eps)


class NormBlock(nn.Module):
    """RMSNorm -> Linear -> nn.LayerNorm -> Linear -> written-out LayerNorm."""

    def __init__(self, hidden_size: int = HIDDEN):
        super().__init__()
        self.rms_norm = LlamaRMSNorm(hidden_size)
        self.up = nn.Linear(hidden_size, hidden_size)
        self.layer_norm = nn.LayerNorm(hidden_size)
        self.down = nn.Linear(hidden_size, hidden_size)
        self.manual_layer_norm = ManualLayerNorm(hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.manual_layer_norm(self.down(self.layer_norm(self.up(self.rms_norm(x)))))


class Float32Logits(nn.Module):
    """A model whose logits are cast to float32 at the end, as Mamba2 and older Hugging Face causal LMs do: a 16-bit
    model with a float32 output, whose comparison must allow for the 16-bit arithmetic before it."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids).float()


class Phi3MLP(nn.Module):
    """Phi-3's MLP: gate and up from one projection, split by `chunk`, which the TorchScript exporter writes as two
    Slices whose ends are computed from `Shape` (ONNX shape inference then knows only their rank)."""

    def __init__(self, mlp: LlamaMLP):
        super().__init__()
        self.gate_up_proj = nn.Linear(mlp.gate_proj.in_features, 2 * mlp.gate_proj.out_features, bias=False)
        self.down_proj = mlp.down_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(nn.functional.silu(gate) * up)


def torch_rmsnorm_llama(config: LlamaConfig) -> LlamaModel:
    """The decoder with torch.nn.RMSNorm in place of every LlamaRMSNorm: at opset 23 the dynamo exporter writes each
    as one RMSNormalization, after a residual Add in all but the first."""
    model = build_llama(config)
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, LlamaRMSNorm):
                setattr(module, name, nn.RMSNorm(child.weight.shape[0], eps=child.variance_epsilon))
    return model


def phi3_style_llama(config: LlamaConfig) -> LlamaModel:
    model = build_llama(config)
    for layer in model.layers:
        layer.mlp = Phi3MLP(layer.mlp)
    return model


RMSNORM_MODULES = (LlamaRMSNorm, nn.RMSNorm, T5LayerNorm, GemmaRMSNorm)
LAYERNORM_MODULES = (nn.LayerNorm, ManualLayerNorm)


def count_modules(module: nn.Module, kinds: tuple[type, ...]) -> int:
    return sum(isinstance(child, kinds) for child in module.modules())


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[], nn.Module]
    input_kind: str = "hidden"  # "hidden": float hidden states [batch, sequence, *trailing]; "tokens": token ids
    trailing: tuple[int, ...] = (HIDDEN,)

    def example_input(self, dtype: torch.dtype, batch: int = 2, sequence: int = 5) -> torch.Tensor:
        generator = torch.Generator().manual_seed(0)
        if self.input_kind == "tokens":
            return torch.randint(1, 16, (batch, sequence), generator=generator)
        return torch.randn((batch, sequence, *self.trailing), generator=generator).to(dtype)


# Two decoder layers: 5 LlamaRMSNorms, of which every one but the first layer's input_layernorm reads a residual add.
DECODER_CONFIG = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4)


def _single(norm: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    return lambda: nn.Sequential(norm())


CASES = {
    case.name: case
    for case in [
        Case("llama_rmsnorm", _single(lambda: LlamaRMSNorm(HIDDEN))),
        Case("torch_rmsnorm", _single(lambda: nn.RMSNorm(HIDDEN, eps=1e-5))),
        Case("torch_rmsnorm_no_affine", _single(lambda: nn.RMSNorm(HIDDEN, eps=1e-5, elementwise_affine=False))),
        Case("torch_rmsnorm_2d", _single(lambda: nn.RMSNorm((4, HIDDEN), eps=1e-5)), trailing=(4, HIDDEN)),
        Case("torch_rmsnorm_2d_no_affine",
             _single(lambda: nn.RMSNorm((4, HIDDEN), eps=1e-5, elementwise_affine=False)), trailing=(4, HIDDEN)),
        Case("t5_norm", _single(lambda: T5LayerNorm(HIDDEN))),
        Case("gemma_norm", _single(lambda: GemmaRMSNorm(HIDDEN))),
        Case("norm_block", NormBlock),
        Case("llama_decoder", lambda: build_llama(DECODER_CONFIG), input_kind="tokens"),
        Case("llama_decoder_float32_logits", lambda: Float32Logits(build_llama(DECODER_CONFIG)), input_kind="tokens"),
        Case("phi3_style_decoder", lambda: phi3_style_llama(DECODER_CONFIG), input_kind="tokens"),
        Case("torch_rmsnorm_decoder", lambda: torch_rmsnorm_llama(DECODER_CONFIG), input_kind="tokens"),
    ]
}

# How each exporter name of the tests exports: (torch exporter, opset; None: its default, EXPORTER_OPSET). The raw
# variants are dynamo's translation without its own optimization (``optimize=False``): reduction axes computed by
# Reshape(Constant, Constant), epsilon and exponents as Constant nodes.
EXPORT_VARIANTS = {
    "torchscript": ("torchscript", None),
    "dynamo": ("dynamo", None),
    "dynamo-opset23": ("dynamo", 23),
    "dynamo-raw": ("dynamo", None),
    "dynamo-raw-opset23": ("dynamo", 23),
}
UNOPTIMIZED = {"dynamo-raw", "dynamo-raw-opset23"}
# Only torch.nn.RMSNorm exports differently at opset 23 (one RMSNormalization): the other modules write their math out.
OPSET23_CASES = {name for name in CASES if name.startswith("torch_rmsnorm")}


def build(case: Case, dtype: torch.dtype) -> nn.Module:
    torch.manual_seed(0)
    module = case.build()
    # nn.RMSNorm's gain starts as ones; make it differ so that a lost scale shows.
    for child in module.modules():
        if isinstance(child, nn.RMSNorm) and child.weight is not None:
            with torch.no_grad():
                child.weight.copy_(1.0 + 0.1 * torch.randn(child.weight.shape))
    return module.to(dtype).eval()


def skip_norms_expected(module: nn.Module) -> int:
    """RMSNorms right after a residual add: in a Llama model every one but the first layer's input_layernorm."""
    if count_modules(module, (LlamaModel,)):
        return count_modules(module, RMSNORM_MODULES) - 1
    return 0
