"""The ``ort`` target: onnxruntime's ``SimplifiedLayerNormalization`` (registered in the default domain) and
``com.microsoft.SkipSimplifiedLayerNormalization``: epsilon inside the sqrt, scale of X's type; the residual op only
normalizes the last axis of a rank-2 or rank-3 input and needs a 1-D gamma of the hidden size."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir

from ort_rmsnorm.contract import (
    AXIS,
    DEFAULT_EPSILON,
    EPS_OUTSIDE,
    EPS_OUTSIDE_SQRT,
    EPSILON,
    MS_DOMAIN,
    NORM_OPS,
    ORT,
    ORT_SIMPLIFIED_LAYER_NORM,
    ORT_SKIP_NORM,
    ORT_SKIP_SIMPLIFIED_LAYER_NORM,
    OURS_SKIP_RMSNORM,
)

from ._emit import expand_scale
from ._facts import (
    SIXTEEN_BIT,
    Facts,
    NotFusable,
    constant_array,
    dtype_name,
    float_attribute,
    format_shape,
    int_attribute,
    label,
    require_stash_float32,
    same_shape,
    static_dims,
)
from ._specs import Emitted, Scale, SkipSpec
from ._target_base import SkipOp, StandardLikeTarget


class _SkipSimplifiedLayerNormalization(SkipOp):
    op = ORT_SKIP_NORM

    def gamma(self, norm, scale, shape, context, facts):
        """It normalizes the last axis of a rank-2 or rank-3 input and takes a 1-D gamma of the hidden size and the
        input's type (a constant scale that broadcasts is expanded to that)."""
        rank = shape.rank()
        axis = int_attribute(norm, AXIS, -1)
        if rank not in (2, 3) or axis not in (-1, rank - 1):
            raise NotFusable(
                f"{self.op_type} normalizes the last axis of a rank-2 or rank-3 input; "
                f"{label(norm)} has axis {axis} on an input of shape {format_shape(shape)}",
                norm,
            )
        require_stash_float32(norm, label(norm))
        if int_attribute(norm, EPS_OUTSIDE_SQRT, 0):
            raise NotFusable(f"{label(norm)} adds epsilon outside the sqrt: {self.op_type} adds it inside", norm)
        if scale is None or facts.dtype(scale) != facts.dtype(norm.inputs[0]):
            raise NotFusable(f"{self.op_type} needs gamma of the input's type", norm)
        hidden = shape.dims[-1]
        gamma_shape = facts.shape(scale)
        if gamma_shape is not None and same_shape(gamma_shape, ir.Shape([hidden])):
            return scale
        array, size = constant_array(scale, facts), static_dims([hidden])
        if array is None or size is None or array.size not in (1, size[0]):
            raise NotFusable(
                f"{self.op_type} needs a 1-D gamma of the hidden size; the scale has shape "
                f"{format_shape(gamma_shape)} on an input of shape {format_shape(shape)}",
                norm,
            )
        return expand_scale(array, size)

    def emit(self, op, a, b, gamma, norm, name, facts):
        if isinstance(gamma, np.ndarray):
            gamma = op.Constant(value=ir.tensor(gamma, name=f"{name}/gamma"), _outputs=[f"{name}/gamma"])
        epsilon = float_attribute(norm, EPSILON, DEFAULT_EPSILON)
        outputs = getattr(op, ORT_SKIP_SIMPLIFIED_LAYER_NORM)(
            a, b, gamma, _domain=MS_DOMAIN, _outputs=4, _name=name, **{EPSILON: epsilon}
        )
        dtype = facts.dtype(a)
        # onnxruntime's 16-bit op normalizes the float32 sum, the graph the sum its Add rounded.
        roundings = (f"the sum is rounded to {dtype_name(dtype)} before the norm",) if dtype in SIXTEEN_BIT else ()
        return list(outputs), roundings


class OrtTarget(StandardLikeTarget):
    name = ORT
    norm_op = ORT_SIMPLIFIED_LAYER_NORM
    skip = _SkipSimplifiedLayerNormalization()
    converts = (*(op for op in NORM_OPS if op != ORT_SIMPLIFIED_LAYER_NORM), OURS_SKIP_RMSNORM)

    def adapt_skip(self, spec, graph_like, model, facts):
        """As ``com.microsoft.SkipSimplifiedLayerNormalization`` where it computes the same thing, else as the Adds
        and ``SimplifiedLayerNormalization``."""
        try:
            return self._as_skip_op(spec, graph_like, model, facts)
        except NotFusable as error:
            written = super().adapt_skip(spec, graph_like, model, facts)
            return dataclasses.replace(written, as_adds=error.reason)

    def _as_skip_op(self, spec: SkipSpec, graph_like, model, facts: Facts) -> SkipSpec:
        """onnxruntime's op normalizes the float32 sum, over the last axis of a rank-2 or rank-3 input, with epsilon
        inside the sqrt and a 1-D gamma and bias of the hidden size and the input's type."""
        norm, op_type = spec.norm, self.skip.op_type
        shape = norm.x_shape
        if spec.dtype in SIXTEEN_BIT and not spec.float32_sum:
            source = spec.what.split(" ", 1)[0]  # the op, without its node: the reason is the same for every such node
            raise NotFusable(f"{op_type} normalizes the float32 sum; {source} normalizes the sum rounded to the type")
        last_axis = shape is not None and shape.rank() in (2, 3) and norm.axis == -1
        if norm.eps_placement == EPS_OUTSIDE or not last_axis:
            raise NotFusable(f"{op_type} normalizes the last axis of a rank-2 or rank-3 input, epsilon inside the sqrt")
        adapted = self.adapt(norm, graph_like, model, facts)  # the scale in X's type, one element per column
        hidden = static_dims(shape.dims[-1:])
        gamma = _one_dimensional(adapted.scale, hidden, facts, op_type, "gamma")
        bias = None
        if spec.bias is not None:
            bias_scale = Scale(spec.bias, None, "tensor", facts.dtype(spec.bias))
            bias = _one_dimensional(bias_scale, hidden, facts, op_type, "bias")
        return dataclasses.replace(spec, norm=adapted, gamma=gamma, bias_input=bias)

    def emit_skip(self, op, spec, name):
        if spec.gamma is None:
            return super().emit_skip(op, spec, name)
        gamma, bias = (
            op.Constant(value=ir.tensor(array, name=f"{name}/{what}"), _outputs=[f"{name}/{what}"])
            if isinstance(array, np.ndarray) else array
            for what, array in (("gamma", spec.gamma), ("bias", spec.bias_input))
        )
        inputs = [spec.x, spec.skip, gamma] + ([bias] if bias is not None else [])
        outputs = getattr(op, ORT_SKIP_SIMPLIFIED_LAYER_NORM)(
            *inputs, _domain=MS_DOMAIN, _outputs=4, _name=name, **{EPSILON: spec.norm.epsilon}
        )
        return Emitted(outputs[0], outputs[3], outputs[0].producer())


def _one_dimensional(scale: Scale | None, hidden: tuple[int, ...] | None, facts: Facts, op_type: str,
                     what: str) -> ir.Value | np.ndarray:
    """A per-column input as onnxruntime's residual op takes it: a value of shape [H], else the elements of a
    constant as a new 1-D constant."""
    if scale is not None and scale.value is not None:
        shape = facts.shape(scale.value)
        if hidden is not None and shape is not None and same_shape(shape, ir.Shape(list(hidden))):
            return scale.value
    array = None if scale is None else scale.constant if scale.value is None else constant_array(scale.value, facts)
    if hidden is None or array is None:
        raise NotFusable(f"{op_type} needs a 1-D {what} of the hidden size")
    return np.broadcast_to(array, array.shape[:-1] + hidden).reshape(hidden).copy()
