"""The residual Add before a norm: Add + the target's norm op -> the target's skip op."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from ..contract import DEFAULT_EPSILON, MS_DOMAIN, OP_DOMAIN, OP_VERSION
from ._facts import (
    NORM_DTYPES,
    SIXTEEN_BIT,
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
from ._session import FusionSession, node_path
from ._targets import expand_scale, require_domain_version


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
        # Or the same sum in float32, rounded back: a float16 converter that keeps Add in float32 writes it so, and
        # float32 holds the sum of two float16 or bfloat16 values well enough that rounding it once more is exact.
        widened = op.Add(op.Cast(a, _outputs=["a_wide"]), op.Cast(b, _outputs=["b_wide"]), _outputs=["wide_sum"])
        total = pattern.OrValue([op.Add(a, b, _outputs=["total"]), op.Cast(widened, _outputs=["total"])])
        if self._ort:
            normed = op.SimplifiedLayerNormalization(total, scale, _outputs=["normed"])
        else:
            normed = op.RMSNorm(total, scale, _domain=OP_DOMAIN, _outputs=["normed"])
        return normed, total

    def check(self, context, a, b, total, normed, scale=None, wide_sum=None, a_wide=None, b_wide=None, **_):
        try:
            if wide_sum is not None:
                self._check_widened_sum(a, b, a_wide, b_wide, wide_sum, total)
            self._check_residual(context, a, b, total, normed.producer())
            shape = self._session.types.shape(a)
            self._gamma = self._ort_gamma(normed.producer(), scale, shape) if self._ort else scale
        except NotFusable as error:
            self._session.near_miss(context, self.name, error, anchor=total.producer(), met=normed.producer())
            return pattern.MatchResult().fail(error.reason, list(error.sources))
        self._context = context
        return pattern.MatchResult()

    def rewrite(self, op, a, b, total, normed, **_):
        norm = normed.producer()
        path = node_path(norm)
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
            dtype = self._session.types.dtype(a)
            # onnxruntime's 16-bit op normalizes the float32 sum, the graph the sum its Add rounded.
            roundings = (f"the sum is rounded to {dtype_name(dtype)} before the norm",) if dtype in SIXTEEN_BIT else ()
        else:
            name = f"{path}SkipRMSNorm"
            inputs = [a, b] + ([self._gamma] if self._gamma is not None else [])
            attributes = {attr_name: attr.value for attr_name, attr in norm.attributes.items()}
            outputs = op.SkipRMSNorm(
                *inputs, _domain=OP_DOMAIN, _version=OP_VERSION, _outputs=2, _name=name, **attributes
            )
            replaced = [normed, total]
            roundings = ()
        self._session.fused_residual(norm, outputs[0].producer(), self._context, self.name, replaced, roundings)
        return outputs[0], outputs[-1]

    def _check_widened_sum(self, a, b, a_wide, b_wide, wide_sum, total) -> None:
        """Cast(Add(Cast(a), Cast(b))) is a's type's own Add when a and b are 16-bit, widened to float32 exactly and
        the sum is rounded back to their type."""
        types = self._session.types
        dtypes = {types.dtype(a), types.dtype(b), types.dtype(total)}
        wide = {types.dtype(a_wide), types.dtype(b_wide), types.dtype(wide_sum)}
        if len(dtypes) != 1 or not dtypes <= SIXTEEN_BIT or wide != {ir.DataType.FLOAT}:
            raise NotFusable(
                f"Add {label(wide_sum.producer())} adds {'/'.join(sorted(map(dtype_name, wide)))} casts of "
                f"{'/'.join(sorted(map(dtype_name, dtypes)))} values and is cast back: not the 16-bit Add of its "
                "operands",
                wide_sum.producer(),
            )

    def _check_residual(self, context, a, b, total, norm: ir.Node) -> None:
        types = self._session.types
        add = total.producer()
        a_shape, b_shape = types.shape(a), types.shape(b)
        if not same_shape(a_shape, b_shape):
            # Post-processing tools (onnxsim, float16 converters) drop or rename the stored shapes: follow the dims
            # through the graph's own shape arithmetic.
            (a_symbolic, why), (b_symbolic, _) = types.symbolic_shape(a), types.symbolic_shape(b)
            if not same_shape(a_symbolic, b_symbolic):
                shown = f"; symbolic shape inference: {format_shape(a_symbolic)} and {format_shape(b_symbolic)}"
                raise NotFusable(
                    f"Add {label(add)} of shapes {format_shape(a_shape)} and {format_shape(b_shape)} is not known to "
                    "add two tensors of one shape (a residual add); a broadcast operand such as a bias stays"
                    + (f" ({why})" if why else shown if a_symbolic is not None or b_symbolic is not None else ""),
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
        require_stash_float32(norm, label(norm))
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
