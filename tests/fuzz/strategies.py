"""Hypothesis strategies for fusion-fuzz plans, drawn block by block from the stream's shape and type at that point.

Every choice is drawn so that a block is what its ``kind`` says: a true RMSNorm only where every step is a spelling
docs/fusion.md lists (e.g. ReduceSum only over static dims, keepdims=0 only when every other dim is 1), a near miss
with exactly one thing wrong. The first element of each list is the simplest, so that failures shrink towards it.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
from hypothesis import strategies as st

from fusion.norm_graphs import Spelling
from fuzz.graphs import (
    FLOAT32,
    NEAR_MISS_REASONS,
    Builder,
    Call,
    Case,
    IfElse,
    Norm,
    Op,
    Parallel,
    Plan,
    Residual,
    SideChain,
    Value,
    can_reshape,
    run_shape,
)

SQUARES = ("pow", "mul", "pow_int", "pow_1elem")
MEANS = ("mean", "sum_div", "sum_mul", "sumsq_div", "sumsq_mul")
SUMS = MEANS[1:]
EPS = ("add", "add_swapped", "constant_node", "castlike", "outside", "none")
EPS_FORMS = ("spelled", "ones1", "ones2", "cast")  # other spellings of a constant epsilon inside the sqrt
INVERSES = ("reciprocal", "div", "reciprocal_swapped", "div_one", "pow_half")
EPSILONS = (0.0625, 1e-5, 1e-6, 1e-2, 0.25, 1.0)
SCALES = ("tensor", "none", "one_plus", "cast", "one_plus_runtime")
DIMS = ("B", "S", 1, 2, 3, "T", 4)
HIDDEN = (8, 4, 16, 6)
# Static shapes for side chains: keepdims=0 fuses where every other dim is 1, and is a near miss (that still runs:
# the statistic broadcasts back onto the input) on square shapes.
SIDE_SHAPES = ((1, 8), (8, 8), (1, 1, 6), (1, 8, 8), (4, 4, 4), (2, 3, 8))

# Scopes: "main" (the main chain), "side" (a side chain: main graph, shape-preserving), "branch" (an If branch) and
# "function" (a function body): the last three keep the stream's shape and type.
PRESERVING = ("side", "branch", "function")


def _inputs_visible(scope: str) -> bool:
    return scope != "function"


def _outputs_allowed(scope: str) -> bool:
    return scope in ("main", "side")


# ---- norms -------------------------------------------------------------------------------------------------------


def _static(dims) -> bool:
    return all(isinstance(dim, int) for dim in dims)


def _broadcasts_onto(small: tuple, shape: tuple) -> bool:
    try:
        return np.broadcast_shapes(small, shape) == shape
    except ValueError:
        return False


def _normalized_counts(kind: str, shape: tuple) -> list[int]:
    """The numbers of trailing axes a norm of ``kind`` can normalize on ``shape``."""
    rank = len(shape)
    counts = list(range(1, rank + 1))
    if kind == "keepdims0":
        return [
            k
            for k in counts
            if _static(shape)
            and any(dim != 1 for dim in shape[: rank - k])
            and _broadcasts_onto(shape[: rank - k], shape)
        ]
    if kind == "scale_varies":
        return [k for k in counts if any(isinstance(dim, int) and dim > 1 for dim in shape[: rank - k])]
    if kind == "wrong_count":
        return [k for k in counts if _static(shape[rank - k :])]
    if kind == "sum_not_static":
        return [k for k in counts if not _static(shape[rank - k :])]
    return counts


def feasible_kinds(shape: tuple, scope: str) -> list[str]:
    kinds = ["rms", "layernorm", "centered_other", *NEAR_MISS_REASONS]
    kinds = list(dict.fromkeys(kinds))
    if not _inputs_visible(scope):
        kinds.remove("eps_input")
    if not _outputs_allowed(scope):
        kinds.remove("side_use")
    return [kind for kind in kinds if _normalized_counts(kind, shape)]


@st.composite
def _spelled_axes(draw, axes, rank: int) -> tuple:
    """``axes`` in any order, each written positive or negative."""
    order = draw(st.permutations(sorted(axes)))
    return tuple(axis if draw(st.booleans()) else axis - rank for axis in order)


@st.composite
def _scale_shape(draw, shape: tuple, k: int) -> tuple:
    """A shape that broadcasts onto the normalized dims alone: right-aligned, each dim the normalized dim (static
    ones only: a constant cannot match a symbolic dim) or 1, leading normalized dims possibly left out, leading ones
    possibly added (never more dims than the input)."""
    rank = len(shape)
    normalized = shape[rank - k :]
    dims = tuple(dim if isinstance(dim, int) and draw(st.booleans()) else 1 for dim in normalized)
    dropped = draw(st.integers(0, k))
    if dropped:
        return dims[dropped:]
    return (1,) * draw(st.integers(0, rank - k)) + dims


@st.composite
def norms(draw, value: Value, scope: str) -> Norm:
    shape, rank = value.shape, len(value.shape)
    feasible = feasible_kinds(shape, scope)
    # Side chains are where keepdims=0 can be generated (static shapes): favour it there.
    favoured = ["keepdims0"] * 8 if scope == "side" and "keepdims0" in feasible else []
    kind = draw(st.sampled_from(["rms"] * 3 + favoured + feasible))
    k = draw(st.sampled_from(_normalized_counts(kind, shape)))
    trailing = range(rank - k, rank)
    static_normalized = _static(shape[rank - k :])
    eps = draw(st.sampled_from(EPS))
    others_are_ones = _static(shape[: rank - k]) and all(dim == 1 for dim in shape[: rank - k])
    spelling = Spelling(
        square=draw(st.sampled_from(SQUARES)),
        mean=draw(st.sampled_from(MEANS if static_normalized else MEANS[:1])),
        axes=draw(_spelled_axes(trailing, rank)),
        keepdims=draw(st.sampled_from(("default", "explicit", "zero")[: 3 if others_are_ones else 2])),
        eps=eps,
        inverse=draw(st.sampled_from(INVERSES if eps != "outside" else INVERSES[:-1])),
        epsilon=draw(st.sampled_from(EPSILONS)),
    )
    upcast = draw(st.booleans())
    cast_back = True
    if upcast and not (scope in PRESERVING and value.dtype != FLOAT32):
        cast_back = draw(st.booleans())
    norm = Norm(
        kind=kind,
        spelling=spelling,
        upcast=upcast,
        separate_casts=upcast and draw(st.booleans()),
        cast_back=cast_back,
        scale=draw(st.sampled_from(SCALES if _inputs_visible(scope) else SCALES[:-1])),
        scale_shape=draw(_scale_shape(shape, k)),
        gemma=upcast and cast_back and draw(st.booleans()),
        island=draw(st.sampled_from((None, "float16", "bfloat16"))) if value.dtype == FLOAT32 else None,
        eps_form=draw(st.sampled_from(EPS_FORMS)) if eps in ("add", "add_swapped") else "spelled",
        commute=draw(st.integers(0, 255)),
    )
    return draw(_near_miss(norm, shape, k, value.is_input))


def _replace(norm: Norm, **changes) -> Norm:
    """``norm`` with fields of itself or of its spelling changed."""
    spelling_changes = {key: changes.pop(key) for key in list(changes) if key not in Norm.__dataclass_fields__}
    return dataclasses.replace(norm, spelling=dataclasses.replace(norm.spelling, **spelling_changes), **changes)


@st.composite
def _near_miss(draw, norm: Norm, shape: tuple, k: int, reads_input: bool) -> Norm:
    """Makes ``norm`` what its kind says, changing one thing (or adding the centering).

    The mean of x³ cancels: a couple of ulps of difference in x (from a norm fused before) can change it by any
    amount, so exponent 3 is only generated on graph inputs."""
    rank, kind, s = len(shape), norm.kind, norm.spelling
    if kind == "exponent":
        return _replace(
            norm,
            square=draw(st.sampled_from(("pow", "pow_int", "pow_1elem"))),
            mean="mean" if s.mean.startswith("sumsq") else s.mean,
            exponent=draw(st.sampled_from((4.0, 3.0) if reads_input else (4.0,))),
        )
    if kind == "keepdims0":
        return _replace(norm, keepdims="zero")
    if kind == "eps_input":
        return _replace(norm, eps="add", eps_form="graph_input")
    if kind == "eps_negative":
        return _replace(norm, eps="add" if s.eps == "none" else s.eps, epsilon=-1e-3)
    if kind == "scale_varies":
        axis = draw(st.sampled_from([a for a in range(rank - k) if isinstance(shape[a], int) and shape[a] > 1]))
        normalized = tuple(dim if isinstance(dim, int) else 1 for dim in shape[rank - k :])
        scale_shape = (shape[axis],) + (1,) * (rank - k - 1 - axis) + normalized
        return _replace(norm, scale="tensor" if norm.scale == "none" else norm.scale, scale_shape=scale_shape)
    if kind == "side_use":
        return _replace(norm, side_use=(draw(st.integers(0, 15)), draw(st.sampled_from(("node", "output")))))
    if kind == "wrong_count":
        count = int(np.prod(run_shape(shape[rank - k :])))
        return _replace(norm, mean=draw(st.sampled_from(SUMS)), divisor=float(2 * count))
    if kind == "numerator":
        return _replace(norm, inverse="div_one", numerator=draw(st.sampled_from((2.0, 0.5))))
    if kind == "inverse_exponent":
        return _replace(
            norm,
            inverse="pow_half",
            eps="add" if s.eps == "outside" else s.eps,
            inverse_exponent=draw(st.sampled_from((-0.25, -1.0))),
        )
    if kind == "non_trailing":
        trailing_sets = {frozenset(range(rank - j, rank)) for j in range(1, rank + 1)}
        subsets = [
            subset
            for size in range(1, rank + 1)
            for subset in itertools.combinations(range(rank), size)
            if frozenset(subset) not in trailing_sets
        ]
        axes = draw(_spelled_axes(draw(st.sampled_from(subsets)), rank))
        last = shape[-1] if isinstance(shape[-1], int) else 1
        keepdims = "default" if s.keepdims == "zero" else s.keepdims
        return _replace(norm, axes=axes, keepdims=keepdims, scale_shape=(last,))
    if kind == "sum_not_static":
        return _replace(norm, mean=draw(st.sampled_from(SUMS)))
    if kind in ("layernorm", "centered_other"):
        trailing = frozenset(range(rank - k, rank))
        if kind == "layernorm":
            center = trailing
        else:
            others = [
                frozenset(subset)
                for size in range(1, rank + 1)
                for subset in itertools.combinations(range(rank), size)
                if frozenset(subset) != trailing
            ]
            center = draw(st.sampled_from(others))
        return _replace(
            norm, center_axes=draw(_spelled_axes(center, rank)), separate_casts=False, bias=draw(st.booleans())
        )
    return norm


# ---- other blocks ------------------------------------------------------------------------------------------------


@st.composite
def residuals(draw, scope: str) -> Residual:
    operands = ("earlier", "input", "bias") if _inputs_visible(scope) else ("earlier", "bias")
    return Residual(
        operand=draw(st.sampled_from(operands)),
        index=draw(st.integers(0, 7)),
        expose=_outputs_allowed(scope) and draw(st.booleans()),
        commute=draw(st.integers(0, 1)),
    )


@st.composite
def ops(draw, value: Value, scope: str) -> Op:
    choices = ["gelu_sigmoid", "gelu_tanh", "gelu_erf"]
    if isinstance(value.shape[-1], int):
        choices += ["matmul", "swiglu"]
    if scope not in PRESERVING:
        choices.append("transpose")
        if can_reshape(value.shape):
            choices.append("reshape")
    op = draw(st.sampled_from(choices))
    param = 0 if op == "matmul" and scope in PRESERVING else draw(st.integers(0, 30))  # a square MatMul keeps the shape
    return Op(op, param)


@st.composite
def chains(draw, value: Value, scope: str, min_size: int, max_size: int) -> tuple:
    """Shape- and type-preserving blocks (branch, function body, side chain): drawn from one state."""
    size = draw(st.integers(min_size, max_size))
    computed = dataclasses.replace(value, is_input=False)  # what the blocks after the first read
    return tuple(draw(blocks(value if index == 0 else computed, scope)) for index in range(size))


@st.composite
def blocks(draw, value: Value, scope: str):
    kinds = ["norm", "norm", "norm", "residual", "op", "parallel"]
    if scope == "main":
        kinds += ["if", "call", "side"]
    kind = draw(st.sampled_from(kinds))
    if kind == "norm":
        return draw(norms(value, scope))
    if kind == "parallel":  # both norms keep the stream's type, so that their sum is one
        inner = scope if scope in PRESERVING else "side"
        return Parallel(draw(norms(value, inner)), draw(norms(value, inner)), draw(st.integers(0, 1)))
    if kind == "residual":
        return draw(residuals(scope))
    if kind == "op":
        return draw(ops(value, scope))
    if kind == "if":
        return IfElse(draw(chains(value, "branch", 0, 2)), draw(chains(value, "branch", 0, 2)))
    if kind == "call":
        return Call(draw(chains(value, "function", 1, 2)), draw(st.integers(1, 2)))
    shape = draw(st.sampled_from(SIDE_SHAPES))
    return SideChain(shape, draw(chains(Value("", value.dtype, shape, is_input=True), "side", 1, 2)))


@st.composite
def stream_shapes(draw) -> tuple:
    rank = draw(st.integers(2, 4))
    return tuple(draw(st.sampled_from(DIMS)) for _ in range(rank - 1)) + (draw(st.sampled_from(HIDDEN)),)


@st.composite
def cases(draw, max_blocks: int = 6) -> Case:
    """A random model (see fuzz.graphs) with its inputs and ground truth."""
    plan = Plan(
        dtype=draw(st.sampled_from(("float32", "float16", "bfloat16"))),
        opset=draw(st.sampled_from((18, 17, 23))),
        shape=draw(stream_shapes()),
        seed=draw(st.integers(0, 2**16)),
        shared_constants=draw(st.booleans()),
    )
    builder = Builder(plan)
    for _ in range(draw(st.integers(1, max_blocks))):
        builder.append(draw(blocks(builder.stream, "main")))
    return builder.finish()
