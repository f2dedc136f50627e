"""Norm ops already in the model -> the target's: an exporter's opset-23 ``RMSNormalization``, onnxruntime's
``SimplifiedLayerNormalization``, our ``RMSNorm`` -> the target's norm op, and onnxruntime's
``SkipSimplifiedLayerNormalization`` -> ``SkipRMSNorm``, where the target's op computes the same thing."""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import pattern

from ort_rmsnorm.contract import (
    AXIS,
    DEFAULT_EPSILON,
    EPS_INSIDE,
    EPS_OUTSIDE,
    EPS_OUTSIDE_SQRT,
    EPSILON,
    MS_DOMAIN,
    NORMALIZE_FLOAT32_SUM,
    ONNX_RMSNORM,
    ONNX_RMSNORM_OPSET,
    OP_DOMAIN,
    OP_VERSION,
    ORT_SKIP_DEFAULT_EPSILON,
    ORT_SKIP_NORM,
    ORT_SKIP_SIMPLIFIED_LAYER_NORM,
    SKIP_RMSNORM,
    unqualified,
)

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
    require_stash_float32,
    same_shape,
)
from ._naming import node_path
from ._rule import FusionRule, NormRule
from ._scales import scale_spec
from ._session import FusionSession
from ._targets import NormSpec, default_opset, scale_input


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


class SkipNormOpConversion(FusionRule):
    """onnxruntime's ``com.microsoft.SkipSimplifiedLayerNormalization`` (onnxruntime-genai's model builder, the
    transformer optimizer and Olive write it) -> ``SkipRMSNorm``, for the ``custom`` target.

    Both normalize the last axis of ``s = input + skip (+ bias)`` computed in float32 and give ``sum`` as
    ``round_T(s)``: for 16-bit types onnxruntime normalizes ``s`` before rounding it, which ``SkipRMSNorm`` does with
    ``normalize_float32_sum=1``. The op writes its ``sum`` as its 4th output (``[y, "", "", sum]``) or has none
    (``[y]``): one rule instance for each."""

    def __init__(self, session: FusionSession, with_sum: bool) -> None:
        super().__init__(f"Convert[{ORT_SKIP_NORM}]", session)
        self._with_sum = with_sum

    def root(self, bindings):
        return bindings["normed"].producer()

    def pattern(self, op, x, skip, gamma):
        bias = pattern.Var("bias", can_match_none=True)
        skip_norm = getattr(op, ORT_SKIP_SIMPLIFIED_LAYER_NORM)
        if not self._with_sum:
            return skip_norm(x, skip, gamma, bias, _domain=MS_DOMAIN, _outputs=["normed"])
        normed, _, _, total = skip_norm(
            x, skip, gamma, bias, _domain=MS_DOMAIN, _outputs=["normed", "mean", "inv_std_var", "total"]
        )
        return normed, total

    def check(self, context, x, skip, gamma, normed, bias=None, **_):
        node = normed.producer()
        has_sum = len(node.outputs) >= 4 and bool(node.outputs[3].uses() or node.outputs[3].is_graph_output())
        if self._with_sum != has_sum:
            # Each node is the other instance's (onnxscript's matcher of several outputs can also bind a node that
            # lacks the later ones).
            return pattern.MatchResult().fail("the sum output is the other rule's")
        try:
            spec = self._analyze(node, x, skip, gamma, bias)
            spec = self._session.target.adapt(spec, context.graph_or_function, context.model, self._session.facts)
        except NotFusable as error:
            return self._decline(context, error, node)
        return self._accept({"normed": normed}, (spec, context))

    def _analyze(self, node: ir.Node, x: ir.Value, skip: ir.Value, gamma: ir.Value, bias: ir.Value | None):
        facts = self._session.facts
        what = f"{ORT_SKIP_NORM} {label(node)}"
        statistics = node.outputs[1:3]
        if any(value.uses() or value.is_graph_output() for value in statistics):
            raise NotFusable(f"{what}: its mean or inv_std_var output is in use (the fused ops have none)", node)
        x_dtype = facts.dtype(x)
        if x_dtype not in NORM_DTYPES:
            raise NotFusable(
                f"{what}: {dtype_name(x_dtype)} input; the fused ops take float32, float16, bfloat16", node
            )
        x_shape, skip_shape = facts.shape(x), facts.shape(skip)
        if not same_shape(x_shape, skip_shape):
            raise NotFusable(
                f"{what}: skip of shape {format_shape(skip_shape)} on input {format_shape(x_shape)} is not known to "
                "have the input's shape (SkipRMSNorm's skip has X's shape)",
                node,
            )
        if bias is not None:
            check_scale_shape(facts.shape(bias), x_shape, 1, node)
            if facts.dtype(bias) != x_dtype:
                raise NotFusable(
                    f"{what}: bias of type {dtype_name(facts.dtype(bias))} on a {dtype_name(x_dtype)} input", node
                )
        epsilon = float_attribute(node, EPSILON, ORT_SKIP_DEFAULT_EPSILON)
        if epsilon is None:
            raise NotFusable(f"{what}: the epsilon attribute is not a float", node)
        check_epsilon(epsilon, f"{what}: ", node)
        scale = scale_spec(gamma, x_shape, 1, facts)
        if scale is None and bias is not None:
            raise NotFusable(
                f"{what}: a bias with a gamma of ones would make a SkipRMSNorm without a scale but with a bias, which "
                "onnxruntime 1.20 to 1.23 cannot load",
                node,
            )
        return NormSpec(x, x_dtype, x_shape, -1, epsilon, EPS_INSIDE, scale)

    def rewrite(self, op, x, skip, normed, bias=None, total=None, **_):
        session = self._session
        spec, context = self._decision({"normed": normed})
        name = f"{node_path(normed.producer())}{SKIP_RMSNORM}"
        inputs = [x, skip, scale_input(op, spec.scale, name)] + ([bias] if bias is not None else [])
        while inputs[-1] is None:
            inputs.pop()
        attributes = {EPSILON: spec.epsilon}
        if spec.x_dtype in (ir.DataType.FLOAT16, ir.DataType.BFLOAT16):  # float32: the same sum either way
            attributes[NORMALIZE_FLOAT32_SUM] = 1
        outputs = getattr(op, SKIP_RMSNORM)(
            *inputs, _domain=OP_DOMAIN, _version=OP_VERSION, _outputs=2, _name=name, **attributes
        )
        replaced = [normed, total]
        session.fused_norm(spec, outputs[0].producer(), context, self.name, ORT_SKIP_NORM, replaced, skip=True)
        return (outputs[0], outputs[1]) if self._with_sum else outputs[0]
