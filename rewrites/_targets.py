"""The operators the pass can emit, and what each can express exactly.

``custom``: ``ort_rmsnorm.RMSNorm`` / ``SkipRMSNorm`` (this package's library): everything the rules recognize.
``onnx``: ONNX ``RMSNormalization`` (opset 23): epsilon inside the sqrt, scale of X's type with one element per
normalized element (a ones scale is added when the graph has none, a constant one that broadcasts is expanded), no
residual op; onnxruntime has no bfloat16 CPU kernel for it, so bfloat16 is skipped.
``ort``: onnxruntime's ``SimplifiedLayerNormalization`` (registered in the default domain) and
``com.microsoft.SkipSimplifiedLayerNormalization``: epsilon inside the sqrt, scale of X's type; the residual op only
normalizes the last axis of a rank-2 or rank-3 input and needs a 1-D gamma of the hidden size.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir

from ..contract import (
    ONNX_RMSNORM,
    ONNX_RMSNORM_OPSET,
    OP_DOMAIN,
    OP_VERSION,
    ORT_SIMPLIFIED_LAYER_NORM,
    RMSNORM,
)
from ..model_types import TypeTable
from ._facts import STASH_FLOAT32, NotFusable, constant_array, dtype_name, format_shape, same_shape, static_dims


@dataclasses.dataclass
class Scale:
    """The scale the fused op reads: a value of the graph, or (``value`` None) a new constant holding ``constant``."""

    value: ir.Value | None
    constant: np.ndarray | None
    """The elements of a scale the pass makes (folded 1 + w, ones, a converted constant); None for the graph's
    own value (weights are read only when a target needs them converted)."""
    form: str
    dtype: ir.DataType


@dataclasses.dataclass
class NormSpec:
    """Everything the emitted operator needs, decided by the rule's check."""

    x: ir.Value
    x_dtype: ir.DataType
    x_shape: ir.Shape | None
    axis: int
    epsilon: float
    eps_placement: str
    scale: Scale | None
    roundings: tuple[str, ...] = ()
    """Where the unfused subgraph rounds to a 16-bit type and the fused op does not (see Fusion.roundings)."""


class Target:
    """One family of emitted operators."""

    name: str
    norm_op: str
    """The norm operator as the report names it (domain-qualified when not the default domain)."""

    def adapt(self, spec: NormSpec, graph_like: ir.Graph | ir.Function, model: ir.Model, types: TypeTable) -> NormSpec:
        """The spec this target can emit exactly; NotFusable when it cannot express the norm."""
        raise NotImplementedError

    def emit(self, op, spec: NormSpec, name: str) -> ir.Value:
        raise NotImplementedError


def scale_input(op, scale: Scale | None, node_name: str) -> ir.Value | None:
    """The scale as an input of the emitted node: the graph's value, or a new Constant."""
    if scale is None:
        return None
    if scale.value is not None:
        return scale.value
    return op.Constant(value=ir.tensor(scale.constant, name=f"{node_name}/scale"), _outputs=[f"{node_name}/scale"])


def expand_scale(array: np.ndarray, dims: tuple[int, ...]) -> np.ndarray:
    """A constant scale that broadcasts onto ``dims`` (right-aligned; dims beyond them are 1), with one element per
    element of ``dims``."""
    return np.broadcast_to(array.reshape(array.shape[max(0, array.ndim - len(dims)) :]), dims).copy()


def _imported_version(domain: str, graph_like: ir.Graph | ir.Function, model: ir.Model) -> int | None:
    if isinstance(graph_like, ir.Function) and domain in graph_like.opset_imports:
        return graph_like.opset_imports[domain]
    return model.opset_imports.get(domain)


def require_domain_version(domain: str, version: int, graph_like, model: ir.Model) -> None:
    """The rewriter cannot emit a second version of a domain the model already imports."""
    for imports in (model.opset_imports, graph_like.opset_imports):
        if imports.get(domain, version) != version:
            raise NotFusable(
                f"the model imports domain '{domain}' version {imports[domain]}; the pass emits version {version}"
            )


def default_opset(graph_like: ir.Graph | ir.Function, model: ir.Model) -> int:
    version = _imported_version("", graph_like, model)
    return version if version is not None else _imported_version("ai.onnx", graph_like, model) or 0


class CustomTarget(Target):
    name = "custom"
    norm_op = f"{OP_DOMAIN}.{RMSNORM}"

    def adapt(self, spec, graph_like, model, types):
        if spec.scale is not None and spec.scale.dtype not in (spec.x_dtype, ir.DataType.FLOAT):
            raise NotFusable(
                f"scale is {dtype_name(spec.scale.dtype)} and X {dtype_name(spec.x_dtype)}: the fused op takes a scale "
                "of X's type or float32"
            )
        require_domain_version(OP_DOMAIN, OP_VERSION, graph_like, model)
        return spec

    def emit(self, op, spec, name):
        inputs = [spec.x] + ([scale_input(op, spec.scale, name)] if spec.scale is not None else [])
        return getattr(op, RMSNORM)(
            *inputs,
            _domain=OP_DOMAIN,
            _version=OP_VERSION,
            _name=name,
            axis=spec.axis,
            epsilon=spec.epsilon,
            eps_outside_sqrt=int(spec.eps_placement == "outside_sqrt"),
        )


class _StandardLikeTarget(Target):
    """Targets whose norm op needs epsilon inside the sqrt and a scale of X's type."""

    def adapt(self, spec, graph_like, model, types):
        if spec.eps_placement == "outside_sqrt":
            raise NotFusable(f"epsilon is added outside the sqrt: {self.norm_op} adds it inside")
        scale = self._scale_of_x_type(spec, types)
        return dataclasses.replace(spec, scale=self._scale_per_normalized_element(spec, scale, types))

    def _scale_per_normalized_element(self, spec: NormSpec, scale: Scale, types: TypeTable) -> Scale:
        """onnxruntime before 1.24 does not broadcast these ops' scale: it needs one element per normalized element
        (else "Size of scale ... must match"). A scale that broadcasts is expanded to the normalized dims when it is
        a constant and they are static; otherwise the norm is not fused."""
        normalized = list(spec.x_shape.dims[spec.axis :]) if spec.x_shape is not None else None
        shape = ir.Shape(scale.constant.shape) if scale.value is None else types.shape(scale.value)
        if normalized is not None and shape is not None and shape.rank() >= len(normalized):
            if same_shape(ir.Shape(list(shape.dims)[shape.rank() - len(normalized) :]), ir.Shape(normalized)):
                return scale  # the leading dims beyond the normalized ones are 1 (checked by the rule)
        dims = static_dims(normalized) if normalized is not None else None
        array = scale.constant if scale.value is None else constant_array(scale.value, types)
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
        return getattr(op, self.norm_op)(
            spec.x,
            scale_input(op, spec.scale, name),
            _name=name,
            axis=spec.axis,
            epsilon=spec.epsilon,
            stash_type=STASH_FLOAT32,
        )

    def _scale_of_x_type(self, spec: NormSpec, types: TypeTable) -> Scale:
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
        array = spec.scale.constant if spec.scale.constant is not None else constant_array(spec.scale.value, types)
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


class OnnxTarget(_StandardLikeTarget):
    name = "onnx"
    norm_op = ONNX_RMSNORM

    def adapt(self, spec, graph_like, model, types):
        opset = default_opset(graph_like, model)
        if opset < ONNX_RMSNORM_OPSET:
            raise NotFusable(
                f"the default opset is {opset}: RMSNormalization needs opset {ONNX_RMSNORM_OPSET} "
                "(fuse with allow_opset_upgrade=True to convert the model)"
            )
        if spec.x_dtype == ir.DataType.BFLOAT16:
            raise NotFusable("bfloat16 input: onnxruntime has no RMSNormalization kernel for bfloat16 on CPU")
        return super().adapt(spec, graph_like, model, types)


class OrtTarget(_StandardLikeTarget):
    name = "ort"
    norm_op = ORT_SIMPLIFIED_LAYER_NORM


TARGETS: dict[str, Target] = {target.name: target for target in (CustomTarget(), OnnxTarget(), OrtTarget())}


def get_target(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise ValueError(f"unknown fusion target {name!r}: choose one of {', '.join(TARGETS)}") from None
