"""Llamas of SmolLM-135M's proportions at any hidden size, and the Hugging Face transformers ``LlamaForCausalLM`` of
such a shape with random weights (nothing is downloaded): the models of ``ort-rmsnorm bench --e2e int4`` and of
``benchmarks/targets_e2e.py``.

Importing this module imports neither torch nor transformers; :func:`build_model` imports both.
"""

from __future__ import annotations

import dataclasses

NORM_EPSILON = 1e-5  # SmolLM's rms_norm_eps


@dataclasses.dataclass(frozen=True)
class ModelShape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def describe(self) -> str:
        return (f"hidden {self.hidden}, {self.layers} layers, {self.heads} heads ({self.kv_heads} key/value), "
                f"MLP {self.intermediate}, vocabulary {self.vocab}")


def model_shape(hidden: int, layers: int, vocab: int) -> ModelShape:
    """SmolLM-135M's proportions at another hidden size: heads of 64 (fewer where 64 does not divide the hidden
    size), key/value heads the largest divisor of the heads that is at most a third of them (9 and 3 at 576), the
    MLP 8/3 of the hidden size rounded to a multiple of 64 (1536 at 576)."""
    heads = max(1, hidden // 64)
    while hidden % heads:
        heads -= 1
    kv_heads = max([d for d in range(1, heads + 1) if heads % d == 0 and 3 * d <= heads] or [1])
    intermediate = max(64, round(hidden * 8 / 3 / 64) * 64)
    return ModelShape(hidden, layers, heads, kv_heads, intermediate, vocab)


def build_model(shape: ModelShape, seed: int = 0):
    """The transformers LlamaForCausalLM of `shape`, random weights, float32, eval mode."""
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    config = transformers.LlamaConfig(
        hidden_size=shape.hidden, intermediate_size=shape.intermediate, num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads, vocab_size=shape.vocab,
        max_position_embeddings=2048, rms_norm_eps=NORM_EPSILON, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():  # norm weights away from their ones, so that a lost scale shows in the logits
        for module in model.modules():
            if "RMSNorm" in type(module).__name__:
                module.weight.add_(0.1 * torch.randn_like(module.weight))
    return model.eval()
