"""The rewrite rules: one RMSNorm rule class (its pattern composed from the spellings exporters use) instantiated
for each possible last node of the subgraph, one that converts a norm op already in the model (an opset-23
``RMSNormalization`` from torch's exporter, onnxruntime's ``SimplifiedLayerNormalization``, our ``RMSNorm``) to the
target's, and a residual-Add rule that turns an Add + fused norm into the target's skip op.

A norm's subgraph ends in one of four ways (the last node decides which rule sees it first):

==================  =============================================  ======
form                last node                                      rank
==================  =============================================  ======
``scale_cast``      ``Cast(Mul(normalized', scale))``              0
``scale``           ``Mul(normalized', scale)`` (either order)     1
``cast``            ``Cast(normalized)``                           2
``div`` / ``mul``   ``normalized`` itself (``x / rms``, ``x * inv``)  3
==================  =============================================  ======

(``normalized'`` is ``normalized`` or ``Cast(normalized)``.) onnxscript's rewriter visits nodes in graph order, so
the inner node of a norm is seen before the scale Mul that follows it. A rule therefore defers when the single
consumer of its last node would be taken, in full, by a rule of lower rank; if that larger rule's check fails (a
scale that varies along batch axes, a cast that changes the output type), the smaller one fuses and the report
says what was left out.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from ._facts import (
    EXACT_WIDENINGS,
    NORM_DTYPES,
    NotFusable,
    check_dropped_dims,
    check_scale_shape,
    constant_array,
    constant_scalar,
    dtype_name,
    float_attribute,
    int_attribute,
    label,
    reduction_axes,
    require_scalar,
    format_shape,
    same_shape,
    scalar_of,
    static_dims,
    trailing_axis,
)
from ._session import FusionSession, fused_node_name
from ._targets import (
    DEFAULT_EPSILON,
    MS_DOMAIN,
    ONNX_RMSNORM_OPSET,
    OP_DOMAIN,
    OP_VERSION,
    STASH_FLOAT32,
    NormSpec,
    Scale,
    default_opset,
    expand_scale,
    require_domain_version,
)

# ---- sub-patterns -----------------------------------------------------------------------------------------------


def _mean_square(op, x):
    """mean(x²) over some axes: ReduceMean(x²) or ReduceSum(x²) / count or ReduceSumSquare(x) * (1/count), with x²
    spelled Pow(x, 2) or Mul(x, x). Axes, exponent and count are checked later, not here."""
    axes = pattern.Var("axes", can_match_none=True)
    square = pattern.OrValue([op.Pow(x, pattern.Var("exponent")), op.Mul(x, x)])
    total = pattern.OrValue(
        [op.ReduceSum(square, axes, _outputs=["reduced"]), op.ReduceSumSquare(x, axes, _outputs=["reduced"])]
    )
    count = pattern.Var("count")
    return pattern.OrValue(
        [
            op.ReduceMean(square, axes, _outputs=["reduced"]),
            op.Div(total, count),
            op.Mul(total, count),
            op.Mul(count, total),
        ],
        name="mean_square",
    )


def _rms_and_inverse(op, mean_square):
    """rms = sqrt(ms + eps) | sqrt(ms) + eps | sqrt(ms), and its inverse 1/rms spelled Reciprocal(rms), Div(1, rms)
    or Pow(ms + eps, -0.5). Epsilon may be either operand of its Add."""
    epsilon = pattern.Var("epsilon")
    with_eps = pattern.OrValue([op.Add(mean_square, epsilon), op.Add(epsilon, mean_square)], name="ms_eps")
    sqrt_ms = op.Sqrt(mean_square)
    rms = pattern.OrValue([op.Sqrt(with_eps), op.Add(sqrt_ms, epsilon), op.Add(epsilon, sqrt_ms), sqrt_ms], name="rms")
    inverse = pattern.OrValue(
        [
            op.Reciprocal(rms),
            op.Div(pattern.Var("one"), rms),
            op.Pow(pattern.OrValue([with_eps, mean_square]), pattern.Var("minus_half")),
        ],
        name="inverse",
    )
    return rms, inverse


def _divided(op, form, numerator, rms, inverse, **outputs):
    """``numerator`` divided by the rms as ``form`` spells it: x / rms, x * inverse or inverse * x."""
    if form == "div":
        return op.Div(numerator, rms, **outputs)
    return op.Mul(numerator, inverse, **outputs) if form == "mul" else op.Mul(inverse, numerator, **outputs)


def _normalized(op, x, rms, inverse):
    """The value divided by the rms, in any of the three spellings: x itself, or (TorchScript exports of T5-style
    norms) a second Cast of x's source, bound as ``x_num`` for the check to compare with x's Cast.

    Each choice is a whole node with x in it: the matcher backtracks over whole alternatives only, so a free
    numerator would let ``Mul(x_num, inverse)`` take a Mul whose other operand merely looks like an inverse (a
    LayerNorm's ``(x - mean) / std`` as ``Div(one, rms)``) and stop there, never trying the real ``inverse * x``."""
    x_src = pattern.Var("x_src")
    choices = [_divided(op, form, x, rms, inverse) for form in DIVISIONS]
    choices += [_divided(op, form, op.Cast(x_src, _outputs=["x_num"]), rms, inverse) for form in DIVISIONS]
    return pattern.OrValue(choices, name="normalized")


# ---- the RMSNorm rule -------------------------------------------------------------------------------------------

DIVISIONS = ("div", "mul", "mul_swapped")
FORMS = {"scale_cast": 0, "scale": 1, "scale_swapped": 1, "cast": 2, **{form: 3 for form in DIVISIONS}}


class _NormRule(pattern.RewriteRuleClassBase):
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


class RMSNormFusion(_NormRule):
    """A decomposed RMSNorm ending in the node ``form`` names (see the module doc) → the target's norm op."""

    def __init__(self, form: str, session: FusionSession, larger: list[RMSNormFusion]) -> None:
        super().__init__(f"RMSNorm[{form}]", session)
        self.form = form
        self.rank = FORMS[form]
        self._larger = larger  # all rules; those of lower rank are the ones this rule defers to

    def pattern(self, op, x, scale):
        # x: what the statistic is computed from. A pattern's root must be a node, so the division forms take any
        # numerator (x_num) and leave the comparison with x to the check.
        rms, inverse = _rms_and_inverse(op, _mean_square(op, x))
        if self.form in DIVISIONS:
            return _divided(op, self.form, pattern.Var("x_num"), rms, inverse, _outputs=["normalized"])
        normalized = _normalized(op, x, rms, inverse)
        if self.form == "cast":
            return op.Cast(normalized, _outputs=["norm_cast"])
        rounded = pattern.OrValue([op.Cast(normalized, _outputs=["norm_cast"]), normalized])
        if self.form == "scale":
            return op.Mul(rounded, scale, _outputs=["scaled"])
        if self.form == "scale_swapped":
            return op.Mul(scale, rounded, _outputs=["scaled"])
        scaled = pattern.OrValue(
            [op.Mul(rounded, scale, _outputs=["scaled"]), op.Mul(scale, rounded, _outputs=["scaled"])]
        )
        return op.Cast(scaled, _outputs=["out_cast"])

    def check(self, context, x, scale, x_num=None, **bindings):
        if x_num is not None and not _same_input(x, x_num):  # x / rms(y) is no RMSNorm (e.g. Div(1, rms))
            return pattern.MatchResult().fail("divides another value than the one the rms is computed from")
        spec = self._adapted(
            context, lambda: self._analyze(context, x, scale, bindings), anchor=bindings["reduced"].producer()
        )
        if isinstance(spec, pattern.MatchResult):
            return spec
        if not self._session.in_lookahead and self._deferred(context):
            return pattern.MatchResult().fail("deferred: a larger match ends at the next node")
        self._spec, self._context = spec, context
        return pattern.MatchResult()

    # ---- the checks ----

    def _analyze(self, context, x: ir.Value, scale: ir.Value | None, b: dict) -> NormSpec:
        types = self._session.types
        reduce_node = b["reduced"].producer()
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
        fused_x = _fused_input(x, context.output_values[0], b, types)
        scale_spec = _scale(scale, x_shape, -axis, types)
        return NormSpec(fused_x, types.dtype(fused_x), types.shape(fused_x), axis, epsilon, placement, scale_spec)

    def _deferred(self, context) -> bool:
        """True when the single consumer of this match's output completes a larger match (which fuses more).

        Larger matches at several consumers are tried too, only so that the report says why they fail."""
        output = context.output_values[0]
        consumers = output.consumers()
        larger = [
            (rule, consumer)
            for consumer in consumers
            for rule in self._larger
            if rule.rank < self.rank and rule.form_op == consumer.op_type
        ]
        with self._session.lookahead():
            matched = [
                bool(rule.match(context.model, context.graph_or_function, consumer, check_nodes_are_removable=False))
                for rule, consumer in larger
            ]
        return any(matched) and len(consumers) == 1 and not output.is_graph_output()

    @property
    def form_op(self) -> str:
        return "Cast" if self.form in ("scale_cast", "cast") else ("Div" if self.form == "div" else "Mul")


def _same_input(x: ir.Value, x_num: ir.Value) -> bool:
    """The value divided by the rms is the one the rms is computed from, or an identical Cast of its source."""
    if x is x_num:
        return True
    casts = [value.producer() for value in (x, x_num)]
    if not all(cast is not None and cast.op_type == "Cast" and cast.domain == "" for cast in casts):
        return False
    first, second = casts
    to = int_attribute(first, "to")
    return first.inputs[0] is second.inputs[0] and to is not None and to == int_attribute(second, "to")


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
    _check_epsilon(value, "", b["epsilon"])
    rms = b.get("rms")
    outside = rms is not None and rms.producer().op_type == "Add"
    return value, "outside_sqrt" if outside else "inside_sqrt"


def _strip_casts(value: ir.Value) -> ir.Value:
    while (producer := value.producer()) is not None and producer.op_type == "Cast" and producer.domain == "":
        value = producer.inputs[0]
    return value


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
    """The fused op's X. Its output has X's type, so X is the value of the output's type among: the input before an
    exact up-cast (the Hugging Face float16 → float32 pattern) or a no-op cast, or the value the statistic is computed
    from."""
    statistic = types.dtype(b["reduced"])
    if statistic is None or types.dtype(output) is None:
        raise NotFusable("element types unknown (shape inference found none here): cannot choose the fused op's types")
    if statistic not in NORM_DTYPES:
        raise NotFusable(
            f"the statistic is computed in {dtype_name(statistic)}: the fused ops take float32, float16, bfloat16"
        )
    out_dtype, x_dtype = types.dtype(output), types.dtype(x)
    candidates = [x]
    producer = x.producer()
    if producer is not None and producer.op_type == "Cast" and producer.domain == "":
        source = producer.inputs[0]
        if types.dtype(source) == x_dtype or (types.dtype(source), x_dtype) in EXACT_WIDENINGS:
            candidates.insert(0, source)  # a no-op cast (Hugging Face's .to(float32) of float32) or an exact one
    chosen = next((candidate for candidate in candidates if types.dtype(candidate) == out_dtype), None)
    if chosen is None:
        origin = " or ".join(dtype_name(types.dtype(candidate)) for candidate in candidates)
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


def _scale(scale: ir.Value | None, x_shape, normalized: int, types) -> Scale | None:
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
    form = "cast tensor" if producer is not None and producer.op_type == "Cast" else "tensor"
    return Scale(scale, None, form, dtype)


def _check_epsilon(value: float, what: str, source) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise NotFusable(f"{what}epsilon {value:g} is not finite and >= 0", source)


def _require_stash_float32(node: ir.Node, what: str) -> None:
    stash_type = int_attribute(node, "stash_type", STASH_FLOAT32)
    if stash_type != STASH_FLOAT32:
        raise NotFusable(f"{what} computes in stash_type {stash_type}, not float32", node)


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


# ---- norm ops already in the model -------------------------------------------------------------------------------

# The single-output norm ops the rule converts, as the report names them. All three define ``axis`` alike (dims
# [axis, rank) are normalized) and broadcast the scale onto those dims; the two standard ones put epsilon inside the
# sqrt and give Y the scale's type. com.microsoft.SkipSimplifiedLayerNormalization is not converted: for 16-bit
# types it normalizes the sum before rounding it, where SkipRMSNorm (like an Add in the graph) normalizes the rounded
# sum.
NORM_OPS = ("RMSNormalization", "SimplifiedLayerNormalization", f"{OP_DOMAIN}.RMSNorm")


class NormOpConversion(_NormRule):
    """A norm op of ``NORM_OPS`` already in the model (an exporter's opset-23 ``RMSNormalization``, onnxruntime's
    ``SimplifiedLayerNormalization``, our ``RMSNorm``) → the target's norm op, where that computes the same thing.
    The residual Add before it is then fused by SkipFusion as for any other norm."""

    def __init__(self, source: str, session: FusionSession) -> None:
        super().__init__(f"Convert[{source}]", session)
        self._domain, _, self._op_type = source.rpartition(".")
        self._converted_from = source

    def pattern(self, op, x):
        scale = pattern.Var("scale", can_match_none=True)
        return getattr(op, self._op_type)(x, scale, _domain=self._domain, _outputs=["normed"])

    def check(self, context, x, normed, scale=None, **_):
        node = normed.producer()
        spec = self._adapted(context, lambda: self._analyze(context, node, x, scale), anchor=node)
        if isinstance(spec, pattern.MatchResult):
            return spec
        self._spec, self._context = spec, context
        return pattern.MatchResult()

    def _analyze(self, context, node: ir.Node, x: ir.Value, scale: ir.Value | None) -> NormSpec:
        types = self._session.types
        what = f"{self._converted_from} {label(node)}"
        if any(value.uses() or value.is_graph_output() for value in node.outputs[1:]):
            raise NotFusable(f"{what}: its inv_std_var output is in use (the fused ops have none)", node)
        x_dtype = types.dtype(x)
        if x_dtype not in NORM_DTYPES:
            raise NotFusable(
                f"{what}: {dtype_name(x_dtype)} input; the fused ops take float32, float16, bfloat16", node
            )
        if self._domain == OP_DOMAIN:
            placement = "outside_sqrt" if int_attribute(node, "eps_outside_sqrt", 0) else "inside_sqrt"
        else:
            opset = default_opset(context.graph_or_function, context.model)
            if self._op_type == "RMSNormalization" and opset < ONNX_RMSNORM_OPSET:
                raise NotFusable(
                    f"{what} at default opset {opset}: the op exists from opset {ONNX_RMSNORM_OPSET}", node
                )
            _require_stash_float32(node, what)
            y_dtype = types.dtype(scale) if scale is not None else None
            if y_dtype != x_dtype:
                raise NotFusable(
                    f"{what} gives Y its scale's type ({dtype_name(y_dtype)}) and X is {dtype_name(x_dtype)}: the "
                    "fused ops give Y X's type",
                    node,
                )
            placement = "inside_sqrt"
        epsilon = float_attribute(node, "epsilon", DEFAULT_EPSILON)
        if epsilon is None:
            raise NotFusable(f"{what}: the epsilon attribute is not a float", node)
        _check_epsilon(epsilon, f"{what}: ", node)
        x_shape = types.shape(x)
        axis = _normalized_axis(node, what, x_shape.rank() if x_shape is not None else None)
        return NormSpec(x, x_dtype, x_shape, axis, epsilon, placement, _scale(scale, x_shape, -axis, types))


def _normalized_axis(node: ir.Node, what: str, rank: int | None) -> int:
    """The node's ``axis`` as the fused op's (negative: -k normalizes the last k dims)."""
    axis = int_attribute(node, "axis", -1)
    if axis is None:
        raise NotFusable(f"{what}: the axis attribute is not an int", node)
    if rank is None:
        if axis >= 0:
            raise NotFusable(f"{what}: rank unknown, so axis {axis} names no known number of trailing dims", node)
        return axis
    if not -rank <= axis < rank:
        raise NotFusable(f"{what}: axis {axis} is out of range for rank {rank}", node)
    return axis - rank if axis >= 0 else axis


# ---- the residual Add -------------------------------------------------------------------------------------------


class SkipFusion(pattern.RewriteRuleClassBase):
    """Add(a, b) → norm op, with a and b of one shape → the target's skip op, whose ``sum`` output replaces the
    Add's output for its other consumers. Also fuses an Add before a norm fused by an earlier run (so the pass is
    idempotent). Targets: ``custom`` (RMSNorm → SkipRMSNorm) and ``ort`` (SimplifiedLayerNormalization →
    com.microsoft.SkipSimplifiedLayerNormalization)."""

    def __init__(self, session: FusionSession) -> None:
        super().__init__(f"SkipAdd[{session.target.name}]", remove_nodes=True)
        self._session = session
        self._ort = session.target.name == "ort"

    def pattern(self, op, a, b):
        scale = pattern.Var("scale", can_match_none=True)
        total = op.Add(a, b, _outputs=["total"])
        if self._ort:
            normed = op.SimplifiedLayerNormalization(total, scale, _outputs=["normed"])
        else:
            normed = op.RMSNorm(total, scale, _domain=OP_DOMAIN, _outputs=["normed"])
        return normed, total

    def check(self, context, a, b, total, normed, scale=None, **_):
        try:
            self._check_residual(context, a, b, total, normed.producer())
            shape = self._session.types.shape(a)
            self._gamma = self._ort_gamma(normed.producer(), scale, shape) if self._ort else scale
        except NotFusable as error:
            self._session.near_miss(context, self.name, error, anchor=total.producer())
            return pattern.MatchResult().fail(error.reason, list(error.sources))
        self._context = context
        return pattern.MatchResult()

    def rewrite(self, op, a, b, total, normed, **_):
        norm = normed.producer()
        path = norm.name.rsplit("/", 1)[0] + "/" if "/" in norm.name else (f"{norm.name}/" if norm.name else "")
        if self._ort:
            name = f"{path}SkipSimplifiedLayerNormalization"
            gamma = self._gamma
            if isinstance(gamma, np.ndarray):
                gamma = op.Constant(value=ir.tensor(gamma, name=f"{name}/gamma"), _outputs=[f"{name}/gamma"])
            epsilon = float_attribute(norm, "epsilon", DEFAULT_EPSILON)
            outputs = op.SkipSimplifiedLayerNormalization(
                a, b, gamma, _domain=MS_DOMAIN, _outputs=4, _name=name, epsilon=epsilon
            )
            replaced = [normed, None, None, total]
        else:
            name = f"{path}SkipRMSNorm"
            inputs = [a, b] + ([self._gamma] if self._gamma is not None else [])
            attributes = {attr_name: attr.value for attr_name, attr in norm.attributes.items()}
            outputs = op.SkipRMSNorm(
                *inputs, _domain=OP_DOMAIN, _version=OP_VERSION, _outputs=2, _name=name, **attributes
            )
            replaced = [normed, total]
        self._session.fused_residual(norm, outputs[0].producer(), self._context, self.name, replaced)
        return outputs[0], outputs[-1]

    def _check_residual(self, context, a, b, total, norm: ir.Node) -> None:
        types = self._session.types
        add = total.producer()
        a_shape, b_shape = types.shape(a), types.shape(b)
        if not same_shape(a_shape, b_shape):
            raise NotFusable(
                f"Add {label(add)} of shapes {format_shape(a_shape)} and {format_shape(b_shape)} is not known to add "
                "two tensors of one shape (a residual add); a broadcast operand such as a bias stays",
                add,
            )
        if types.dtype(a) not in NORM_DTYPES:
            raise NotFusable(
                f"{dtype_name(types.dtype(a))} residual: the fused ops take float32, float16, bfloat16", add
            )
        if any(value.uses() or value.is_graph_output() for value in norm.outputs[1:]):
            raise NotFusable(f"{norm.op_type} {label(norm)} has other outputs in use", norm)
        if not self._ort:
            require_domain_version(OP_DOMAIN, OP_VERSION, context.graph_or_function, context.model)

    def _ort_gamma(self, norm: ir.Node, scale: ir.Value | None, shape: ir.Shape) -> ir.Value | np.ndarray:
        """SkipSimplifiedLayerNormalization normalizes the last axis of a rank-2 or rank-3 input and takes a 1-D gamma
        of the hidden size and the input's type (a constant scale that broadcasts is expanded to that)."""
        types = self._session.types
        rank = shape.rank()
        axis = int_attribute(norm, "axis", -1)
        if rank not in (2, 3) or axis not in (-1, rank - 1):
            raise NotFusable(
                "SkipSimplifiedLayerNormalization normalizes the last axis of a rank-2 or rank-3 input; "
                f"{label(norm)} has axis {axis} on an input of shape {format_shape(shape)}",
                norm,
            )
        _require_stash_float32(norm, label(norm))
        if scale is None or types.dtype(scale) != types.dtype(norm.inputs[0]):
            raise NotFusable("SkipSimplifiedLayerNormalization needs gamma of the input's type", norm)
        hidden = shape.dims[-1]
        gamma_shape = types.shape(scale)
        if gamma_shape is not None and same_shape(gamma_shape, ir.Shape([hidden])):
            return scale
        array, size = constant_array(scale, types), static_dims([hidden])
        if array is None or size is None or array.size not in (1, size[0]):
            raise NotFusable(
                "SkipSimplifiedLayerNormalization needs a 1-D gamma of the hidden size; the scale has shape "
                f"{format_shape(gamma_shape)} on an input of shape {format_shape(shape)}",
                norm,
            )
        return expand_scale(array, size)


# ---- the rule set -----------------------------------------------------------------------------------------------


def build_rules(session: FusionSession) -> list[pattern.RewriteRule]:
    """The norm rules in rank order (larger matches first), the conversions of the other norm ops, then the
    residual rule where the target has one."""
    norm_rules: list[RMSNormFusion] = []
    norm_rules += [RMSNormFusion(form, session, norm_rules) for form in FORMS]
    rules = [_as_rule(rule) for rule in norm_rules]
    rules += [_as_rule(NormOpConversion(source, session)) for source in NORM_OPS if source != session.target.norm_op]
    if session.target.name in ("custom", "ort"):
        rules.append(_as_rule(SkipFusion(session)))
    return rules


def _as_rule(instance: pattern.RewriteRuleClassBase) -> pattern.RewriteRule:
    return pattern.RewriteRule(
        instance.pattern, instance.rewrite, instance.check, name=instance.name, remove_nodes=instance.remove_nodes
    )
