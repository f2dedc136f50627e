"""Norm ops already in the model -> the target's: an exporter's opset-23 ``RMSNormalization``, onnxruntime's
``SimplifiedLayerNormalization``, our ``RMSNorm`` -> the target's norm op, and the residual ops (onnxruntime's
``SkipSimplifiedLayerNormalization``, our ``SkipRMSNorm``) -> the target's way of writing them, where that computes
the same thing."""

from __future__ import annotations

from typing import Callable

import onnx_ir as ir
from onnxscript.rewriter import pattern

from ort_rmsnorm.contract import (
    AXIS,
    DEFAULT_EPSILON,
    EPS_INSIDE,
    EPS_OUTSIDE,
    EPS_OUTSIDE_SQRT,
    EPSILON,
    NORMALIZE_FLOAT32_SUM,
    ONNX_RMSNORM,
    ONNX_RMSNORM_OPSET,
    OP_DOMAIN,
    ORT_SKIP_DEFAULT_EPSILON,
    OURS_RMSNORM,
    OURS_SKIP_RMSNORM,
    RMSNORM,
    SKIP_RMSNORM,
    qualified,
    unqualified,
)
from ort_rmsnorm.model.graphs import nodes

from ._emit import default_opset
from ._facts import (
    NORM_DTYPES,
    NotFusable,
    check_epsilon,
    check_scale_shape,
    dtype_name,
    float_attribute,
    format_shape,
    int_attribute,
    label,
    proven_shape,
    require_stash_float32,
    same_shape,
)
from ._naming import node_path
from ._rule_base import FusionRule, NormRule
from ._scales import scale_spec
from ._session import FusionSession
from ._specs import NormSpec, SkipSpec


class BrokenContract(ValueError):
    """A node of our ops that breaks their contract (docs/ops.md): onnxruntime with the library refuses it, so no
    target may turn it into a graph that runs."""


def declared_dtype(value: ir.Value) -> ir.DataType | None:
    """A value's type as the model states it (graph inputs, initializers, value infos), without inference."""
    if value.dtype is not None:
        return value.dtype
    return value.const_value.dtype if value.const_value is not None else None


def check_our_ops(model: ir.Model, dtype: Callable[[ir.Value], ir.DataType | None]) -> None:
    """Raises :class:`BrokenContract`, naming the node and what is wrong, for the first ``RMSNorm`` or
    ``SkipRMSNorm`` anywhere in ``model`` that breaks the contract where its attributes or known types show it: a
    flag other than 0 or 1, an attribute of the wrong kind, an epsilon not finite and >= 0, ``normalize_float32_sum``
    on ``RMSNorm``, X of a type the ops do not take, a scale neither X's type nor float32, a skip or bias not of X's
    type (the types as ``dtype`` gives them). A target that converts our ops checks them first: converting such a
    node would give it a meaning."""
    for node in nodes(model):
        if node.domain != OP_DOMAIN or node.op_type not in (RMSNORM, SKIP_RMSNORM):
            continue
        problem = _contract_problem(node, dtype)
        if problem is not None:
            raise BrokenContract(f"{qualified(node.domain, node.op_type)} {label(node)}: {problem}; onnxruntime "
                                 "with the library refuses such a node, so it is not converted (docs/ops.md)")


def _contract_problem(node: ir.Node, dtype: Callable[[ir.Value], ir.DataType | None]) -> str | None:
    skip = node.op_type == SKIP_RMSNORM
    flags = (EPS_OUTSIDE_SQRT, NORMALIZE_FLOAT32_SUM) if skip else (EPS_OUTSIDE_SQRT,)
    if not skip and NORMALIZE_FLOAT32_SUM in node.attributes:
        return f"attribute '{NORMALIZE_FLOAT32_SUM}' is {SKIP_RMSNORM}'s; {RMSNORM} has none"
    for name in flags:
        if name in node.attributes and int_attribute(node, name) not in (0, 1):
            value = node.attributes[name].value
            return f"attribute '{name}' is {value!r}, where the op takes 0 or 1"
    if AXIS in node.attributes and int_attribute(node, AXIS) is None:
        return f"attribute '{AXIS}' is not an int"
    epsilon = float_attribute(node, EPSILON, DEFAULT_EPSILON)
    if epsilon is None:
        return f"attribute '{EPSILON}' is not a float"
    try:
        check_epsilon(epsilon, "", node)
    except NotFusable as error:
        return f"attribute '{EPSILON}': {error.reason}"
    inputs = list(node.inputs)
    x = inputs[0] if inputs else None
    x_dtype = dtype(x) if x is not None else None
    if x_dtype is None:
        return None  # nothing more is known
    if x_dtype not in NORM_DTYPES:
        return f"X is {dtype_name(x_dtype)}, where the ops take float32, float16, bfloat16"
    scale_index, bias_index = (2, 3) if skip else (1, None)

    def dtype_of(index: int | None) -> ir.DataType | None:
        value = inputs[index] if index is not None and index < len(inputs) else None
        return dtype(value) if value is not None else None

    if skip and dtype_of(1) not in (None, x_dtype):
        return f"skip is {dtype_name(dtype_of(1))} and X {dtype_name(x_dtype)}, where skip has X's type"
    if dtype_of(scale_index) not in (None, x_dtype, ir.DataType.FLOAT):
        return (f"scale is {dtype_name(dtype_of(scale_index))} and X {dtype_name(x_dtype)}, where the scale has X's "
                "type or float32")
    if dtype_of(bias_index) not in (None, x_dtype):
        return f"bias is {dtype_name(dtype_of(bias_index))} and X {dtype_name(x_dtype)}, where the bias has X's type"
    return None


class NormOpConversion(NormRule):
    """A single-output norm op already in the model (one of ``contract.NORM_OPS``: all three define ``axis`` alike,
    dims ``[axis, rank)`` normalized, and broadcast the scale onto those dims; the two standard ones put epsilon
    inside the sqrt and give Y the scale's type) -> the target's norm op, where that computes the same thing. The
    residual Add before it is then fused by SkipFusion as for any other norm."""

    def __init__(self, source: str, session: FusionSession) -> None:
        super().__init__(f"Convert[{source}]", session)
        self._domain, self._op_type = unqualified(source)
        self.converted_from = source

    def root(self, bindings):
        return bindings["normed"].producer()

    def pattern(self, op, x):
        scale = pattern.Var("scale", can_match_none=True)
        return getattr(op, self._op_type)(x, scale, _domain=self._domain, _outputs=["normed"])

    def check(self, context, x, normed, scale=None, **_):
        node = normed.producer()
        analyze = lambda: self._analyze(context, node, x, scale)  # noqa: E731
        return self._adapted(context, {"normed": normed}, analyze, anchor=node)

    def _analyze(self, context, node: ir.Node, x: ir.Value, scale: ir.Value | None) -> NormSpec:
        facts = self._session.facts
        what = f"{self.converted_from} {label(node)}"
        if any(value.uses() or value.is_graph_output() for value in node.outputs[1:]):
            raise NotFusable(f"{what}: its inv_std_var output is in use (the fused ops have none)", node)
        x_dtype = facts.dtype(x)
        if x_dtype not in NORM_DTYPES:
            raise NotFusable(
                f"{what}: {dtype_name(x_dtype)} input; the fused ops take float32, float16, bfloat16", node
            )
        if self._domain == OP_DOMAIN:
            placement = EPS_OUTSIDE if int_attribute(node, EPS_OUTSIDE_SQRT, 0) else EPS_INSIDE
        else:
            opset = default_opset(context.graph_or_function, context.model)
            if self._op_type == ONNX_RMSNORM and opset < ONNX_RMSNORM_OPSET:
                raise NotFusable(
                    f"{what} at default opset {opset}: the op exists from opset {ONNX_RMSNORM_OPSET}", node
                )
            require_stash_float32(node, what)
            y_dtype = facts.dtype(scale) if scale is not None else None
            if y_dtype != x_dtype:
                raise NotFusable(
                    f"{what} gives Y its scale's type ({dtype_name(y_dtype)}) and X is {dtype_name(x_dtype)}: the "
                    "fused ops give Y X's type",
                    node,
                )
            placement = EPS_INSIDE
        epsilon = float_attribute(node, EPSILON, DEFAULT_EPSILON)
        if epsilon is None:
            raise NotFusable(f"{what}: the epsilon attribute is not a float", node)
        check_epsilon(epsilon, f"{what}: ", node)
        x_shape = facts.shape(x)
        axis = _normalized_axis(node, what, x_shape.rank() if x_shape is not None else None)
        if scale is not None:  # what the scale must match: the dims the graph proves (inference may not know them)
            x_shape = proven_shape(x, x_shape, -axis, facts)
        return NormSpec(x, x_dtype, x_shape, axis, epsilon, placement, scale_spec(scale, x_shape, -axis, facts))


def _normalized_axis(node: ir.Node, what: str, rank: int | None) -> int:
    """The node's ``axis`` as the fused op's (negative: -k normalizes the last k dims)."""
    axis = int_attribute(node, AXIS, -1)
    if axis is None:
        raise NotFusable(f"{what}: the axis attribute is not an int", node)
    if rank is None:
        if axis >= 0:
            raise NotFusable(f"{what}: rank unknown, so axis {axis} names no known number of trailing dims", node)
        return axis
    if not -rank <= axis < rank:
        raise NotFusable(f"{what}: axis {axis} is out of range for rank {rank}", node)
    return axis - rank if axis >= 0 else axis


class SkipOpConversion(FusionRule):
    """A residual norm op already in the model -> the target's way of writing it (``Target.adapt_skip``), where that
    computes the same thing: ours, ``SkipRMSNorm(X, skip, scale?, bias?) -> (Y, sum?)``, or onnxruntime's
    ``com.microsoft.SkipSimplifiedLayerNormalization(input, skip, gamma, bias?) -> (output, mean, inv_std_var,
    input_skip_bias_sum)`` (onnxruntime-genai's model builder, the transformer optimizer and Olive write it).

    Both compute ``s = input + skip (+ bias)`` in float32 and give ``sum`` as ``round_T(s)``; onnxruntime's
    normalizes the last axis of ``s`` before rounding it (for 16-bit types; ours does with
    ``normalize_float32_sum=1``). The sum is the op's last output or absent: one rule instance for each."""

    def __init__(self, source: str, session: FusionSession, with_sum: bool) -> None:
        super().__init__(f"Convert[{source}]", session)
        self._source = source
        self._domain, self._op_type = unqualified(source)
        self._ours = source == OURS_SKIP_RMSNORM
        self._with_sum = with_sum

    def root(self, bindings):
        return bindings["normed"].producer()

    def _sum_index(self) -> int:
        return 1 if self._ours else 3

    def pattern(self, op, x, skip):
        gamma = pattern.Var("gamma", can_match_none=self._ours)
        bias = pattern.Var("bias", can_match_none=True)
        skip_norm = getattr(op, self._op_type)
        if not self._with_sum:
            return skip_norm(x, skip, gamma, bias, _domain=self._domain, _outputs=["normed"])
        names = ["normed", "total"] if self._ours else ["normed", "mean", "inv_std_var", "total"]
        outputs = skip_norm(x, skip, gamma, bias, _domain=self._domain, _outputs=names)
        return outputs[0], outputs[-1]

    def check(self, context, x, skip, normed, gamma=None, bias=None, **_):
        node = normed.producer()
        index = self._sum_index()
        has_sum = len(node.outputs) > index and bool(node.outputs[index].uses() or node.outputs[index].is_graph_output())
        if self._with_sum != has_sum:
            # Each node is the other instance's (onnxscript's matcher of several outputs can also bind a node that
            # lacks the later ones).
            return pattern.MatchResult().fail("the sum output is the other rule's")
        session = self._session
        try:
            spec = self._analyze(node, x, skip, gamma, bias)
            spec = session.target.adapt_skip(spec, context.graph_or_function, context.model, session.facts)
        except NotFusable as error:
            return self._decline(context, error, node)
        if spec.norm.op == self._source:
            return self._keep(self._source, node)
        return self._accept({"normed": normed}, (spec, context))

    def _analyze(self, node: ir.Node, x: ir.Value, skip: ir.Value, gamma: ir.Value | None,
                 bias: ir.Value | None) -> SkipSpec:
        facts = self._session.facts
        what = f"{self._source} {label(node)}"
        if not self._ours and any(value.uses() or value.is_graph_output() for value in node.outputs[1:3]):
            raise NotFusable(f"{what}: its mean or inv_std_var output is in use (the fused ops have none)", node)
        x_dtype = facts.dtype(x)
        if x_dtype not in NORM_DTYPES:
            raise NotFusable(
                f"{what}: {dtype_name(x_dtype)} input; the fused ops take float32, float16, bfloat16", node
            )
        x_shape = facts.shape(x)
        if self._ours:
            # The op checks at run time that skip has X's shape and that scale and bias broadcast onto the
            # normalized dims without enlarging X: as the Adds and Muls other targets write them.
            axis = _normalized_axis(node, what, x_shape.rank() if x_shape is not None else None)
            placement = EPS_OUTSIDE if int_attribute(node, EPS_OUTSIDE_SQRT, 0) else EPS_INSIDE
            epsilon = float_attribute(node, EPSILON, DEFAULT_EPSILON)
            float32_sum = bool(int_attribute(node, NORMALIZE_FLOAT32_SUM, 0)) or x_dtype == ir.DataType.FLOAT
        else:
            skip_shape = facts.shape(skip)
            if not same_shape(x_shape, skip_shape):
                raise NotFusable(
                    f"{what}: skip of shape {format_shape(skip_shape)} on input {format_shape(x_shape)} is not known "
                    "to have the input's shape (SkipRMSNorm's skip has X's shape)",
                    node,
                )
            if bias is not None:
                check_scale_shape(facts.shape(bias), x_shape, 1, node)
                if facts.dtype(bias) != x_dtype:
                    raise NotFusable(
                        f"{what}: bias of type {dtype_name(facts.dtype(bias))} on a {dtype_name(x_dtype)} input", node
                    )
            axis, placement, float32_sum = -1, EPS_INSIDE, True
            epsilon = float_attribute(node, EPSILON, ORT_SKIP_DEFAULT_EPSILON)
        if epsilon is None:
            raise NotFusable(f"{what}: the epsilon attribute is not a float", node)
        check_epsilon(epsilon, f"{what}: ", node)
        if gamma is not None:
            x_shape = proven_shape(x, x_shape, -axis, facts)
        scale = scale_spec(gamma, x_shape, -axis, facts)
        norm = NormSpec(x, x_dtype, x_shape, axis, epsilon, placement, scale)
        return SkipSpec(x, skip, bias, x_dtype, float32_sum, norm, what)

    def rewrite(self, op, x, skip, normed, total=None, **_):
        session = self._session
        spec, context = self._decision({"normed": normed})
        path = node_path(normed.producer())
        emitted = session.target.emit_skip(op, spec, f"{path}{SKIP_RMSNORM}")
        emitted.node.name = f"{path}{session.target.name_for(emitted.node)}"
        replaced = [normed] + ([total] if total is not None else [])
        values = [emitted.y] + ([emitted.total] if total is not None else [])
        session.fused_norm(spec.norm, emitted.node, context, self.name, self._source, replaced, skip=True,
                           emitted=values)
        if spec.as_adds is not None:
            # The residual Add is no part of the op written: the report says so, naming the node of the input model.
            reason = (f"{spec.as_adds}: written as the sum's Add and {session.target.label(emitted.node)}, the "
                      f"residual Add not fused into {session.target.skip.op_type}")
            session.near_miss(context, self.name, NotFusable(reason), anchor=normed.producer())
        return (emitted.y, emitted.total) if self._with_sum else emitted.y
