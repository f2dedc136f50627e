"""The targets: the operators the pass can emit, what each can express exactly, and how each writes a residual norm.

``custom``: ``ort_rmsnorm.RMSNorm`` / ``SkipRMSNorm`` (this package's library): everything the rules recognize; the
other runtimes' norm ops are converted to it, onnxruntime's skip op too.
``onnx``: ONNX ``RMSNormalization`` (opset 23): epsilon inside the sqrt, scale of X's type with one element per
normalized element (a ones scale is added when the graph has none, a constant one that broadcasts is expanded), no
residual op; onnxruntime has no bfloat16 CPU kernel for it, so bfloat16 is skipped.
``ort``: onnxruntime's ``SimplifiedLayerNormalization`` (registered in the default domain) and
``com.microsoft.SkipSimplifiedLayerNormalization``: epsilon inside the sqrt, scale of X's type; the residual op only
normalizes the last axis of a rank-2 or rank-3 input and needs a 1-D gamma of the hidden size.

Everything that differs between targets is here: the rules ask their target, never its name.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir

from ort_rmsnorm.contract import (
    AXIS,
    CUSTOM,
    DEFAULT_EPSILON,
    EPS_OUTSIDE,
    EPS_OUTSIDE_SQRT,
    EPSILON,
    MS_DOMAIN,
    NORM_OPS,
    ONNX,
    ONNX_RMSNORM,
    ONNX_RMSNORM_OPSET,
    OP_DOMAIN,
    OP_VERSION,
    ORT,
    ORT_SIMPLIFIED_LAYER_NORM,
    ORT_SKIP_NORM,
    ORT_SKIP_SIMPLIFIED_LAYER_NORM,
    OURS_RMSNORM,
    OURS_SKIP_RMSNORM,
    RMSNORM,
    SKIP_RMSNORM,
    STASH_TYPE,
    unqualified,
)

from ._facts import (
    SIXTEEN_BIT,
    STASH_FLOAT32,
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


# ---- the residual norm ops ---------------------------------------------------------------------------------------


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


class _SkipRMSNorm(SkipOp):
    op = OURS_SKIP_RMSNORM

    def gamma(self, norm, scale, shape, context, facts):
        require_domain_version(OP_DOMAIN, OP_VERSION, context.graph_or_function, context.model)
        return scale

    def emit(self, op, a, b, gamma, norm, name, facts):
        inputs = [a, b] + ([gamma] if gamma is not None else [])
        attributes = {attr_name: attr.value for attr_name, attr in norm.attributes.items()}  # the norm's own
        outputs = getattr(op, SKIP_RMSNORM)(
            *inputs, _domain=OP_DOMAIN, _version=OP_VERSION, _outputs=2, _name=name, **attributes
        )
        return list(outputs), ()


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


# ---- the targets -------------------------------------------------------------------------------------------------


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

    @property
    def emits(self) -> tuple[str, ...]:
        return (self.norm_op,) + ((self.skip.op,) if self.skip is not None else ())

    def adapt(self, spec: NormSpec, graph_like: ir.Graph | ir.Function, model: ir.Model, facts: Facts) -> NormSpec:
        """The spec this target can emit exactly; NotFusable when it cannot express the norm."""
        raise NotImplementedError

    def emit(self, op, spec: NormSpec, name: str) -> ir.Value:
        raise NotImplementedError


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


class _StandardLikeTarget(Target):
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


class OnnxTarget(_StandardLikeTarget):
    name = ONNX
    norm_op = ONNX_RMSNORM
    converts = tuple(op for op in NORM_OPS if op != ONNX_RMSNORM)
    opset = ONNX_RMSNORM_OPSET

    def adapt(self, spec, graph_like, model, facts):
        opset = default_opset(graph_like, model)
        if opset < ONNX_RMSNORM_OPSET:
            raise NotFusable(
                f"the default opset is {opset}: RMSNormalization needs opset {ONNX_RMSNORM_OPSET} "
                "(fuse with allow_opset_upgrade=True to convert the model)"
            )
        if spec.x_dtype == ir.DataType.BFLOAT16:
            raise NotFusable("bfloat16 input: onnxruntime has no RMSNormalization kernel for bfloat16 on CPU")
        return super().adapt(spec, graph_like, model, facts)


class OrtTarget(_StandardLikeTarget):
    name = ORT
    norm_op = ORT_SIMPLIFIED_LAYER_NORM
    skip = _SkipSimplifiedLayerNormalization()
    converts = tuple(op for op in NORM_OPS if op != ORT_SIMPLIFIED_LAYER_NORM)


TARGETS: dict[str, Target] = {target.name: target for target in (CustomTarget(), OnnxTarget(), OrtTarget())}
"""The targets by name, in :data:`ort_rmsnorm.contract.TARGETS`' order (tests/package/test_layers.py checks it)."""


def get_target(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise ValueError(f"unknown fusion target {name!r}: choose one of {', '.join(TARGETS)}") from None
