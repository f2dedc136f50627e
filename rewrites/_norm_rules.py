"""The RMSNorm rule: a decomposed RMSNorm in one of the forms of ``_patterns`` -> the target's norm op, where the
subgraph computes exactly an RMSNorm (the checks below) and the target can express it (``_targets``)."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from ._facts import (
    EXACT_WIDENINGS,
    NORM_DTYPES,
    SIXTEEN_BIT,
    NotFusable,
    check_dropped_dims,
    check_epsilon,
    check_scale_shape,
    constant_array,
    constant_scalar,
    dtype_name,
    format_shape,
    is_cast,
    label,
    reduction_axes,
    require_scalar,
    scalar_of,
    static_dims,
    trailing_axis,
)
from ._patterns import (
    DIVISIONS,
    FORMS,
    QUANTIZED,
    STATISTIC_CASTS,
    cast,
    divided,
    mean_square,
    normalized,
    quantized,
    rms_and_inverse,
)
from ._session import FusionSession, fused_node_name
from ._targets import NormSpec, Scale


class NormRule(pattern.RewriteRuleClassBase):
    """A rule whose check decides the NormSpec that the target's norm op replaces the match with."""

    def __init__(self, name: str, session: FusionSession) -> None:
        super().__init__(name, remove_nodes=False)  # the check decides what may go; see FusionSession
        self._session = session
        self._spec: NormSpec | None = None
        self._context = None
        self._converted_from: str | None = None

    def _adapted(self, context, analyze, anchor: ir.Node) -> NormSpec | pattern.MatchResult:
        """``analyze()``'s spec as the target can emit it, or the failed match (recorded as a near miss)."""
        session = self._session
        try:
            return session.target.adapt(analyze(), context.graph_or_function, context.model, session.types)
        except NotFusable as error:
            session.near_miss(context, self.name, error, anchor=anchor)
            return pattern.MatchResult().fail(error.reason, list(error.sources))

    def rewrite(self, op, **_):
        session, context = self._session, self._context
        name = fused_node_name(list(context.nodes), context.root, session.target.norm_op)
        output = session.target.emit(op, self._spec, name)
        session.fused_norm(self._spec, output.producer(), context, self.name, self._converted_from)
        return output


class RMSNormFusion(NormRule):
    """A decomposed RMSNorm ending in the node ``form`` names (see the module doc) → the target's norm op."""

    def __init__(self, form: str, session: FusionSession) -> None:
        super().__init__(f"RMSNorm[{form}]", session)
        self.form = form
        self.phase = FORMS[form]

    def pattern(self, op, x, scale):
        # x: what the statistic is computed from. A pattern's root must be a node, so the division forms take any
        # numerator (x_num) and leave the comparison with x to the check.
        rms, inverse = rms_and_inverse(op, mean_square(op, x))
        if self.form in DIVISIONS:
            return divided(op, self.form, pattern.Var("x_num"), rms, inverse, _outputs=["normalized"])
        value = normalized(op, x, rms, inverse)
        if self.form == "cast":
            return op.Cast(value, _outputs=["norm_cast"])
        if self.form == "castlike":
            return op.CastLike(value, pattern.Var("norm_cast_like"), _outputs=["norm_cast"])
        rounded = pattern.OrValue([cast(op, value, "norm_cast"), quantized(op, value, "norm_qdq"), value])
        if self.form == "scale":
            return op.Mul(rounded, scale, _outputs=["scaled"])
        if self.form == "scale_swapped":
            return op.Mul(scale, rounded, _outputs=["scaled"])
        scaled = pattern.OrValue(
            [op.Mul(rounded, scale, _outputs=["scaled"]), op.Mul(scale, rounded, _outputs=["scaled"])]
        )
        if self.form == "scale_castlike":
            return op.CastLike(scaled, pattern.Var("out_cast_like"), _outputs=["out_cast"])
        return op.Cast(scaled, _outputs=["out_cast"])

    def check(self, context, x, scale, x_num=None, **bindings):
        if x_num is not None and not _same_input(x, x_num, self._session.types):  # x / rms(y) is no RMSNorm
            if constant_array(x_num, self._session.types) is not None:  # Div(1, rms): an inverse, not a candidate
                return pattern.MatchResult().fail("divides a constant by the rms")
            reduce_node = bindings["reduced"].producer()
            error = _centered_statistic(x, reduce_node, self._session.types) or NotFusable(
                f"divides {label(x_num)} by the rms of another value, {label(x)}: not a norm of either", reduce_node
            )
            self._session.near_miss(context, self.name, error, anchor=reduce_node)
            return pattern.MatchResult().fail(error.reason, list(error.sources))
        spec = self._adapted(
            context, lambda: self._analyze(context, x, scale, bindings), anchor=bindings["reduced"].producer()
        )
        if isinstance(spec, pattern.MatchResult):
            return spec
        self._spec, self._context = spec, context
        return pattern.MatchResult()

    # ---- the checks ----

    def _analyze(self, context, x: ir.Value, scale: ir.Value | None, b: dict) -> NormSpec:
        types = self._session.types
        reduce_node = b["reduced"].producer()
        # The first pair in the data's order names the reason (every form of the norm then gives the same one).
        first = next((name for name in QUANTIZED if b.get(name) is not None), None)
        if first is not None:
            raise NotFusable(
                f"a QuantizeLinear/DequantizeLinear pair inside the norm rounds {QUANTIZED[first]} to its quantized "
                "type: the fused op would not",
                b[first].producer(),
            )
        if b.get("exponent") is not None:
            exponent = require_scalar(b["exponent"], "the square's exponent", types, None)
            if exponent != 2:
                raise NotFusable(f"exponent {exponent:g} is not 2 (not a mean square)", b["exponent"])
        x_shape = types.shape(x)
        rank = x_shape.rank() if x_shape is not None else None
        axis = trailing_axis(reduction_axes(reduce_node, types), rank, reduce_node)
        check_dropped_dims(reduce_node, x_shape, -axis)
        if reduce_node.op_type != "ReduceMean":
            _check_count(b["mean_square"].producer(), b["count"], x_shape, -axis, types)
        epsilon, placement = _epsilon(b, rank, types)
        if b.get("one") is not None and require_scalar(b["one"], "the numerator of 1/rms", types, rank) != 1:
            raise NotFusable("Div(c, rms) with c != 1 is not the inverse of the rms", b["one"])
        if (
            b.get("minus_half") is not None
            and require_scalar(b["minus_half"], "the exponent of ms", types, rank) != -0.5
        ):
            raise NotFusable("Pow(ms + eps, p) with p != -0.5 is not the inverse of the rms", b["minus_half"])
        _reject_centered(x, axis, rank, types)
        _check_intermediates(context)
        roundings = _statistic_roundings(b, types)
        fused_x = _fused_input(x, context.output_values[0], b, types)
        scaled = scale_spec(scale, x_shape, -axis, types)
        entering_scale = b.get("norm_cast") or b.get("normalized")
        if scale is not None and entering_scale is not None and types.dtype(entering_scale) in SIXTEEN_BIT:
            roundings.append(f"the normalized value is rounded to {dtype_name(types.dtype(entering_scale))} before the scale")
        return NormSpec(
            fused_x, types.dtype(fused_x), types.shape(fused_x), axis, epsilon, placement, scaled, tuple(roundings)
        )


def _statistic_roundings(b: dict, types) -> list[str]:
    """Where the subgraph rounds its statistic to a 16-bit type, which the fused op (statistic in float32 or wider)
    does not: a rounding question, reported. A cast of the statistic to any other type is not fused."""
    roundings = []
    statistic = types.dtype(b["reduced"])
    if statistic in SIXTEEN_BIT:
        roundings.append(f"the mean square is computed in {dtype_name(statistic)}")
    for name in STATISTIC_CASTS:
        cast = b.get(name)
        if cast is None:
            continue
        source, to = types.dtype(cast.producer().inputs[0]), types.dtype(cast)
        if to not in NORM_DTYPES:
            raise NotFusable(f"the statistic is cast to {dtype_name(to)}: the fused ops compute it in float32", cast)
        if to != source and (source, to) not in EXACT_WIDENINGS:
            what = "squares are" if name.startswith("sq_") else "statistic is"
            roundings.append(f"the {what} rounded to {dtype_name(to)}")
    return list(dict.fromkeys(roundings))


def _same_input(x: ir.Value, x_num: ir.Value, types) -> bool:
    """The value divided by the rms is the one the rms is computed from, an identical Cast of its source, or the
    source of a cast that changes no value (the statistic computed from float32 values of a float16 x, the division of
    x itself)."""
    if x is x_num:
        return True
    producer = x.producer()
    if is_cast(producer) and producer.inputs[0] is x_num:
        source, target = types.dtype(x_num), types.dtype(x)
        return source is not None and (source == target or (source, target) in EXACT_WIDENINGS)
    casts = [value.producer() for value in (x, x_num)]
    if not all(is_cast(node) for node in casts):
        return False
    first, second = casts
    return first.inputs[0] is second.inputs[0] and types.dtype(x) is not None and types.dtype(x) == types.dtype(x_num)


def _check_count(mean_node: ir.Node, count: ir.Value, x_shape, normalized: int, types) -> None:
    """ReduceSum(...) / D or * (1/D): D must be the number of reduced elements."""
    value = require_scalar(count, "the divisor of the sum", types, x_shape.rank() if x_shape else None)
    dims = static_dims(x_shape.dims[-normalized:]) if x_shape is not None else None
    if dims is None:
        raise NotFusable(
            f"reduced dims of {format_shape(x_shape)} are not static: cannot check that the sum is divided by their"
            " count",
            mean_node,
        )
    elements = math.prod(dims)
    expected = elements if mean_node.op_type == "Div" else 1.0 / elements
    array = constant_array(count, types)
    is_float = array.dtype.kind == "f" or array.dtype == ml_dtypes.bfloat16
    tolerance = float(ml_dtypes.finfo(array.dtype).eps) if is_float else 0.0  # the constant's own rounding
    if not math.isclose(value, expected, rel_tol=tolerance):
        spelled = f"{mean_node.op_type}({label(mean_node)}) by {value:g}"
        raise NotFusable(f"{spelled} is not a mean over the {elements} reduced elements", mean_node)


def _epsilon(b: dict, rank, types) -> tuple[float, str]:
    if b.get("epsilon") is None:
        return 0.0, "none"
    value = require_scalar(b["epsilon"], "epsilon", types, rank)
    check_epsilon(value, "", b["epsilon"])
    rms = b.get("rms")
    outside = rms is not None and rms.producer().op_type == "Add"
    return value, "outside_sqrt" if outside else "inside_sqrt"


def _strip_casts(value: ir.Value) -> ir.Value:
    while is_cast(producer := value.producer()):
        value = producer.inputs[0]
    return value


def _centered_statistic(x: ir.Value, reduce_node: ir.Node, types) -> NotFusable | None:
    """The LayerNorm reason when the statistic is that of ``x - mean(x)`` (whatever it then divides), else None."""
    shape = types.shape(x)
    rank = shape.rank() if shape is not None else None
    try:
        axis = trailing_axis(reduction_axes(reduce_node, types), rank, reduce_node)
        _reject_centered(x, axis, rank, types)
    except NotFusable as error:
        return error if "LayerNorm" in error.reason else None
    return None


def _reject_centered(x: ir.Value, axis: int, rank, types) -> None:
    """x - mean(x) over the normalized axes feeding the square is a LayerNorm (left for LayerNorm fusion)."""
    producer = _strip_casts(x).producer()
    if producer is None or producer.op_type != "Sub" or producer.domain != "":
        return
    for operand, other in ((producer.inputs[0], producer.inputs[1]), (producer.inputs[1], producer.inputs[0])):
        mean = _strip_casts(other).producer()
        if mean is None or mean.op_type != "ReduceMean" or _strip_casts(mean.inputs[0]) is not _strip_casts(operand):
            continue
        try:
            same_axes = trailing_axis(reduction_axes(mean, types), rank, mean) == axis
        except NotFusable:
            same_axes = False
        if same_axes:
            raise NotFusable("the input is x - mean(x) over the normalized axes: a LayerNorm, not an RMSNorm", producer)


def _check_intermediates(context) -> None:
    """Every value computed inside the match, except its output, must be used only inside it: the fused op replaces
    them all, and a value used elsewhere (or a graph output) must not disappear. A CastLike that only takes the
    value's type for a constant of the match (``CastLike(eps, ms)``) goes with it."""
    matched = set(context.nodes)
    for node in context.nodes:
        if node is context.root:
            continue
        for value in node.outputs:
            if value.is_graph_output():
                raise NotFusable(f"intermediate {label(value)} ({node.op_type} output) is a graph output", node)
            for user in value.consumers():
                if user not in matched and not _types_a_constant_of(user, value, matched):
                    raise NotFusable(
                        f"intermediate {label(value)} ({node.op_type} output) is also used by {user.op_type}"
                        f" {label(user)}",
                        node,
                        user,
                    )


def _types_a_constant_of(user: ir.Node, value: ir.Value, matched: set[ir.Node]) -> bool:
    if user.op_type != "CastLike" or user.domain != "" or user.inputs[0] is value:
        return False
    output = user.outputs[0]
    return not output.is_graph_output() and all(consumer in matched for consumer in output.consumers())


def _fused_input(x: ir.Value, output: ir.Value, b: dict, types) -> ir.Value:
    """The fused op's X. Its output has X's type, so X is the value of the output's type among the value the statistic
    is computed from and those before it through casts that change no value (the Hugging Face float16 -> float32
    pattern's exact up-cast, a no-op cast, or several: float16 converters add their own), the earliest first (a
    residual Add before the casts is then fused too)."""
    statistic = types.dtype(b["reduced"])
    if statistic is None or types.dtype(output) is None:
        raise NotFusable("element types unknown (shape inference found none here): cannot choose the fused op's types")
    if statistic not in NORM_DTYPES:
        raise NotFusable(
            f"the statistic is computed in {dtype_name(statistic)}: the fused ops take float32, float16, bfloat16"
        )
    out_dtype, x_dtype = types.dtype(output), types.dtype(x)
    candidates = [x]
    while is_cast(producer := candidates[0].producer()):
        source, cast = types.dtype(producer.inputs[0]), types.dtype(candidates[0])
        if source is None or not (source == cast or (source, cast) in EXACT_WIDENINGS) or len(candidates) > 8:
            break
        candidates.insert(0, producer.inputs[0])
    chosen = next((candidate for candidate in candidates if types.dtype(candidate) == out_dtype), None)
    if chosen is None:
        origin = " or ".join(dict.fromkeys(dtype_name(types.dtype(candidate)) for candidate in candidates))
        raise NotFusable(
            f"the output is {dtype_name(out_dtype)} but the input is {origin}: the fused op's output has its input's"
            " type"
        )
    rounded = b.get("norm_cast")
    if rounded is not None and rounded is not output and types.dtype(rounded) not in (out_dtype, x_dtype):
        raise NotFusable(
            f"the normalized value is rounded to {dtype_name(types.dtype(rounded))} before the scale, "
            f"but the output is {dtype_name(out_dtype)}"
        )
    if types.dtype(chosen) not in NORM_DTYPES:
        raise NotFusable(f"{dtype_name(types.dtype(chosen))} input: the fused ops take float32, float16, bfloat16")
    return chosen


def scale_spec(scale: ir.Value | None, x_shape, normalized: int, types) -> Scale | None:
    """What multiplies the normalized value: it must broadcast onto the normalized dims alone. None for no scale, or
    for ones that change nothing (torch's opset-23 export of a ``torch.nn.RMSNorm`` without weight passes
    ``ConstantOfShape(Shape(x), 1)`` to RMSNormalization)."""
    if scale is None or _ones_not_enlarging(scale, x_shape, types):
        return None
    check_scale_shape(types.shape(scale), x_shape, normalized, scale.producer() or scale)
    dtype = types.dtype(scale)
    if dtype is None:
        raise NotFusable("scale type unknown", scale)
    producer = scale.producer()
    if producer is not None and producer.op_type == "Add" and producer.domain == "":
        folded = _one_plus_constant(producer, scale, types)
        if folded is not None:
            return Scale(None, folded, "folded 1+w", dtype)
        if any(_is_one(operand, types) for operand in producer.inputs):
            return Scale(scale, None, "1+w", dtype)
    form = "cast tensor" if is_cast(producer) else "tensor"
    return Scale(scale, None, form, dtype)


def _ones_not_enlarging(scale: ir.Value, x_shape, types) -> bool:
    """ConstantOfShape filled with 1, of a shape that broadcasts onto X without enlarging it (its type is X's, as the
    Mul, or the converted op's output type, requires)."""
    producer = scale.producer()
    if producer is None or producer.op_type != "ConstantOfShape" or producer.domain != "":
        return False
    fill = producer.attributes.get("value")
    if fill is None or fill.type != ir.AttributeType.TENSOR:
        return False  # the default fill is 0
    if scalar_of(fill.value.numpy()) != 1.0 or x_shape is None:
        return False
    try:
        check_scale_shape(types.shape(scale), x_shape, x_shape.rank(), producer)
    except NotFusable:
        return False
    return True


def _is_one(value: ir.Value | None, types) -> bool:
    return constant_scalar(value, types) == 1.0


def _one_plus_constant(add: ir.Node, scale: ir.Value, types) -> np.ndarray | None:
    """(1 + w) with w constant, computed as the graph would (in the Add's type, one rounding)."""
    for one, weight in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
        if not _is_one(one, types):
            continue
        array = constant_array(weight, types)
        if array is None:
            return None
        dtype = types.dtype(scale).numpy()
        folded = array.astype(dtype) + np.ones((), dtype)
        shape = types.shape(scale)
        return folded if shape is not None and folded.shape == static_dims(shape.dims) else None
    return None
