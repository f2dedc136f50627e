"""The contenders of the kernel benchmark: one small ONNX model each (our ops, onnxruntime's norm kernels, the
decomposed graph, copies of the same bytes), the bytes each must move, and chains of a model's nodes in series."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper

from ..contract import (
    MS_DOMAIN,
    ONNX_RMSNORM,
    OP_DOMAIN,
    OP_VERSION,
    ORT_SIMPLIFIED_LAYER_NORM,
    ORT_SKIP_SIMPLIFIED_LAYER_NORM,
    RMSNORM,
    SKIP_RMSNORM,
)
from ..runtime import BFLOAT16


DTYPES = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16), "bfloat16": BFLOAT16}
ONNX_TYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}

EPSILON = 1e-5


@dataclass(frozen=True)
class Shape:
    dtype: str
    rows: int
    hidden: int

    @property
    def onnx_type(self) -> int:
        return ONNX_TYPES[self.dtype]

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype].itemsize

    @property
    def tensor_bytes(self) -> int:
        return self.rows * self.hidden * self.itemsize


def _tensor(name: str, shape: Shape, rows: int | None = None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, shape.onnx_type, [rows or shape.rows, shape.hidden])


def scale_values(hidden: int) -> np.ndarray:
    """The learned gain: deterministic, away from 1 so that a dropped scale fails the check."""
    return (0.5 + (np.arange(hidden) % 7) / 7.0).astype(np.float64)


def _initializer(name: str, values: np.ndarray, dtype: str) -> onnx.TensorProto:
    typed = np.asarray(values).astype(DTYPES[dtype])
    raw = typed.view(np.uint16) if typed.dtype == BFLOAT16 else typed
    return helper.make_tensor(name, ONNX_TYPES[dtype], typed.shape, raw.tobytes(), raw=True)


DEFAULT_OPSETS = (("", 18),)
OURS_OPSETS = (("", 18), (OP_DOMAIN, OP_VERSION))


def _model(nodes, inputs, outputs, initializers=(), opsets=DEFAULT_OPSETS) -> onnx.ModelProto:
    graph = helper.make_graph(list(nodes), "bench", list(inputs), list(outputs), initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets], ir_version=10)


def _norm_model(nodes, shape: Shape, initializers, opsets=DEFAULT_OPSETS) -> onnx.ModelProto:
    """x -> y."""
    return _model(nodes, [_tensor("x", shape)], [_tensor("y", shape)], initializers, opsets)


def _skip_model(nodes, shape: Shape, initializers, opsets=DEFAULT_OPSETS) -> onnx.ModelProto:
    """x, skip -> y, sum."""
    return _model(nodes, [_tensor("x", shape), _tensor("skip", shape)], [_tensor("y", shape), _tensor("sum", shape)],
                  initializers, opsets)


def _scale(shape: Shape) -> onnx.TensorProto:
    return _initializer("scale", scale_values(shape.hidden), shape.dtype)


def copy_by_cast(shape: Shape, rows: int) -> onnx.ModelProto:
    """A Cast to the same type: onnxruntime's kernel memcpy's into the output (one thread)."""
    node = helper.make_node("Cast", ["x"], ["y"], to=shape.onnx_type)
    return _model([node], [_tensor("x", shape, rows)], [_tensor("y", shape, rows)])


def copy_by_gather(shape: Shape, rows: int) -> onnx.ModelProto:
    """Gather of every row in order: onnxruntime copies the rows on its intra-op thread pool."""
    indices = helper.make_tensor("rows", TensorProto.INT64, [rows], np.arange(rows, dtype=np.int64).tobytes(), True)
    node = helper.make_node("Gather", ["x", "rows"], ["y"], axis=0)
    return _model([node], [_tensor("x", shape, rows)], [_tensor("y", shape, rows)], [indices])


def ours_rmsnorm(shape: Shape) -> onnx.ModelProto:
    node = helper.make_node(RMSNORM, ["x", "scale"], ["y"], domain=OP_DOMAIN, epsilon=EPSILON)
    return _norm_model([node], shape, [_scale(shape)], OURS_OPSETS)


def ours_skip_rmsnorm(shape: Shape) -> onnx.ModelProto:
    node = helper.make_node(SKIP_RMSNORM, ["x", "skip", "scale"], ["y", "sum"], domain=OP_DOMAIN, epsilon=EPSILON)
    return _skip_model([node], shape, [_scale(shape)], OURS_OPSETS)


def add_then_ours_rmsnorm(shape: Shape) -> onnx.ModelProto:
    """The residual add unfused: onnxruntime's Add, then our RMSNorm."""
    nodes = [helper.make_node("Add", ["x", "skip"], ["sum"]),
             helper.make_node(RMSNORM, ["sum", "scale"], ["y"], domain=OP_DOMAIN, epsilon=EPSILON)]
    return _skip_model(nodes, shape, [_scale(shape)], OURS_OPSETS)


def ort_simplified_layer_norm(shape: Shape) -> onnx.ModelProto:
    node = helper.make_node(ORT_SIMPLIFIED_LAYER_NORM, ["x", "scale"], ["y"], axis=-1, epsilon=EPSILON,
                            stash_type=1)
    return _norm_model([node], shape, [_scale(shape)])


def onnx_rms_normalization(shape: Shape) -> onnx.ModelProto:
    node = helper.make_node(ONNX_RMSNORM, ["x", "scale"], ["y"], axis=-1, epsilon=EPSILON, stash_type=1)
    return _norm_model([node], shape, [_scale(shape)], [("", 23)])


def ort_skip_simplified_layer_norm(shape: Shape) -> onnx.ModelProto:
    node = helper.make_node(ORT_SKIP_SIMPLIFIED_LAYER_NORM, ["x", "skip", "scale"], ["y", "", "", "sum"],
                            domain=MS_DOMAIN, epsilon=EPSILON)
    return _skip_model([node], shape, [_scale(shape)], [("", 18), (MS_DOMAIN, 1)])


def _decomposed_nodes(source: str, shape: Shape) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """RMSNorm as torch exports the Hugging Face Llama norm: in float32, cast back, then times the weight."""
    wide = source
    nodes = []
    if shape.dtype != "float32":
        nodes.append(helper.make_node("Cast", [source], ["wide"], to=TensorProto.FLOAT))
        wide = "wide"
    nodes += [
        helper.make_node("Pow", [wide, "two"], ["squares"]),
        helper.make_node("ReduceMean", ["squares", "last_axis"], ["mean_square"], keepdims=1),
        helper.make_node("Add", ["mean_square", "eps"], ["shifted"]),
        helper.make_node("Sqrt", ["shifted"], ["rms"]),
        helper.make_node("Reciprocal", ["rms"], ["inverse_rms"]),
        helper.make_node("Mul", [wide, "inverse_rms"], ["normalized_wide"]),
    ]
    normalized = "normalized_wide"
    if shape.dtype != "float32":
        nodes.append(helper.make_node("Cast", ["normalized_wide"], ["normalized"], to=shape.onnx_type))
        normalized = "normalized"
    nodes.append(helper.make_node("Mul", ["scale", normalized], ["y"]))
    constants = [
        helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
        helper.make_tensor("last_axis", TensorProto.INT64, [1], [-1]),
        helper.make_tensor("eps", TensorProto.FLOAT, [], [EPSILON]),
        _scale(shape),
    ]
    return nodes, constants


def decomposed_rmsnorm(shape: Shape) -> onnx.ModelProto:
    nodes, constants = _decomposed_nodes("x", shape)
    return _norm_model(nodes, shape, constants)


def decomposed_skip_rmsnorm(shape: Shape) -> onnx.ModelProto:
    nodes, constants = _decomposed_nodes("sum", shape)
    return _skip_model([helper.make_node("Add", ["x", "skip"], ["sum"]), *nodes], shape, constants)


@dataclass(frozen=True)
class Contender:
    name: str
    family: str  # "norm": X -> Y, "skip": X, skip -> Y, sum, "copy": X -> Y, "copy2": X and skip -> Y and sum
    build: Callable[[Shape], onnx.ModelProto]
    optimized: bool = True  # ORT_ENABLE_ALL; False: ORT_DISABLE_ALL

    @property
    def reference(self) -> str | None:
        """The onnxruntime contender this one is compared with (speed-up column)."""
        return {"rmsnorm": "ort_simplified", "skip_rmsnorm": "ort_skip_simplified"}.get(self.name)


CONTENDERS = (
    # The copies run with optimizations off: the optimizer would remove a same-type Cast.
    Contender("copy_cast", "copy", lambda s: copy_by_cast(s, s.rows), optimized=False),
    Contender("copy_gather", "copy", lambda s: copy_by_gather(s, s.rows), optimized=False),
    Contender("copy2_cast", "copy2", lambda s: copy_by_cast(s, 2 * s.rows), optimized=False),
    Contender("copy2_gather", "copy2", lambda s: copy_by_gather(s, 2 * s.rows), optimized=False),
    Contender("rmsnorm", "norm", ours_rmsnorm),
    Contender("ort_simplified", "norm", ort_simplified_layer_norm),
    Contender("onnx_rmsnorm23", "norm", onnx_rms_normalization),
    Contender("decomposed", "norm", decomposed_rmsnorm, optimized=False),
    Contender("skip_rmsnorm", "skip", ours_skip_rmsnorm),
    Contender("add_rmsnorm", "skip", add_then_ours_rmsnorm),
    Contender("ort_skip_simplified", "skip", ort_skip_simplified_layer_norm),
    Contender("decomposed_skip", "skip", decomposed_skip_rmsnorm, optimized=False),
)
CONTENDER_NAMES = tuple(c.name for c in CONTENDERS)
ROOFLINE_OF = {"norm": "copy", "skip": "copy2", "copy": "copy", "copy2": "copy2"}


def moved_bytes(family: str, shape: Shape) -> int:
    tensors = {"norm": 2, "copy": 2, "skip": 4, "copy2": 4}[family]
    scale = shape.hidden * shape.itemsize if family in ("norm", "skip") else 0
    return tensors * shape.tensor_bytes + scale


def chained(model: onnx.ModelProto, length: int) -> onnx.ModelProto:
    """`length` copies of the model's nodes in series: stage i+1 reads stage i's y as x (and its sum as skip); the
    last stage writes the graph outputs. Each stage has its own copy of the initializers, as each norm of a model
    has its own weight (a shared one would stay in L1 and flatter the kernels that read it)."""
    graph = model.graph
    constants = {initializer.name for initializer in graph.initializer}
    feeds = {"x": "y", "skip": "sum"}

    def rename(name: str, stage: int) -> str:
        if not name:
            return name
        if name in feeds and name not in constants:
            return name if stage == 0 else rename(feeds[name], stage - 1)
        if name in feeds.values() and stage == length - 1:
            return name
        return f"stage{stage}/{name}"

    result = onnx.ModelProto()
    result.CopyFrom(model)
    del result.graph.node[:]
    del result.graph.initializer[:]
    for stage in range(length):
        for index, node in enumerate(graph.node):
            copy = result.graph.node.add()
            copy.CopyFrom(node)
            copy.name = f"stage{stage}/{index}"
            copy.input[:] = [rename(name, stage) for name in node.input]
            copy.output[:] = [rename(name, stage) for name in node.output]
        for initializer in graph.initializer:
            copy = result.graph.initializer.add()
            copy.CopyFrom(initializer)
            copy.name = rename(initializer.name, stage)
    return result
