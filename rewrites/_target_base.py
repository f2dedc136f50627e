"""What every target is: :class:`Target`, one family of emitted operators, with :class:`SkipOp`, how it writes
``Add`` + its norm op as one residual norm op; and :class:`StandardLikeTarget`, what the targets whose norm op takes
epsilon inside the sqrt and a scale of X's type share (``onnx``, ``ort``).

A residual norm op already in the model (ours or onnxruntime's) is written again by each target from a
:class:`SkipSpec`: as its own residual op where that computes the same thing, else as the sum's Adds (in float32
where the contract's sum is) and its norm op.

Everything that differs between targets is in their own modules (``_target_<name>``, listed by ``_target_list``):
the rules ask their target, never its name.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir

from ort_rmsnorm.contract import AXIS, EPS_OUTSIDE, EPSILON, STASH_TYPE, qualified, unqualified

from ._emit import emit_sum, expand_scale, scale_input
from ._facts import STASH_FLOAT32, Facts, NotFusable, constant_array, dtype_name, format_shape, same_shape, static_dims
from ._specs import Emitted, NormSpec, Scale, SkipSpec


class SkipOp:
    """How a target writes ``Add`` + its norm op as one residual norm op."""

    op: str
    """The op as the report names it (domain-qualified)."""

    @property
    def op_type(self) -> str:
        return unqualified(self.op)[1]

    def gamma(self, norm: ir.Node, scale: ir.Value | None, shape: ir.Shape | None, context,
              facts: Facts) -> ir.Value | np.ndarray | None:
        """The gamma the op takes in place of the norm's scale; NotFusable when the op cannot express the norm."""
        raise NotImplementedError

    def emit(self, op, a: ir.Value, b: ir.Value, gamma, norm: ir.Node, name: str,
             facts: Facts) -> tuple[list[ir.Value], tuple[str, ...]]:
        """The op's outputs (Y first, the sum last) and where the unfused graph rounds and the op does not."""
        raise NotImplementedError


class Target:
    """One family of emitted operators."""

    name: str
    norm_op: str
    """The norm operator as the report names it (domain-qualified when not the default domain)."""
    skip: SkipOp | None = None
    """Its residual norm op, if it has one."""
    converts: tuple[str, ...] = ()
    """The norm ops a model may hold that the pass converts to this target's (:data:`NORM_OPS` and the skip ops)."""
    opset: int | None = None
    """The default opset its ops need, when they need one (``allow_opset_upgrade`` converts a model to it)."""
    fuses_subgraphs = True
    """Whether the decomposed-norm rules run (a target that writes plain ONNX ops only converts norm ops)."""

    @property
    def emits(self) -> tuple[str, ...]:
        return (self.norm_op,) + ((self.skip.op,) if self.skip is not None else ())

    @property
    def residual_norm_ops(self) -> tuple[str, ...]:
        """The norm ops an Add before which the residual rule fuses (into :meth:`skip_for`'s op)."""
        return (self.norm_op,) if self.skip is not None else ()

    def prepare(self, model: ir.Model) -> None:
        """Called once with the model before the pass fuses it (a target that chooses by the model reads it here)."""

    def skip_for(self, norm: ir.Node, shape: ir.Shape | None, facts: Facts) -> list[tuple[SkipOp, str | None]]:
        """The residual ops that may take in ``norm`` and the Add before it, the preferred first, each with why
        (where a target chooses per norm)."""
        return [(self.skip, None)]

    def adapt(self, spec: NormSpec, graph_like: ir.Graph | ir.Function, model: ir.Model, facts: Facts) -> NormSpec:
        """The spec this target can emit exactly; NotFusable when it cannot express the norm."""
        raise NotImplementedError

    def emit(self, op, spec: NormSpec, name: str) -> ir.Value:
        raise NotImplementedError

    def label(self, node: ir.Node) -> str:
        """What the report calls the op this target emitted as ``node``."""
        return qualified(node.domain, node.op_type)

    def name_for(self, node: ir.Node) -> str:
        """The last part of the name of the node this target emitted as ``node``."""
        return node.op_type

    def adapt_skip(self, spec: SkipSpec, graph_like: ir.Graph | ir.Function, model: ir.Model, facts: Facts) -> SkipSpec:
        """The residual norm op as this target can write it exactly: by default the sum's Adds and the target's norm
        op (of the float32 sum where Y normalizes it, Y then rounded to the type once); NotFusable when it cannot."""
        norm = spec.norm
        if spec.wide:
            norm = dataclasses.replace(norm, x_dtype=ir.DataType.FLOAT)
        return dataclasses.replace(spec, norm=self.adapt(norm, graph_like, model, facts))

    def emit_skip(self, op, spec: SkipSpec, name: str) -> Emitted:
        normed, total = emit_sum(op, spec)
        y = self.emit(op, dataclasses.replace(spec.norm, x=normed), name)
        node = y.producer()
        if spec.wide:
            y = op.Cast(y, to=int(spec.dtype))
        return Emitted(y, total, node)


class StandardLikeTarget(Target):
    """Targets whose norm op needs epsilon inside the sqrt and a scale of X's type."""

    def adapt(self, spec, graph_like, model, facts):
        if spec.eps_placement == EPS_OUTSIDE:
            raise NotFusable(f"epsilon is added outside the sqrt: {self.norm_op} adds it inside")
        scale = self._scale_of_x_type(spec, facts)
        return dataclasses.replace(spec, scale=self._scale_per_normalized_element(spec, scale, facts))

    def _scale_per_normalized_element(self, spec: NormSpec, scale: Scale, facts: Facts) -> Scale:
        """onnxruntime before 1.24 does not broadcast these ops' scale: it needs one element per normalized element
        (else "Size of scale ... must match"). A scale that broadcasts is expanded to the normalized dims when it is
        a constant and they are static; otherwise the norm is not fused."""
        normalized = list(spec.x_shape.dims[spec.axis :]) if spec.x_shape is not None else None
        shape = ir.Shape(scale.constant.shape) if scale.value is None else facts.shape(scale.value)
        if normalized is not None and shape is not None and shape.rank() >= len(normalized):
            if same_shape(ir.Shape(list(shape.dims)[shape.rank() - len(normalized) :]), ir.Shape(normalized)):
                return scale  # the leading dims beyond the normalized ones are 1 (checked by the rule)
        dims = static_dims(normalized) if normalized is not None else None
        array = scale.constant if scale.value is None else constant_array(scale.value, facts)
        if dims is None or array is None:
            raise NotFusable(
                f"the scale of shape {format_shape(shape)} broadcasts onto the normalized dims of X "
                f"{format_shape(spec.x_shape)}: {self.norm_op} needs one scale element per normalized element "
                "(onnxruntime before 1.24), and the scale is computed at run time or the dims are not static"
            )
        expanded = expand_scale(array, dims)
        return Scale(None, expanded, f"{scale.form}, broadcast to {format_shape(ir.Shape(list(dims)))}", scale.dtype)

    def emit(self, op, spec, name):
        # RMSNormalization and SimplifiedLayerNormalization share inputs and attributes (default domain both).
        attributes = {AXIS: spec.axis, EPSILON: spec.epsilon, STASH_TYPE: STASH_FLOAT32}
        return getattr(op, self.norm_op)(spec.x, scale_input(op, spec.scale, name), _name=name, **attributes)

    def _scale_of_x_type(self, spec: NormSpec, facts: Facts) -> Scale:
        x_dtype = spec.x_dtype
        if spec.scale is None:
            dims = static_dims(spec.x_shape.dims[spec.axis :]) if spec.x_shape is not None else None
            if dims is None:
                raise NotFusable(
                    f"no scale, and the normalized dims of input {format_shape(spec.x_shape)} are not static: "
                    f"{self.norm_op} needs a scale tensor (of ones)"
                )
            return Scale(None, np.ones(dims, x_dtype.numpy()), "ones (added)", x_dtype)
        if spec.scale.dtype == x_dtype:
            return spec.scale
        array = spec.scale.constant if spec.scale.constant is not None else constant_array(spec.scale.value, facts)
        mismatch = (
            f"scale is {dtype_name(spec.scale.dtype)} and X {dtype_name(x_dtype)}: {self.norm_op} needs the scale in"
            " X's type"
        )
        if array is None:
            raise NotFusable(f"{mismatch}, and the scale is computed at run time")
        converted = array.astype(x_dtype.numpy())
        if not np.array_equal(converted.astype(array.dtype), array, equal_nan=True):
            raise NotFusable(
                f"{mismatch}, and the constant scale is not exactly representable in {dtype_name(x_dtype)}"
            )
        return Scale(None, converted, f"{spec.scale.form}, converted to {dtype_name(x_dtype)}", x_dtype)
