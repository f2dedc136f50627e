"""Decomposed RMSNorm graphs in every spelling the pass must recognize (and the near misses it must not fuse),
built with onnx.helper, plus the checks every fusion test makes.

A :class:`Spelling` says how each step is written; :func:`norm_model` builds a model ``x -> y`` (plus an unrelated
``Shape(x)`` output that must survive untouched) and returns what the fused node must look like.
"""

from __future__ import annotations

import dataclasses
import itertools

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from ort_rmsnorm.runtime import make_session, run
from op_models import make_model, tensor_array, tensor_proto
from reference import assert_matches_reference, random_array, rmsnorm

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": BFLOAT16,
    "float64": np.dtype(np.float64),
}
ONNX_TYPES = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float16): TensorProto.FLOAT16,
    BFLOAT16: TensorProto.BFLOAT16,
    np.dtype(np.float64): TensorProto.DOUBLE,
}
DECOMPOSED_OPS = {"Pow", "ReduceMean", "ReduceSum", "ReduceSumSquare", "Sqrt", "Reciprocal", "Div"}


class GraphBuilder:
    """Nodes and initializers of a test graph, with unique generated names."""

    def __init__(self, opset: int, prefix: str = "", constants: str = "initializer") -> None:
        self.opset = opset
        self.constants = constants  # subgraphs and functions: "constant" (Constant nodes)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._names = itertools.count()
        self._prefix = prefix

    def name(self, base: str) -> str:
        return f"{self._prefix}{base}_{next(self._names)}"

    def constant(self, array, kind: str | None = None) -> str:
        """A constant as an initializer or a Constant node."""
        array = np.asarray(array)
        name = self.name("c")
        tensor = tensor_proto(name, array)
        if (kind or self.constants) == "initializer":
            self.initializers.append(tensor)
        else:
            self.nodes.append(helper.make_node("Constant", [], [name], value=tensor, name=self.name("Constant")))
        return name

    def op(self, op_type: str, *inputs: str, **attributes) -> str:
        output = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [output], name=self.name(op_type), **attributes))
        return output


@dataclasses.dataclass(frozen=True)
class Spelling:
    """How each step of ``y = x / rms(x) * scale`` is written."""

    square: str = "pow"  # pow | pow_int | pow_1elem | mul
    mean: str = "mean"  # mean | sum_div | sum_mul | sumsq_div | sumsq_mul | global_average_pool (axes: [2, rank))
    axes: tuple = (-1,)
    keepdims: str = "default"  # default | explicit | zero
    eps: str = "add"  # add | add_swapped | constant_node | castlike | castlike_x | outside | none | input
    inverse: str = "reciprocal"  # div | reciprocal | reciprocal_swapped | div_one | pow_half
    upcast: bool = False  # Cast x to float32 before the square (the Hugging Face pattern; a no-op for float32 x)
    separate_casts: bool = False  # with upcast: one Cast for the square, another for the division (TorchScript T5)
    cast_back: bool = True  # with upcast: Cast the normalized value back to x's type before the scale
    scale: str = "mul"  # none | mul | mul_swapped | one_plus | one_plus_runtime | cast | cast_after | input
    # The scale multiplied into the inverse first, x * (inverse * scale) (TensorFlow's graph optimizer): none |
    # inverse_first (inverse * scale) | scale_first (scale * inverse); with x_last, (...) * x. factor_cast: with
    # upcast, the float32 factor cast to x's type multiplies x itself (no cast after).
    factor: str = "none"
    x_last: bool = False
    factor_cast: bool = False
    scale_shape: tuple | None = None  # default: the normalized dims
    scale_dtype: str | None = None  # default: the type the scale Mul works in
    epsilon: float = 1e-2
    exponent: float = 2.0
    divisor: float | None = None  # ReduceSum spellings: default the number of reduced elements
    numerator: float = 1.0  # Div(numerator, rms)
    inverse_exponent: float = -0.5  # Pow(ms + eps, inverse_exponent)
    dtype: str = "float32"
    opset: int = 18
    shape: tuple | None = ("B", "S", 8)  # symbolic batch and sequence, static hidden size; None: rank unknown
    run_shape: tuple = (2, 3, 8)

    @property
    def np_dtype(self) -> np.dtype:
        return DTYPES[self.dtype]

    @property
    def normalized(self) -> int:
        rank = len(self.run_shape)
        return len({axis % rank for axis in self.axes})


@dataclasses.dataclass
class NormCase:
    """A built model and what its fusion must produce."""

    model: onnx.ModelProto
    spelling: Spelling
    scale: np.ndarray | None  # the scale values the fused op must apply (float64 reference uses them)
    feeds: dict


def _axes_operand(g: GraphBuilder, op_type: str, axes) -> tuple[list[str], dict]:
    """Axes as attribute (ReduceMean/ReduceSumSquare before 18, ReduceSum before 13) or constant input."""
    input_since = {"ReduceMean": 18, "ReduceSumSquare": 18, "ReduceSum": 13}[op_type]
    if g.opset >= input_since:
        return [g.constant(np.array(axes, np.int64))], {}
    return [], {"axes": list(axes)}


def _reduce(g: GraphBuilder, op_type: str, value: str, s: Spelling) -> str:
    extra, attributes = _axes_operand(g, op_type, s.axes)
    if s.keepdims == "explicit":
        attributes["keepdims"] = 1
    elif s.keepdims == "zero":
        attributes["keepdims"] = 0
    return g.op(op_type, value, *extra, **attributes)


def add_norm(
    g: GraphBuilder, x: str, s: Spelling, compute: np.dtype, x_num: str | None = None, scale: str | None = None
) -> tuple[str, list[str]]:
    """Appends a decomposed norm of ``x`` (already in the compute type) to ``g``; returns (output, extra graph inputs).
    ``x_num``: the value divided by the rms when the graph spells it separately (default ``x``). ``scale``: with
    ``s.factor``, the scale that multiplies the inverse before x does."""
    extra_inputs: list[str] = []
    x_num = x_num or x

    def square() -> str:
        if s.square == "mul":
            return g.op("Mul", x, x)
        exponent = {
            "pow": np.array(s.exponent, compute),
            "pow_int": np.array(int(s.exponent), np.int64),
            "pow_1elem": np.array([s.exponent], compute),
        }[s.square]
        return g.op("Pow", x, g.constant(exponent, "constant"))

    count = s.divisor if s.divisor is not None else int(np.prod([s.run_shape[axis] for axis in s.axes]))
    if s.mean == "mean":
        mean_square = _reduce(g, "ReduceMean", square(), s)
    elif s.mean == "global_average_pool":
        mean_square = g.op("GlobalAveragePool", square())
    else:
        total = (
            _reduce(g, "ReduceSumSquare", x, s) if s.mean.startswith("sumsq") else _reduce(g, "ReduceSum", square(), s)
        )
        if s.mean.endswith("div"):
            mean_square = g.op("Div", total, g.constant(np.array(count, compute)))
        else:
            mean_square = g.op("Mul", g.constant(np.array(1.0 / count, compute)), total)
    eps = None
    if s.eps == "input":
        eps = "eps_input"
        extra_inputs.append(eps)
    elif s.eps == "castlike":
        eps = g.op("CastLike", g.constant(np.array(s.epsilon, np.float64)), mean_square)
    elif s.eps == "castlike_x":  # flax's nnx.RMSNorm through jax2onnx
        eps = g.op("CastLike", g.constant(np.array(s.epsilon, np.float64)), x)
    elif s.eps != "none":
        eps = g.constant(np.array(s.epsilon, compute), "constant" if s.eps == "constant_node" else None)
    if s.eps == "outside":
        with_eps = None
        rms = g.op("Add", g.op("Sqrt", mean_square), eps)
    else:
        with_eps = (
            mean_square
            if eps is None
            else (g.op("Add", eps, mean_square) if s.eps == "add_swapped" else g.op("Add", mean_square, eps))
        )
        rms = None if s.inverse == "pow_half" else g.op("Sqrt", with_eps)
    if s.inverse == "div":
        return g.op("Div", x_num, rms), extra_inputs
    if s.inverse == "pow_half":
        inverse = g.op("Pow", with_eps, g.constant(np.array(s.inverse_exponent, compute)))
    elif s.inverse == "div_one":
        inverse = g.op("Div", g.constant(np.array(s.numerator, compute), "constant"), rms)
    else:
        inverse = g.op("Reciprocal", rms)
    if s.factor != "none":
        factor = g.op("Mul", inverse, scale) if s.factor == "inverse_first" else g.op("Mul", scale, inverse)
        if s.factor_cast:
            factor = g.op("CastLike", factor, x_num)
        return (g.op("Mul", factor, x_num) if s.x_last else g.op("Mul", x_num, factor)), extra_inputs
    if s.inverse == "reciprocal_swapped":
        return g.op("Mul", inverse, x_num), extra_inputs
    return g.op("Mul", x_num, inverse), extra_inputs


def norm_model(s: Spelling, seed: int = 0) -> NormCase:
    rng = np.random.default_rng(seed)
    dtype = s.np_dtype
    g = GraphBuilder(s.opset)
    compute = np.dtype(np.float32) if s.upcast else dtype
    x = g.op("Cast", "x", to=TensorProto.FLOAT) if s.upcast else "x"
    shape = list(s.shape) if s.shape is not None else None
    graph_inputs = [helper.make_tensor_value_info("x", ONNX_TYPES[dtype], shape)]
    feeds = {"x": random_array(rng, s.run_shape, dtype)}
    normalized_dims = tuple(s.run_shape[-s.normalized :])
    scale_shape = s.scale_shape if s.scale_shape is not None else normalized_dims
    weights = (rng.random(scale_shape) + 0.5).astype(np.float32)

    def make_scale(scale_type: np.dtype) -> tuple[str, np.ndarray]:
        """The scale's value in the graph, and the values it applies."""
        if s.scale in ("one_plus", "one_plus_runtime"):
            w = weights.astype(scale_type) - np.ones((), scale_type)  # 1 + w is then the weights again (rounded)
            if s.scale == "one_plus":
                w_name = g.constant(w)
            else:
                w_name = "w_input"
                graph_inputs.append(helper.make_tensor_value_info(w_name, ONNX_TYPES[scale_type], list(scale_shape)))
                feeds[w_name] = w
            return g.op("Add", g.constant(np.array(1.0, scale_type)), w_name), (w + np.ones((), scale_type)).astype(
                scale_type
            )
        if s.scale == "cast":
            stored = weights.astype(np.float16 if scale_type != np.float16 else np.float32)
            return g.op("Cast", g.constant(stored), to=ONNX_TYPES[scale_type]), stored.astype(scale_type)
        applied = weights.astype(scale_type)
        if s.scale == "input":  # a scale fed at run time (tf2onnx makes a captured constant a graph input)
            graph_inputs.append(helper.make_tensor_value_info("w_input", ONNX_TYPES[scale_type], list(scale_shape)))
            feeds["w_input"] = applied
            return "w_input", applied
        return g.constant(applied), applied

    x_num = g.op("Cast", "x", to=TensorProto.FLOAT) if s.separate_casts else ("x" if s.factor_cast else None)
    out_dtype = dtype if (not s.upcast or s.cast_back or s.factor_cast) else compute
    applied = None
    if s.factor != "none":  # x * (inverse * scale): the scale is multiplied in first, the cast back comes last
        scale, applied = make_scale(DTYPES[s.scale_dtype] if s.scale_dtype else compute)
        y, extra = add_norm(g, x, s, compute, x_num, scale)
        if s.upcast and s.cast_back and not s.factor_cast:
            y = g.op("Cast", y, to=ONNX_TYPES[dtype])
    else:
        y, extra = add_norm(g, x, s, compute, x_num)
        if s.upcast and s.cast_back and s.scale != "cast_after":
            y = g.op("Cast", y, to=ONNX_TYPES[dtype])
        scale_type = DTYPES[s.scale_dtype] if s.scale_dtype else (compute if s.scale == "cast_after" else out_dtype)
        if s.scale != "none":
            scale, applied = make_scale(scale_type)
            y = g.op("Mul", scale, y) if s.scale == "mul_swapped" else g.op("Mul", y, scale)
            if s.scale == "cast_after":
                y = g.op("Cast", y, to=ONNX_TYPES[dtype])
    for name in extra:
        graph_inputs.append(helper.make_tensor_value_info(name, ONNX_TYPES[compute], []))
        feeds[name] = np.array(s.epsilon, compute)
    y_shape = shape
    enlarged = np.broadcast_shapes(tuple(s.run_shape), tuple(scale_shape)) if s.scale != "none" else s.run_shape
    if shape is not None and tuple(enlarged) != tuple(s.run_shape):  # a scale that broadcasts X up (a near miss)
        y_shape = list(enlarged) if all(isinstance(dim, int) for dim in shape) else None
    g.nodes.append(helper.make_node("Identity", [y], ["y"], name="to_output"))
    g.nodes.append(helper.make_node("Shape", ["x"], ["unrelated"], name="unrelated_shape"))
    graph = helper.make_graph(
        g.nodes,
        "norm",
        graph_inputs,
        [
            helper.make_tensor_value_info("y", ONNX_TYPES[out_dtype], y_shape),
            helper.make_tensor_value_info("unrelated", TensorProto.INT64, [len(s.run_shape)]),
        ],
        g.initializers,
    )
    model = make_model(graph, [helper.make_opsetid("", s.opset)])
    return NormCase(model, s, applied, feeds)


# ---- checks ------------------------------------------------------------------------------------------------------


def fused_nodes(model: onnx.ModelProto, op_type: str) -> list[onnx.NodeProto]:
    return [node for node in model.graph.node if node.op_type == op_type]


def attribute(node: onnx.NodeProto, name: str, default=None):
    for attr in node.attribute:
        if attr.name == name:
            return helper.get_attribute_value(attr)
    return default


def scale_array(model: onnx.ModelProto, name: str) -> np.ndarray:
    """The value of a constant input of the fused node (initializer or Constant node)."""
    for tensor in model.graph.initializer:
        if tensor.name == name:
            return tensor_array(tensor)
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output[0] == name:
            return tensor_array(node.attribute[0].t)
    raise AssertionError(f"scale {name} is not a constant of the fused model")


def check_model(model: onnx.ModelProto, ort_default_ops: bool = False) -> None:
    """onnx.checker with full shape inference. onnxruntime registers SimplifiedLayerNormalization in the default domain,
    where ONNX does not know it: for those models, the check runs on a copy with those nodes in a private domain."""
    if ort_default_ops:
        model = _with_private_domain(model, {"SimplifiedLayerNormalization"})
    onnx.checker.check_model(model, full_check=True)


def _with_private_domain(model: onnx.ModelProto, op_types: set[str]) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    pending = [copy.graph] + [function for function in copy.functions]
    while pending:  # the main graph, functions, and the If/Loop/Scan bodies in them
        graph = pending.pop()
        for node in graph.node:
            if node.op_type in op_types and node.domain == "":
                node.domain = "ort.default"
            pending += [attr.g for attr in node.attribute if attr.type == onnx.AttributeProto.GRAPH]
    copy.opset_import.append(helper.make_opsetid("ort.default", 1))
    for function in copy.functions:
        function.opset_import.append(helper.make_opsetid("ort.default", 1))
    return copy


def run_unfused(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    """The original model in onnxruntime with every graph optimization off (its own fusions would change it)."""
    session = make_session(model, custom_ops=False, optimization=ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    return run(session, feeds)


def run_fused(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    return run(make_session(model, optimization=ort.GraphOptimizationLevel.ORT_DISABLE_ALL), feeds)


# Versus an unfused graph, the fused op may differ by a couple of ulps of T: the graph rounds the normalized value
# to T before scaling (and computes in float32 steps), the fused op rounds once.
VERSUS_UNFUSED = {
    np.dtype(np.float64): (1e-12, 1e-300),
    np.dtype(np.float32): (4e-6, 1e-7),
    np.dtype(np.float16): (2.0**-9, 2.0**-24),
    BFLOAT16: (2.0**-6, 2.0**-133),
}


def assert_close_to_unfused(fused: np.ndarray, unfused: np.ndarray, what: str = "") -> None:
    """Float outputs within a couple of ulps; other outputs (shapes, integers) equal."""
    assert fused.dtype == unfused.dtype and fused.shape == unfused.shape, what
    if np.dtype(unfused.dtype) not in VERSUS_UNFUSED:
        np.testing.assert_array_equal(fused, unfused, err_msg=what)
        return
    rtol, atol = VERSUS_UNFUSED[np.dtype(unfused.dtype)]
    np.testing.assert_allclose(fused.astype(np.float64), unfused.astype(np.float64), rtol=rtol, atol=atol, err_msg=what)


def assert_close_after_layers(fused: np.ndarray, unfused: np.ndarray, what: str = "") -> None:
    """After several layers, the few-ulp differences of each norm travel through matrix products and may cancel:
    compare relative to the output's scale."""
    rtol = 4 * VERSUS_UNFUSED[np.dtype(unfused.dtype)][0]
    scale = float(np.abs(unfused.astype(np.float64)).max())
    np.testing.assert_allclose(
        fused.astype(np.float64), unfused.astype(np.float64), rtol=rtol, atol=rtol * scale, err_msg=what
    )


def float64_reference(case: NormCase) -> np.ndarray:
    """The norm in numpy float64 on the spelling's own parameters (not on what the pass emitted)."""
    s = case.spelling
    expected, _ = rmsnorm(
        case.feeds["x"],
        case.scale,
        axis=-s.normalized,
        epsilon=s.epsilon if s.eps != "none" else 0.0,
        eps_outside_sqrt=s.eps == "outside",
    )
    return expected


def assert_matches_float64(case: NormCase, fused_y: np.ndarray) -> None:
    """Our op against float64 with the op's own tolerance (one rounding to T plus float32 steps)."""
    assert_matches_reference(fused_y, float64_reference(case), fused_y.dtype, what=f"{case.spelling} vs float64")
