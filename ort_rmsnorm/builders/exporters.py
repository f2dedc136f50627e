"""A small Llama-style model in torch and the two torch ONNX exporters, for the demo, the benchmarks and the export
tests; and a Hugging Face transformers Llama exported with its KV cache as graph inputs and outputs.

The modules follow Hugging Face's Llama: ``LlamaRMSNorm`` upcasts to float32, normalizes, casts back and then
multiplies by the weight; each decoder layer is pre-norm with residual adds before ``post_attention_layernorm`` and
before the next layer's ``input_layernorm``. Importing this module imports torch (transformers only when a
transformers model is exported).
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import os
import warnings
from typing import Mapping, Sequence

import torch
from torch import nn

from .._logs import quieted
from .llama import LlamaConfig

EXPORTERS = ("torchscript", "dynamo")
# The opset each exporter is used at: TorchScript's last well-supported opset, and the dynamo exporter's default.
EXPORTER_OPSET = {"torchscript": 17, "dynamo": 18}
TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class LlamaRMSNorm(nn.Module):
    """Hugging Face's LlamaRMSNorm: statistic in float32, cast back to the input dtype, then the weight."""

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        # Not all ones, so that a lost scale shows in the outputs.
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class LlamaAttention(nn.Module):
    """Causal multi-head self-attention (no rotary embedding: it does not touch the norms)."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.num_heads, self.head_dim = config.num_heads, config.head_dim
        hidden = config.hidden_size
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(hidden, hidden, bias=False) for _ in range(4))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        batch, sequence, hidden = hidden_states.shape

        def heads(projection: nn.Linear) -> torch.Tensor:
            return projection(hidden_states).view(batch, sequence, self.num_heads, self.head_dim).transpose(1, 2)

        attended = nn.functional.scaled_dot_product_attention(
            heads(self.q_proj), heads(self.k_proj), heads(self.v_proj), is_causal=True
        )
        return self.o_proj(attended.transpose(1, 2).reshape(batch, sequence, hidden))


class LlamaMLP(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(hidden_states)) * self.up_proj(hidden_states))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        hidden_states = hidden_states + self.self_attn(self.input_layernorm(hidden_states))
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class LlamaModel(nn.Module):
    """Token ids -> logits: embedding, decoder layers, final norm, LM head."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config) for _ in range(config.num_layers))
        self.norm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden_states = self.embed_tokens(input_ids)
        for layer in self.layers:
            hidden_states = layer(hidden_states)
        return self.lm_head(self.norm(hidden_states))


def build_llama(config: LlamaConfig, dtype: str = "float32", seed: int = 0) -> LlamaModel:
    torch.manual_seed(seed)
    model = LlamaModel(config)
    for linear in model.modules():
        if isinstance(linear, nn.Linear):  # keep activations O(1) through the layers
            nn.init.normal_(linear.weight, std=1.0 / math.sqrt(linear.in_features))
    return model.to(TORCH_DTYPES[dtype]).eval()


def _quiet_exporter():
    """The dynamo exporter logs warnings about unrelated optional packages (torchvision) on each export."""
    return quieted("torch.onnx", logging.ERROR)


def export(
    module: nn.Module,
    example_inputs: Sequence[torch.Tensor],
    path: str | os.PathLike,
    *,
    exporter: str,
    input_names: Sequence[str],
    output_names: Sequence[str],
    dynamic_dims: Mapping[str, Mapping[int, str]],
    opset: int | None = None,
    optimize: bool = True,
) -> None:
    """Exports ``module`` to ``path`` with one of the torch exporters at ``opset`` (default: the exporter's,
    :data:`EXPORTER_OPSET`; from 23 the dynamo exporter writes ``torch.nn.RMSNorm`` as one ``RMSNormalization``).
    ``optimize=False``: the dynamo exporter's raw translation, without its constant folding and clean-up.

    ``dynamic_dims`` maps input and output names to ``{axis: dim name}``; the same name means the same dim
    everywhere. (The dynamo exporter derives the outputs' dims itself and reads only the inputs'.)
    The exporters' progress messages and deprecation warnings are silenced.
    """
    if exporter == "torchscript":
        dynamic = {"dynamo": False, "dynamic_axes": {name: dict(axes) for name, axes in dynamic_dims.items()}}
    elif exporter == "dynamo":
        # torch.export names the dims itself; matching them to ours is by input position and axis.
        dims = {name: torch.export.Dim(name) for axes in dynamic_dims.values() for name in axes.values()}
        dynamic = {
            "dynamo": True,
            "verbose": False,
            "optimize": optimize,
            "dynamic_shapes": tuple(
                {axis: dims[name] for axis, name in dynamic_dims.get(input_name, {}).items()}
                for input_name in input_names
            ),
        }
    else:
        raise ValueError(f"unknown exporter {exporter!r}; expected one of {EXPORTERS}")
    module = module.eval()
    with torch.no_grad(), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), _quiet_exporter():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            tuple(example_inputs),
            str(path),
            opset_version=opset or EXPORTER_OPSET[exporter],
            input_names=list(input_names),
            output_names=list(output_names),
            **dynamic,
        )


def export_llama(
    config: LlamaConfig, path: str | os.PathLike, *, exporter: str = "dynamo", dtype: str = "float32", seed: int = 0
) -> LlamaModel:
    """Builds the Llama-style model and exports it with input ``input_ids [batch, sequence]``, output ``logits``."""
    model = build_llama(config, dtype, seed)
    example = torch.randint(0, config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(seed))
    export(
        model,
        (example,),
        path,
        exporter=exporter,
        input_names=["input_ids"],
        output_names=["logits"],
        dynamic_dims={"input_ids": {0: "batch", 1: "sequence"}, "logits": {0: "batch", 1: "sequence"}},
    )
    return model


class _CachedCausalLM(nn.Module):
    """A transformers causal LM with its KV cache as tensors: ``(input_ids, attention_mask, past keys, past values)
    -> (logits, present keys, present values)``, one key and one value tensor ``[batch, kv_heads, tokens,
    head_dim]`` per layer, as onnxruntime-genai's model folders name and shape them."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, past_keys, past_values):
        from transformers.cache_utils import DynamicCache

        cache = DynamicCache(ddp_cache_data=list(zip(past_keys, past_values)))
        output = self.model(input_ids=input_ids, attention_mask=attention_mask, cache=cache, use_cache=True)
        layers = output.past_key_values.layers
        return output.logits, [layer.keys for layer in layers], [layer.values for layer in layers]


def kv_cache_names(layers: int) -> tuple[list[str], list[str]]:
    """(past input names, present output names), keys of every layer first, then values."""
    past = [f"past_key_values.{i}.{kind}" for kind in ("key", "value") for i in range(layers)]
    return past, [name.replace("past_key_values", "present") for name in past]


def export_cached_causal_lm(model: nn.Module, path: str | os.PathLike, *, opset: int | None = None) -> None:
    """Exports a transformers causal LM (a ``LlamaForCausalLM``, say) with torch's dynamo exporter at ``opset``
    (default :data:`EXPORTER_OPSET`'s), batch 1: inputs ``input_ids [1, sequence]``, ``attention_mask [1, total]``
    (total = past + sequence) and the past keys and values ``[1, kv_heads, past, head_dim]`` of each layer
    (:func:`kv_cache_names`); outputs ``logits [1, sequence, vocab]`` and the present keys and values. A prefill
    feeds a cache of 0 tokens. Weights go to external data next to ``path``."""
    config = model.config
    layers, kv_heads = config.num_hidden_layers, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    past_tokens, tokens = 3, 2  # example sizes, neither 0 nor 1 (torch.export specializes those)
    generator = torch.Generator().manual_seed(0)
    dtype = next(model.parameters()).dtype
    past = [[torch.randn(1, kv_heads, past_tokens, head_dim, generator=generator, dtype=dtype) for _ in range(layers)]
            for _ in ("key", "value")]
    example = (torch.randint(0, config.vocab_size, (1, tokens), generator=generator),
               torch.ones(1, past_tokens + tokens, dtype=torch.int64), *past)
    sequence, total, cached = (torch.export.Dim(name) for name in ("sequence", "total", "past"))
    dynamic_shapes = ({1: sequence}, {1: total}, [{2: cached}] * layers, [{2: cached}] * layers)
    past_names, present_names = kv_cache_names(layers)
    with torch.no_grad(), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), _quiet_exporter():
        warnings.simplefilter("ignore")
        torch.onnx.export(_CachedCausalLM(model.eval()), example, str(path), dynamo=True, verbose=False,
                          opset_version=opset or EXPORTER_OPSET["dynamo"], dynamic_shapes=dynamic_shapes,
                          input_names=["input_ids", "attention_mask", *past_names],
                          output_names=["logits", *present_names], external_data=True)
