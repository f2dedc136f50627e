"""The patterns of an RMSNorm subgraph, composed from the spellings exporters use.

A norm's subgraph ends in one of these ways; the last node names the form, and each form is the pattern of one rule:

==================  ==================================================  =====
form                last node                                           phase
==================  ==================================================  =====
``factor_cast``     ``Cast(Mul(x, factor'))`` (either order)            0
``scale_cast``      ``Cast(Mul(normalized', scale))`` (either order)    0
``factor``          ``Mul(x, factor')`` (either order)                  1
``scale``           ``Mul(normalized', scale)`` (either order)          1
``cast``            ``Cast(normalized)``                                2
``div`` / ``mul``   ``normalized`` itself (``x / rms``, ``x * inv``)    3
==================  ==================================================  =====

(``normalized'`` is ``normalized`` or ``Cast(normalized)``; ``factor'`` is ``factor = Mul(inverse, scale)`` (either
order) or ``Cast(factor)``: the factor-times-scale form ``x * (inverse * scale)``, which TensorFlow's graph optimizer
makes of ``x * inverse * scale`` when the scale is a constant; each Cast may be a ``CastLike``, whose forms are
``factor_castlike``, ``scale_castlike`` and ``castlike``.) A larger form contains the smaller ones, so the rules are
applied in phases, the largest form first over the whole model (see ``_phases``): a norm is fused as far as it goes,
and where a larger form's check fails (a scale that varies along batch axes, a cast that changes the output type), a
smaller one fuses in a later phase and the report says what was left out. A factor form has no smaller form: the
scale is multiplied in before x, so the norm is fused with it or not at all.
"""

from __future__ import annotations

from onnxscript.rewriter import pattern

DIVISIONS = ("div", "mul", "mul_swapped")
"""The division forms: ``x / rms``, ``x * inverse``, ``inverse * x``."""
FACTORS = ("factor_cast", "factor_castlike", "factor", "factor_swapped")
"""The factor-times-scale forms: ``x * (inverse * scale)``, cast after or not, either operand order."""
FORMS = {
    # The factor forms come first in their phases: a rule of a phase that declines a candidate leaves it to the next
    # rule at the same node, and ``Mul(x, Mul(inverse, w))`` also looks like the scale form ``Mul(scale, normalized)``
    # with x as the scale (whose check then stays silent, see ``_norm_fusion``).
    "factor_cast": 0,
    "factor_castlike": 0,
    "scale_cast": 0,
    "scale_castlike": 0,
    "factor": 1,
    "factor_swapped": 1,
    "scale": 1,
    "scale_swapped": 1,
    "cast": 2,
    "castlike": 2,
    **{form: 3 for form in DIVISIONS},
}
"""Each form's phase: forms of a lower phase contain those of a higher one."""


def mean_square(op, x):
    """mean(x²) over some axes: ReduceMean(x²) or ReduceSum(x²) / count or ReduceSumSquare(x) * (1/count), or
    GlobalAveragePool(x²) (tf2onnx's spelling of a mean over every axis after the second), with x² spelled Pow(x, 2)
    or Mul(x, x), possibly cast once or twice. Axes, exponent, count and casts are checked later."""
    axes = pattern.Var("axes", can_match_none=True)
    square = pattern.OrValue([op.Pow(x, pattern.Var("exponent")), op.Mul(x, x)])
    # A float16 converter that keeps Pow and ReduceMean in float32 rounds the squares between them to float16.
    square = _maybe_cast(op, _maybe_cast(op, square, "sq_cast"), "sq_cast2")
    total = pattern.OrValue(
        [op.ReduceSum(square, axes, _outputs=["reduced"]), op.ReduceSumSquare(x, axes, _outputs=["reduced"])]
    )
    count = pattern.Var("count")
    # The sum itself last: the L2 family (``tf.norm``, ``x * rsqrt(sum(x²) + eps)``), d times the mean square.
    return pattern.OrValue(
        [
            op.ReduceMean(square, axes, _outputs=["reduced"]),
            op.GlobalAveragePool(square, _outputs=["reduced"]),
            op.Div(total, count),
            op.Mul(total, count),
            op.Mul(count, total),
            total,
        ],
        name="mean_square",
    )


def rms_and_inverse(op, mean_square, x):
    """rms = sqrt(ms + eps) | sqrt(ms) + eps | sqrt(ms), and its inverse 1/rms spelled Reciprocal(rms), Div(1, rms)
    or Pow(ms + eps, -0.5). Epsilon may be either operand of its Add. Each stage of the statistic may be cast (a
    float16 model whose norm ops a converter kept in float32 casts between them): ``ms_cast``, ``eps_cast``,
    ``rms_cast``, ``inv_cast``, checked later.

    The L2 family: ``sqrt(ms)`` may be ``ReduceL2(x)`` (the root of a sum), and the root of a sum may be scaled to
    the rms, ``root / c`` or ``root * c`` (``root_count``: sqrt(d) or 1/sqrt(d), checked later), as
    ``x / (tf.norm(x, -1) / sqrt(d) [+ eps])`` is written."""
    epsilon = pattern.Var("epsilon")
    ms = _maybe_cast(op, mean_square, "ms_cast")
    with_eps = pattern.OrValue([op.Add(ms, epsilon), op.Add(epsilon, ms)], name="ms_eps")
    root = pattern.OrValue(
        [op.Sqrt(ms), op.ReduceL2(x, pattern.Var("axes", can_match_none=True), _outputs=["reduced"])], name="root"
    )
    root_count = pattern.Var("root_count")
    sqrt_ms = pattern.OrValue(
        [op.Div(root, root_count), op.Mul(root, root_count), op.Mul(root_count, root), root], name="sqrt_ms"
    )
    rms = pattern.OrValue(
        [op.Sqrt(_maybe_cast(op, with_eps, "eps_cast")), op.Add(sqrt_ms, epsilon), op.Add(epsilon, sqrt_ms), sqrt_ms],
        name="rms",
    )
    rms = _maybe_cast(op, rms, "rms_cast")
    inverse = pattern.OrValue(
        [
            op.Reciprocal(rms),
            op.Div(pattern.Var("one"), rms),
            op.Pow(pattern.OrValue([with_eps, ms]), pattern.Var("minus_half")),
        ],
        name="inverse",
    )
    return rms, _maybe_cast(op, inverse, "inv_cast")


STATISTIC_CASTS = ("sq_cast", "sq_cast2", "ms_cast", "eps_cast", "rms_cast", "inv_cast")
"""The bindings of the casts a statistic may pass through (see :func:`rms_and_inverse`)."""
QUANTIZED = {
    "sq_cast_qdq": "the squares",
    "sq_cast2_qdq": "the squares",
    "ms_cast_qdq": "the mean square",
    "eps_cast_qdq": "ms + eps",
    "rms_cast_qdq": "the rms",
    "inv_cast_qdq": "the inverse rms",
    "norm_qdq": "the normalized value",
}
"""The bindings of Q/DQ pairs inside a norm, and what each rounds to int8."""


def cast(op, value, name: str):
    """``value`` cast to another type: by ``Cast(to=...)`` or by ``CastLike(value, like)`` (the dynamo exporter's
    ``type_as``), bound as ``name``."""
    return pattern.OrValue(
        [op.Cast(value, _outputs=[name]), op.CastLike(value, pattern.Var(f"{name}_like"), _outputs=[name])]
    )


def quantized(op, value, name: str):
    """``value`` through a QuantizeLinear/DequantizeLinear pair (an int8 QDQ model), bound as ``name``."""
    q = op.QuantizeLinear(value, pattern.Var(f"{name}_scale"), pattern.Var(f"{name}_zero", can_match_none=True))
    return op.DequantizeLinear(
        q, pattern.Var(f"{name}_dscale"), pattern.Var(f"{name}_dzero", can_match_none=True), _outputs=[name]
    )


def _maybe_cast(op, value, name: str):
    """``value``, cast, or through a Q/DQ pair (``<name>_qdq``: a match the check refuses, so that it is reported)."""
    return pattern.OrValue([value, cast(op, value, name), quantized(op, value, f"{name}_qdq")])


def divided(op, form, numerator, rms, inverse, **outputs):
    """``numerator`` divided by the rms as ``form`` spells it: x / rms, x * inverse or inverse * x."""
    if form == "div":
        return op.Div(numerator, rms, **outputs)
    return op.Mul(numerator, inverse, **outputs) if form == "mul" else op.Mul(inverse, numerator, **outputs)


def normalized(op, x, rms, inverse):
    """The value divided by the rms: x itself or, tried after that, any numerator ``x_num``, which the check accepts
    only as the same values as x (TorchScript's second Cast of x's source, or the float16 x whose exact float32 cast
    the statistic is computed from).

    The alternatives with x itself come first: the matcher backtracks over whole alternatives only, so a free
    numerator tried first would let ``Mul(x_num, inverse)`` take a Mul whose other operand merely looks like an inverse
    (a LayerNorm's ``(x - mean) / std`` as ``Div(one, rms)``) and stop there, never trying the real ``inverse * x``."""
    choices = [divided(op, form, x, rms, inverse) for form in DIVISIONS]
    choices += [divided(op, form, pattern.Var("x_num"), rms, inverse) for form in DIVISIONS]
    return pattern.OrValue(choices, name="normalized")


def factor(op, inverse, scale):
    """The factor-times-scale form's factor: ``inverse * scale`` (either order), bound as ``factor``, and possibly
    cast (``factor_cast``)."""
    product = pattern.OrValue(
        [op.Mul(inverse, scale, _outputs=["factor"]), op.Mul(scale, inverse, _outputs=["factor"])], name="factor_mul"
    )
    return pattern.OrValue([product, cast(op, product, "factor_cast")])
