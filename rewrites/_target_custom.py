"""The ``custom`` target: ``ort_rmsnorm.RMSNorm`` / ``SkipRMSNorm`` (this package's library), which express everything
the rules recognize; the other runtimes' norm ops are converted to it, onnxruntime's skip op too."""

from __future__ import annotations

import dataclasses

import onnx_ir as ir

from ort_rmsnorm.contract import (
    AXIS,
    CUSTOM,
    EPS_OUTSIDE,
    EPS_OUTSIDE_SQRT,
    EPSILON,
    NORM_OPS,
    NORMALIZE_FLOAT32_SUM,
    OP_DOMAIN,
    OP_VERSION,
    ORT_SKIP_NORM,
    OURS_RMSNORM,
    OURS_SKIP_RMSNORM,
    RMSNORM,
    SKIP_RMSNORM,
)

from ._emit import require_domain_version, scale_input
from ._facts import NotFusable, dtype_name
from ._specs import Emitted
from ._target_base import SkipOp, Target


class _SkipRMSNorm(SkipOp):
    op = OURS_SKIP_RMSNORM

    def gamma(self, norm, scale, shape, context, facts):
        require_domain_version(OP_DOMAIN, OP_VERSION, context.graph_or_function, context.model)
        return scale

    def emit(self, op, a, b, gamma, norm, name, facts):
        inputs = [a, b] + ([gamma] if gamma is not None else [])
        # The norm's own attributes; of onnxruntime's norm op (``auto``), those ours has too (not stash_type).
        attributes = {
            attr_name: attr.value
            for attr_name, attr in norm.attributes.items()
            if attr_name in (AXIS, EPSILON, EPS_OUTSIDE_SQRT)
        }
        outputs = getattr(op, SKIP_RMSNORM)(
            *inputs, _domain=OP_DOMAIN, _version=OP_VERSION, _outputs=2, _name=name, **attributes
        )
        return list(outputs), ()


class CustomTarget(Target):
    name = CUSTOM
    norm_op = OURS_RMSNORM
    skip = _SkipRMSNorm()
    converts = (*(op for op in NORM_OPS if op != OURS_RMSNORM), ORT_SKIP_NORM)

    def adapt(self, spec, graph_like, model, facts):
        if spec.scale is not None and spec.scale.dtype not in (spec.x_dtype, ir.DataType.FLOAT):
            raise NotFusable(
                f"scale is {dtype_name(spec.scale.dtype)} and X {dtype_name(spec.x_dtype)}: the fused op takes a scale "
                "of X's type or float32"
            )
        require_domain_version(OP_DOMAIN, OP_VERSION, graph_like, model)
        return spec

    def emit(self, op, spec, name):
        inputs = [spec.x] + ([scale_input(op, spec.scale, name)] if spec.scale is not None else [])
        attributes = {AXIS: spec.axis, EPSILON: spec.epsilon, EPS_OUTSIDE_SQRT: int(spec.eps_placement == EPS_OUTSIDE)}
        return getattr(op, RMSNORM)(*inputs, _domain=OP_DOMAIN, _version=OP_VERSION, _name=name, **attributes)

    def adapt_skip(self, spec, graph_like, model, facts):
        """``SkipRMSNorm`` takes any of them: the float32 sum's norm with ``normalize_float32_sum=1``."""
        if spec.norm.scale is None and spec.bias is not None:
            raise NotFusable(
                f"{spec.what}: a bias with a gamma of ones would make a SkipRMSNorm without a scale but with a bias, "
                "which onnxruntime 1.20 to 1.23 cannot load"
            )
        return dataclasses.replace(spec, norm=self.adapt(spec.norm, graph_like, model, facts))

    def emit_skip(self, op, spec, name):
        norm = spec.norm
        inputs = [spec.x, spec.skip, scale_input(op, norm.scale, name), spec.bias]
        while inputs[-1] is None:
            inputs.pop()
        attributes = {EPSILON: norm.epsilon}  # the defaults left out
        if norm.axis != -1:
            attributes[AXIS] = norm.axis
        if norm.eps_placement == EPS_OUTSIDE:
            attributes[EPS_OUTSIDE_SQRT] = 1
        if spec.wide:
            attributes[NORMALIZE_FLOAT32_SUM] = 1
        outputs = getattr(op, SKIP_RMSNORM)(
            *inputs, _domain=OP_DOMAIN, _version=OP_VERSION, _outputs=2, _name=name, **attributes
        )
        return Emitted(outputs[0], outputs[1], outputs[0].producer())
