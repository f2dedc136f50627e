"""The RMSNorm rule: a decomposed RMSNorm in one of the forms of ``_patterns`` -> the target's norm op, where the
subgraph computes exactly an RMSNorm (the checks below) and the target can express it (``Target.adapt``)."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from ort_rmsnorm.contract import EPS_INSIDE, EPS_NONE, EPS_OUTSIDE

from ._facts import (
    EXACT_WIDENINGS,
    NORM_DTYPES,
    SIXTEEN_BIT,
    NotFusable,
    check_dropped_dims,
    check_epsilon,
    constant_array,
    constant_scalar,
    dtype_name,
    format_shape,
    is_cast,
    label,
    proven_shape,
    reduction_axes,
    require_scalar,
    static_dims,
    trailing_axis,
)
from ._patterns import (
    DIVISIONS,
    FACTORS,
    STATISTIC_CASTS,
    cast,
    divided,
    factor,
    mean_square,
    normalized,
    quantized,
    rms_and_inverse,
)
from ._quantized import numerator_roundings, quantized_roundings
from ._rule_base import NormRule
from ._scales import scale_spec
from ._session import FusionSession
from ._specs import NormSpec, Scale


# The output each form's pattern names (the match's root is its producer).
_OUTPUT = {
    **{form: "out_cast" for form in ("scale_cast", "scale_castlike", "factor_cast", "factor_castlike")},
    **{form: "scaled" for form in ("scale", "scale_swapped", "factor", "factor_swapped")},
    **{form: "norm_cast" for form in ("cast", "castlike")},
    **{form: "normalized" for form in DIVISIONS},
}


class RMSNormFusion(NormRule):
    """A decomposed RMSNorm ending in the node ``form`` names (see the module doc) → the target's norm op."""

    def __init__(self, form: str, session: FusionSession) -> None:
        super().__init__(f"RMSNorm[{form}]", session)
        self.form = form

    def root(self, bindings):
        return bindings[_OUTPUT[self.form]].producer()

    def pattern(self, op, x, scale):
        # x: what the statistic is computed from. A pattern's root must be a node, so the division and factor forms
        # take any numerator (x_num) and leave the comparison with x to the check.
        rms, inverse = rms_and_inverse(op, mean_square(op, x), x)
        if self.form in FACTORS:
            return self._factor_pattern(op, inverse, scale)
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

    def _factor_pattern(self, op, inverse, scale):
        """``x * factor'`` or ``factor' * x`` (x as ``x_num``, compared with the statistic's x by the check), cast
        after it for the cast forms."""
        x_num, value = pattern.Var("x_num"), factor(op, inverse, scale)
        if self.form == "factor":
            return op.Mul(x_num, value, _outputs=["scaled"])
        if self.form == "factor_swapped":
            return op.Mul(value, x_num, _outputs=["scaled"])
        scaled = pattern.OrValue([op.Mul(x_num, value, _outputs=["scaled"]), op.Mul(value, x_num, _outputs=["scaled"])])
        if self.form == "factor_castlike":
            return op.CastLike(scaled, pattern.Var("out_cast_like"), _outputs=["out_cast"])
        return op.Cast(scaled, _outputs=["out_cast"])

    def check(self, context, x, scale, x_num=None, **bindings):
        reduce_node = bindings["reduced"].producer()
        numerator = []  # the roundings of a Q/DQ pair on the divided value only
        if x_num is not None and not _same_input(x, x_num, self._session.facts):  # x / rms(y) is no RMSNorm
            try:
                numerator = numerator_roundings(x, x_num, self._session.facts, self._session.through_qdq)
            except NotFusable as error:
                return self._decline(context, error, reduce_node)
            if numerator is None:
                return self._other_numerator(context, x, x_num, scale, bindings, reduce_node)
        analyze = lambda: self._analyze(context, x, scale, bindings, numerator)  # noqa: E731
        return self._adapted(context, bindings, analyze, anchor=reduce_node)

    def _other_numerator(self, context, x, x_num, scale, bindings, reduce_node) -> pattern.MatchResult:
        """The value divided by the rms (or multiplied by the factor) is not the one the rms is computed from: a
        near miss with its reason, or no candidate at all (silent)."""
        facts = self._session.facts
        if self.form in FACTORS and scale is not None and _same_input(x, scale, facts):
            # w * (inverse * x): the scale form's candidate, with x in the factor.
            return pattern.MatchResult().fail("x times its inverse rms, then a scale: a scale form's candidate")
        if constant_array(x_num, facts) is not None:  # Div(1, rms), c * (inverse * w): an inverse, not a candidate
            return pattern.MatchResult().fail("divides a constant by the rms")
        if self.form not in FACTORS and _is_factor(bindings["normalized"], x, facts):
            # x * (inverse * w) met as ``inverse * w`` (w the numerator) or ``x * normalized`` (x the scale): the
            # factor forms' candidate. Their rules met it first (at the same last node, or in an earlier phase) and
            # said why it stays.
            if self._session.has_near_miss(reduce_node):
                return pattern.MatchResult().fail("the factor form's candidate, reported by its rule")
            error = NotFusable(
                f"multiplies {label(x)} by its inverse rms times {label(x_num)} (the factor-times-scale form) in a "
                "spelling the pass does not match",
                reduce_node,
            )
        elif self.form in FACTORS:
            error = _centered_statistic(x, reduce_node, facts) or NotFusable(
                f"multiplies {label(x_num)} by the inverse rms of another value, {label(x)}, times {label(scale)}: "
                "not a norm of either",
                reduce_node,
            )
        else:
            error = _centered_statistic(x, reduce_node, facts) or NotFusable(
                f"divides {label(x_num)} by the rms of another value, {label(x)}: not a norm of either", reduce_node
            )
        return self._decline(context, error, reduce_node)

    # ---- the checks ----

    def _analyze(self, context, x: ir.Value, scale: ir.Value | None, b: dict, numerator: list[str]) -> NormSpec:
        facts = self._session.facts
        reduce_node = b["reduced"].producer()
        quantized = quantized_roundings(b, facts, self._session.through_qdq) + numerator
        if b.get("exponent") is not None:
            exponent = require_scalar(b["exponent"], "the square's exponent", facts, None)
            if exponent != 2:
                raise NotFusable(f"exponent {exponent:g} is not 2 (not a mean square)", b["exponent"])
        x_shape = facts.shape(x)
        rank = x_shape.rank() if x_shape is not None else None
        axis = trailing_axis(reduction_axes(reduce_node, facts), rank, reduce_node)
        check_dropped_dims(reduce_node, x_shape, -axis)
        if b.get("count") is not None:
            _check_count(b["mean_square"].producer(), b["count"], x_shape, -axis, facts)
        sum_of_squares = b.get("count") is None and reduce_node.op_type in _SUMS
        derivation = None
        if b.get("root_count") is not None:  # the root of the sum scaled to the rms: sqrt(sum) / sqrt(d)
            if not sum_of_squares:
                raise NotFusable(
                    f"the root of the mean square is scaled by {label(b['root_count'])}: not the rms", b["sqrt_ms"]
                )
            derivation = _check_root_count(b["sqrt_ms"].producer(), b["root_count"], x_shape, -axis, facts)
            sum_of_squares = False
        epsilon, placement = _epsilon(b, rank, facts)
        if sum_of_squares:
            epsilon, inverse_root, derivation = _sum_of_squares(reduce_node, x_shape, -axis, epsilon, placement)
        if b.get("one") is not None and require_scalar(b["one"], "the numerator of 1/rms", facts, rank) != 1:
            raise NotFusable("Div(c, rms) with c != 1 is not the inverse of the rms", b["one"])
        if (
            b.get("minus_half") is not None
            and require_scalar(b["minus_half"], "the exponent of ms", facts, rank) != -0.5
        ):
            raise NotFusable("Pow(ms + eps, p) with p != -0.5 is not the inverse of the rms", b["minus_half"])
        _reject_centered(x, axis, rank, facts)
        _check_intermediates(context)
        roundings = quantized + _statistic_roundings(b, facts)
        fused_x = _fused_input(x, context.output_values[0], b, facts)
        if self.form in FACTORS:
            roundings += _factor_roundings(b, facts)
        fused_shape = facts.shape(fused_x)
        if scale is not None:  # what the scale must match: the dims the graph proves (inference may not know them)
            x_shape = proven_shape(x, x_shape, -axis, facts)
            fused_shape = proven_shape(fused_x, fused_shape, -axis, facts)
        scaled = scale_spec(scale, x_shape, -axis, facts)
        if sum_of_squares:
            scaled, how = _times_inverse_root(scaled, inverse_root, x_shape, -axis, facts.dtype(fused_x), facts)
            derivation += f", {how}"
        entering_scale = b.get("norm_cast") or b.get("normalized")
        if scale is not None and entering_scale is not None and facts.dtype(entering_scale) in SIXTEEN_BIT:
            rounded_to = dtype_name(facts.dtype(entering_scale))
            roundings.append(f"the normalized value is rounded to {rounded_to} before the scale")
        return NormSpec(
            fused_x, facts.dtype(fused_x), fused_shape, axis, epsilon, placement, scaled, tuple(roundings),
            derivation=derivation,
        )


_SUMS = ("ReduceSum", "ReduceSumSquare", "ReduceL2")
"""The reductions that sum the squares (ReduceL2: its root) rather than average them."""


def _reduced_count(node: ir.Node, x_shape, normalized: int, what: str) -> int:
    """The number of elements a reduction over the trailing ``normalized`` dims covers; they must be static."""
    dims = static_dims(x_shape.dims[-normalized:]) if x_shape is not None else None
    if dims is None:
        raise NotFusable(
            f"reduced dims of {format_shape(x_shape)} are not static: cannot check that {what}", node
        )
    return math.prod(dims)


def _check_root_count(node: ir.Node, count: ir.Value, x_shape, normalized: int, facts) -> str:
    """``root / c`` or ``root * c``, root the root of the sum of squares: the rms when c is sqrt(d) (or 1/sqrt(d)),
    up to the constant's own rounding (as a mean's divisor is taken, see :func:`_check_count`). Returns how the rms
    was derived, for the report."""
    value = require_scalar(count, "the divisor of the root of the sum", facts, x_shape.rank() if x_shape else None)
    elements = _reduced_count(node, x_shape, normalized, "the root of the sum is divided by the root of their count")
    expected = math.sqrt(elements) if node.op_type == "Div" else 1.0 / math.sqrt(elements)
    array = constant_array(count, facts)
    is_float = array.dtype.kind == "f" or array.dtype == ml_dtypes.bfloat16
    tolerance = float(ml_dtypes.finfo(array.dtype).eps) if is_float else 0.0
    spelled = f"{'divided by' if node.op_type == 'Div' else 'times'} {value:g}"
    if not math.isclose(value, expected, rel_tol=tolerance):
        raise NotFusable(
            f"the root of the sum of squares {spelled} is not the rms of the {elements} reduced elements "
            f"(that needs {'sqrt' if node.op_type == 'Div' else '1/sqrt'}({elements}) = {expected:g})",
            node,
        )
    exact = "" if value == expected else f" (sqrt({elements}) as the constant's type rounds it)"
    return f"the root of the sum of squares over {elements} elements {spelled}{exact}: their rms"


def _sum_of_squares(node: ir.Node, x_shape, normalized: int, epsilon: float, placement: str):
    """x / sqrt(sum + eps) over d elements is x / (sqrt(d) * sqrt(mean + eps/d)): an RMSNorm with epsilon eps/d
    (eps/sqrt(d) outside the sqrt) times 1/sqrt(d). Both must be exact: 1/sqrt(d) a power of two (d a power of
    4) and the new epsilon a float32. Returns the epsilon, 1/sqrt(d) and how they were derived."""
    elements = _reduced_count(node, x_shape, normalized, "the sum of squares is d times their mean")
    exponent = elements.bit_length() - 1
    if elements != 1 << exponent or exponent % 2:
        raise NotFusable(
            f"{node.op_type} {label(node)} sums the squares of {elements} elements: the norm is an RMSNorm times "
            f"1/sqrt({elements}), which no float holds exactly (the fused op would round that scale)",
            node,
        )
    inverse_root = 2.0 ** (-exponent // 2)
    divisor = elements if placement == EPS_INSIDE else 2.0 ** (exponent // 2)
    derived = epsilon / divisor
    if float(np.float32(derived)) != derived:
        raise NotFusable(
            f"{node.op_type} {label(node)} sums the squares of {elements} elements: epsilon {epsilon:g} / {divisor:g} "
            "is not exactly a float32",
            node,
        )
    how = f"the sum of squares over {elements} elements is {elements} x their mean: "
    if placement != EPS_NONE:
        how += f"epsilon {epsilon:g}/{divisor:g} = {derived:g} ({placement}), "
    how += f"scale 1/sqrt({elements}) = {inverse_root:g}"
    return derived, inverse_root, how


def _times_inverse_root(scaled: Scale | None, inverse_root: float, x_shape, normalized: int, x_dtype, facts):
    """The scale times 1/sqrt(d), a power of two, as a new constant: of ones times it where the graph has no scale
    (X's type, one element per normalized element), else the graph's constant scale times it, which must stay exact
    in its type (no underflow). A scale computed at run time cannot take it: the norm is then fused without it."""
    if scaled is None:
        dims = static_dims(x_shape.dims[-normalized:])
        constant = np.full(dims, inverse_root, dtype=x_dtype.numpy())
        return Scale(None, constant, "1/sqrt(d) (added)", x_dtype), "in a scale of its own (exact)"
    array = scaled.constant if scaled.value is None else constant_array(scaled.value, facts)
    if array is None:
        raise NotFusable(
            f"the scale is computed at run time: the 1/sqrt(d) = {inverse_root:g} of a sum of squares cannot be "
            "folded into it",
            scaled.value,
        )
    dtype = scaled.dtype.numpy()
    product = np.asarray(array, dtype=np.float64) * inverse_root
    folded = product.astype(dtype)
    if not np.array_equal(folded.astype(np.float64), product):
        raise NotFusable(
            f"the scale times 1/sqrt(d) = {inverse_root:g} is not exact in {dtype_name(scaled.dtype)} (it underflows)",
            scaled.value,
        )
    return Scale(None, folded, f"folded {scaled.form}/sqrt(d)", scaled.dtype), "folded into the scale (exact)"


def _statistic_roundings(b: dict, facts) -> list[str]:
    """Where the subgraph rounds its statistic to a 16-bit type, which the fused op (statistic in float32 or wider)
    does not: a rounding question, reported. A cast of the statistic to any other type is not fused."""
    roundings = []
    statistic = facts.dtype(b["reduced"])
    if statistic in SIXTEEN_BIT:
        roundings.append(f"the mean square is computed in {dtype_name(statistic)}")
    for name in STATISTIC_CASTS:
        cast = b.get(name)
        if cast is None:
            continue
        source, to = facts.dtype(cast.producer().inputs[0]), facts.dtype(cast)
        if to not in NORM_DTYPES:
            raise NotFusable(f"the statistic is cast to {dtype_name(to)}: the fused ops compute it in float32", cast)
        if to != source and (source, to) not in EXACT_WIDENINGS:
            what = "squares are" if name.startswith("sq_") else "statistic is"
            roundings.append(f"the {what} rounded to {dtype_name(to)}")
    return list(dict.fromkeys(roundings))


def _factor_roundings(b: dict, facts) -> list[str]:
    """The factor ``inverse * scale`` is rounded to its type before it multiplies x; the fused op rounds once, at
    its output. A factor cast to a type the fused ops do not compute in is not fused."""
    value = b.get("factor_cast") or b["factor"]
    dtype = facts.dtype(value)
    if dtype not in NORM_DTYPES:
        raise NotFusable(
            f"the inverse rms times the scale is {dtype_name(dtype)}: the fused ops compute it in float32", value
        )
    return [f"the inverse rms times the scale is rounded to {dtype_name(dtype)}"] if dtype in SIXTEEN_BIT else []


def _is_factor(value: ir.Value, x: ir.Value, facts) -> bool:
    """``value`` (a product of the inverse rms of x and something else) is multiplied by x itself, possibly after a
    cast: ``x * (inverse * w)``, the factor-times-scale form."""
    products = [value] + [node.outputs[0] for node in value.consumers() if is_cast(node)]
    for product in products:
        for user in product.consumers():
            if user.op_type != "Mul" or user.domain != "" or len(user.inputs) != 2:
                continue
            others = [operand for operand in user.inputs if operand is not product]
            if others and others[0] is not None and _same_input(x, others[0], facts):
                return True
    return False


def _same_input(x: ir.Value, x_num: ir.Value, facts) -> bool:
    """The value divided by the rms is the one the rms is computed from, an identical Cast of its source, or the
    source of a cast that changes no value (the statistic computed from float32 values of a float16 x, the division of
    x itself)."""
    if x is x_num:
        return True
    producer = x.producer()
    if is_cast(producer) and producer.inputs[0] is x_num:
        source, target = facts.dtype(x_num), facts.dtype(x)
        return source is not None and (source == target or (source, target) in EXACT_WIDENINGS)
    casts = [value.producer() for value in (x, x_num)]
    if not all(is_cast(node) for node in casts):
        return False
    first, second = casts
    return first.inputs[0] is second.inputs[0] and facts.dtype(x) is not None and facts.dtype(x) == facts.dtype(x_num)


def _check_count(mean_node: ir.Node, count: ir.Value, x_shape, normalized: int, facts) -> None:
    """ReduceSum(...) / D or * (1/D): D must be the number of reduced elements."""
    value = require_scalar(count, "the divisor of the sum", facts, x_shape.rank() if x_shape else None)
    dims = static_dims(x_shape.dims[-normalized:]) if x_shape is not None else None
    if dims is None:
        raise NotFusable(
            f"reduced dims of {format_shape(x_shape)} are not static: cannot check that the sum is divided by their"
            " count",
            mean_node,
        )
    elements = math.prod(dims)
    expected = elements if mean_node.op_type == "Div" else 1.0 / elements
    array = constant_array(count, facts)
    is_float = array.dtype.kind == "f" or array.dtype == ml_dtypes.bfloat16
    tolerance = float(ml_dtypes.finfo(array.dtype).eps) if is_float else 0.0  # the constant's own rounding
    if not math.isclose(value, expected, rel_tol=tolerance):
        spelled = f"{mean_node.op_type}({label(mean_node)}) by {value:g}"
        raise NotFusable(f"{spelled} is not a mean over the {elements} reduced elements", mean_node)


def _epsilon(b: dict, rank, facts) -> tuple[float, str]:
    if b.get("epsilon") is None:
        return 0.0, EPS_NONE
    value = require_scalar(b["epsilon"], "epsilon", facts, rank)
    check_epsilon(value, "", b["epsilon"])
    rms = b.get("rms")
    outside = rms is not None and rms.producer().op_type == "Add"
    return value, EPS_OUTSIDE if outside else EPS_INSIDE


def _strip_casts(value: ir.Value) -> ir.Value:
    while is_cast(producer := value.producer()):
        value = producer.inputs[0]
    return value


def _centered_statistic(x: ir.Value, reduce_node: ir.Node, facts) -> NotFusable | None:
    """The LayerNorm reason when the statistic is that of ``x - mean(x)`` (whatever it then divides), else None."""
    shape = facts.shape(x)
    rank = shape.rank() if shape is not None else None
    try:
        axis = trailing_axis(reduction_axes(reduce_node, facts), rank, reduce_node)
        _reject_centered(x, axis, rank, facts)
    except NotFusable as error:
        return error if "LayerNorm" in error.reason else None
    return None


def _reject_centered(x: ir.Value, axis: int, rank, facts) -> None:
    """x - mean(x) over the normalized axes feeding the square is a LayerNorm (left for LayerNorm fusion)."""
    producer = _strip_casts(x).producer()
    if producer is None or producer.op_type != "Sub" or producer.domain != "":
        return
    for operand, other in ((producer.inputs[0], producer.inputs[1]), (producer.inputs[1], producer.inputs[0])):
        mean = _strip_casts(other).producer()
        if (
            mean is None
            or mean.op_type not in ("ReduceMean", "GlobalAveragePool")
            or mean.domain != ""
            or _strip_casts(mean.inputs[0]) is not _strip_casts(operand)
        ):
            continue
        try:
            same_axes = trailing_axis(reduction_axes(mean, facts), rank, mean) == axis
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


def _fused_input(x: ir.Value, output: ir.Value, b: dict, facts) -> ir.Value:
    """The fused op's X. Its output has X's type, so X is the value of the output's type among the value the statistic
    is computed from and those before it through casts that change no value (the Hugging Face float16 -> float32
    pattern's exact up-cast, a no-op cast, or several: float16 converters add their own), the earliest first (a
    residual Add before the casts is then fused too)."""
    statistic = facts.dtype(b["reduced"])
    if statistic is None or facts.dtype(output) is None:
        raise NotFusable("element types unknown (shape inference found none here): cannot choose the fused op's types")
    if statistic not in NORM_DTYPES:
        raise NotFusable(
            f"the statistic is computed in {dtype_name(statistic)}: the fused ops take float32, float16, bfloat16"
        )
    out_dtype, x_dtype = facts.dtype(output), facts.dtype(x)
    candidates = [x]
    while is_cast(producer := candidates[0].producer()):
        source, cast = facts.dtype(producer.inputs[0]), facts.dtype(candidates[0])
        if source is None or not (source == cast or (source, cast) in EXACT_WIDENINGS) or len(candidates) > 8:
            break
        candidates.insert(0, producer.inputs[0])
    chosen = next((candidate for candidate in candidates if facts.dtype(candidate) == out_dtype), None)
    if chosen is None:
        origin = " or ".join(dict.fromkeys(dtype_name(facts.dtype(candidate)) for candidate in candidates))
        raise NotFusable(
            f"the output is {dtype_name(out_dtype)} but the input is {origin}: the fused op's output has its input's"
            " type"
        )
    rounded = b.get("norm_cast")
    if rounded is not None and rounded is not output and facts.dtype(rounded) not in (out_dtype, x_dtype):
        raise NotFusable(
            f"the normalized value is rounded to {dtype_name(facts.dtype(rounded))} before the scale, "
            f"but the output is {dtype_name(out_dtype)}"
        )
    if facts.dtype(chosen) not in NORM_DTYPES:
        raise NotFusable(f"{dtype_name(facts.dtype(chosen))} input: the fused ops take float32, float16, bfloat16")
    return chosen


# ---- reductions that no rule took ----------------------------------------------------------------------------------


def squared_operand(node: ir.Node, facts) -> ir.Value | None:
    """The value whose squares ``node`` reduces, or None when it reduces no square: ReduceL2 and ReduceSumSquare of
    x; ReduceSum, ReduceMean or GlobalAveragePool of ``Mul(x, x)`` or ``Pow(x, 2)``, possibly cast."""
    if node.domain not in ("", "ai.onnx") or not node.inputs or node.inputs[0] is None:
        return None
    if node.op_type in ("ReduceL2", "ReduceSumSquare"):
        return node.inputs[0]
    if node.op_type not in ("ReduceSum", "ReduceMean", "GlobalAveragePool"):
        return None
    square = _strip_casts(node.inputs[0]).producer()
    if square is None or square.domain not in ("", "ai.onnx") or len(square.inputs) != 2:
        return None
    if square.op_type == "Mul" and square.inputs[0] is square.inputs[1]:
        return square.inputs[0]
    if square.op_type == "Pow" and constant_scalar(square.inputs[1], facts) == 2:
        return square.inputs[0]
    return None


def unfused_reduction(node: ir.Node, x: ir.Value, facts) -> str:
    """Why a reduction of squares (a norm's statistic) that no rule met stays: a LayerNorm, a clamped norm, or a
    spelling the pass does not recognize, naming where its value goes."""
    centered = _centered_statistic(x, node, facts)
    if centered is not None:
        return centered.reason
    what = f"{node.op_type} {label(node)} of the squares of {label(x)}"
    followers, pending, seen = [], [node.outputs[0]], set()
    while pending:
        value = pending.pop()
        for user in value.consumers():
            if user in seen:
                continue
            seen.add(user)
            if user.op_type in ("Sqrt", "Cast", "CastLike", "Identity") and user.domain in ("", "ai.onnx"):
                pending.append(user.outputs[0])
            else:
                followers.append(user)
    clamps = [user for user in followers if user.op_type in ("Max", "Clip") and user.domain in ("", "ai.onnx")]
    if clamps:
        return (f"{what} is clamped by {clamps[0].op_type} {label(clamps[0])} (max(norm, eps), as torch's "
                "F.normalize and tf.math.l2_normalize write it): a clamp, not an additive epsilon; the fused ops add "
                "epsilon")
    if not followers:
        return f"{what}: its value is a graph output or unused, no division by the rms follows"
    goes_to = ", ".join(f"{user.op_type} {label(user)}" for user in followers[:3])
    return f"{what}: no norm of a spelling the pass recognizes follows (its value goes to {goes_to})"
