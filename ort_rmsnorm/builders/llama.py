"""The Llama-style model of the demo, the benchmarks and the tests: its configuration (the demo's among them), and the
model built with ``onnx.helper`` in the spelling of torch's dynamo exporter (``ort_rmsnorm.builders.exporters`` exports
the same model from torch).

Token embedding, decoder layers (Hugging Face's RMSNorm with float32 upcast, causal multi-head attention, SwiGLU
MLP, residual adds), a final norm and an LM head. Each norm is written as the dynamo exporter writes
``LlamaRMSNorm``: ``Pow(x, 2)``, ``ReduceMean``, ``Add(eps)``, ``Sqrt``, ``Reciprocal``, ``Mul(x, .)``, then the
weight; onnxruntime fuses none of these at session start.

With ``kv_cache``, each layer's keys and values of the earlier tokens come in as ``past_key_values.{i}.key/value``
and leave, with the new tokens', as ``present.{i}.key/value`` (``[batch, heads, tokens, head_dim]``, Hugging Face's
names), so that a decode step attends to a cache as an exported decoder's does.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ONNX_TYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}
OPSET = 18


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int = 2048
    hidden_size: int = 512
    intermediate_size: int = 1376
    num_layers: int = 4
    num_heads: int = 8
    rms_norm_eps: float = 1e-6

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def norm_count(self) -> int:
        """RMSNorms in the model: two per decoder layer and the final one."""
        return 2 * self.num_layers + 1

    @property
    def norms_after_residual_add(self) -> int:
        """RMSNorms whose input is a residual add (SkipRMSNorm candidates): all but the first layer's
        ``input_layernorm``, which reads the embeddings."""
        return self.norm_count - 1


# ``ort-rmsnorm demo``'s model: small enough for a decode step of about a millisecond, so that the norms' per-node
# cost shows.
DEMO_CONFIG = LlamaConfig(vocab_size=2048, hidden_size=256, intermediate_size=688, num_layers=8, num_heads=4)


# --- the model without torch --------------------------------------------------------------------------------------


class _GraphBuilder:
    """Collects nodes and initializers; every node is named after the module path it implements."""

    def __init__(self, dtype: str, rng: np.random.Generator):
        self.dtype, self.rng = dtype, rng
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []

    def node(self, op: str, inputs: list[str], name: str, output: str | None = None, **attributes) -> str:
        output = output or name
        self.nodes.append(helper.make_node(op, inputs, [output], name=name, **attributes))
        return output

    def constant(self, name: str, array: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def weight(self, name: str, array: np.ndarray) -> str:
        return self.constant(name, array.astype(self.dtype))

    def linear(self, x: str, name: str, fan_in: int, fan_out: int, output: str | None = None) -> str:
        weight = self.rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)
        return self.node("MatMul", [x, self.weight(f"{name}.weight", weight)], name, output)

    def rms_norm(self, x: str, name: str, config: LlamaConfig) -> str:
        """Hugging Face's LlamaRMSNorm as the dynamo exporter spells it."""
        upcast = self.node("Cast", [x], f"{name}.upcast", to=TensorProto.FLOAT) if self.dtype != "float32" else x
        square = self.node("Pow", [upcast, "two"], f"{name}.pow")
        mean = self.node("ReduceMean", [square, "last_axis"], f"{name}.mean", keepdims=1)
        shifted = self.node("Add", [mean, self.constant(f"{name}.eps", np.float32(config.rms_norm_eps))], f"{name}.add")
        inverse = self.node("Reciprocal", [self.node("Sqrt", [shifted], f"{name}.sqrt")], f"{name}.rsqrt")
        normalized = self.node("Mul", [upcast, inverse], f"{name}.normalize")
        if self.dtype != "float32":
            normalized = self.node("Cast", [normalized], f"{name}.downcast", to=ONNX_TYPES[self.dtype])
        scale = self.weight(f"{name}.weight", 1.0 + 0.1 * self.rng.standard_normal(config.hidden_size))
        return self.node("Mul", [scale, normalized], name)

    def attention(self, x: str, name: str, config: LlamaConfig, cache: tuple[str, str] | None = None) -> str:
        """``cache``: the layer's index and the value of its past keys' and values' prefix (with ``kv_cache``)."""
        hidden = config.hidden_size

        def heads(projection: str) -> str:
            split = self.node("Reshape", [self.linear(x, f"{name}.{projection}", hidden, hidden), "heads_shape"],
                              f"{name}.{projection}.split")
            return self.node("Transpose", [split], f"{name}.{projection}.heads", perm=[0, 2, 1, 3])

        query, key, value = heads("q_proj"), heads("k_proj"), heads("v_proj")
        if cache is not None:
            past, present = cache
            key = self.node("Concat", [f"{past}.key", key], f"{name}.k_cache", f"{present}.key", axis=2)
            value = self.node("Concat", [f"{past}.value", value], f"{name}.v_cache", f"{present}.value", axis=2)
        key_t = self.node("Transpose", [key], f"{name}.k_t", perm=[0, 1, 3, 2])
        scores = self.node("Mul", [self.node("MatMul", [query, key_t], f"{name}.qk"), "attention_scale"],
                           f"{name}.scores")
        masked = self.node("Add", [scores, "causal_mask"], f"{name}.masked")
        probabilities = self.node("Softmax", [masked], f"{name}.softmax", axis=-1)
        attended = self.node("MatMul", [probabilities, value], f"{name}.attended")
        merged = self.node("Reshape", [self.node("Transpose", [attended], f"{name}.merge", perm=[0, 2, 1, 3]),
                                       "hidden_shape"], f"{name}.merged")
        return self.linear(merged, f"{name}.o_proj", hidden, hidden)

    def mlp(self, x: str, name: str, config: LlamaConfig) -> str:
        gate = self.linear(x, f"{name}.gate_proj", config.hidden_size, config.intermediate_size)
        silu = self.node("Mul", [gate, self.node("Sigmoid", [gate], f"{name}.sigmoid")], f"{name}.silu")
        up = self.linear(x, f"{name}.up_proj", config.hidden_size, config.intermediate_size)
        product = self.node("Mul", [silu, up], f"{name}.product")
        return self.linear(product, f"{name}.down_proj", config.intermediate_size, config.hidden_size)

    def causal_mask(self, past_key: str | None = None) -> None:
        """``causal_mask[i, j]``: the dtype's lowest value where key ``j`` comes after query ``i`` (as Hugging Face
        masks), 0 elsewhere. Without a cache it is ``[sequence, sequence]``; after ``past`` cached tokens (the
        length of ``past_key``'s axis 2) it is ``[sequence, past + sequence]``, query ``i`` being token ``past + i``.

        Built from the inputs' shapes so that shape inference sees them."""
        length = self.node("Shape", ["input_ids"], "sequence_length", start=1, end=2)
        keys, diagonal = length, "one"
        if past_key is not None:
            past = self.node("Shape", [past_key], "past_length", start=2, end=3)
            keys = self.node("Add", [past, length], "total_length")
            diagonal = self.node("Add", [self.node("Squeeze", [past], "past_count"), "one"], "mask_diagonal")
        square = self.node("Concat", [length, keys], "mask_shape", axis=0)
        lowest = numpy_helper.from_array(np.array([np.finfo(self.dtype).min], self.dtype))
        filled = self.node("ConstantOfShape", [square], "mask_filled", value=lowest)
        self.node("Trilu", [filled, diagonal], "causal_mask", upper=1)

    def constants(self, config: LlamaConfig) -> None:
        self.constant("two", np.float32(2.0))
        self.constant("last_axis", np.array([-1], np.int64))
        self.constant("one", np.array(1, np.int64))
        self.constant("heads_shape", np.array([0, 0, config.num_heads, config.head_dim], np.int64))
        self.constant("hidden_shape", np.array([0, 0, config.hidden_size], np.int64))
        self.weight("attention_scale", np.array(1.0 / np.sqrt(config.head_dim)))


def build_llama_onnx(config: LlamaConfig, dtype: str = "float32", seed: int = 0, *,
                     kv_cache: bool = False) -> onnx.ModelProto:
    """The demo model built with onnx.helper: ``input_ids [batch, sequence]`` (int64) -> ``logits``; with
    ``kv_cache``, the past keys and values of each layer as inputs and the present ones as outputs too."""
    builder = _GraphBuilder(dtype, np.random.default_rng(seed))
    builder.constants(config)
    cache_names = [(f"past_key_values.{index}", f"present.{index}") for index in range(config.num_layers)]
    builder.causal_mask(f"{cache_names[0][0]}.key" if kv_cache else None)
    embedding = builder.weight("embed_tokens.weight", builder.rng.standard_normal((config.vocab_size,
                                                                                    config.hidden_size)))
    hidden = builder.node("Gather", [embedding, "input_ids"], "embed_tokens")
    for index in range(config.num_layers):
        name = f"layers.{index}"
        attended = builder.attention(builder.rms_norm(hidden, f"{name}.input_layernorm", config),
                                     f"{name}.self_attn", config, cache_names[index] if kv_cache else None)
        hidden = builder.node("Add", [hidden, attended], f"{name}.attention_residual")
        transformed = builder.mlp(builder.rms_norm(hidden, f"{name}.post_attention_layernorm", config),
                                  f"{name}.mlp", config)
        hidden = builder.node("Add", [hidden, transformed], f"{name}.mlp_residual")
    normalized = builder.rms_norm(hidden, "norm", config)
    builder.linear(normalized, "lm_head", config.hidden_size, config.vocab_size, output="logits")
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])]
    outputs = [helper.make_tensor_value_info("logits", ONNX_TYPES[dtype], ["batch", "sequence", config.vocab_size])]
    if kv_cache:
        for past, present in cache_names:
            for part in ("key", "value"):
                inputs.append(helper.make_tensor_value_info(
                    f"{past}.{part}", ONNX_TYPES[dtype], ["batch", config.num_heads, "past", config.head_dim]))
                outputs.append(helper.make_tensor_value_info(
                    f"{present}.{part}", ONNX_TYPES[dtype], ["batch", config.num_heads, "total", config.head_dim]))
    graph = helper.make_graph(builder.nodes, "llama_demo", inputs, outputs, builder.initializers)
    opsets = [helper.make_opsetid("", OPSET)]
    # The oldest IR version the opset allows (not onnx's newest), so that older onnxruntime releases load the model.
    model = helper.make_model(graph, opset_imports=opsets, ir_version=helper.find_min_ir_version_for(opsets),
                              producer_name="ort-rmsnorm demo")
    onnx.checker.check_model(model, full_check=True)
    return model
