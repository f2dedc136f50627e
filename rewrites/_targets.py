"""The targets: the operators the pass can emit, what each can express exactly, and how each writes a residual norm.

``custom``: ``ort_rmsnorm.RMSNorm`` / ``SkipRMSNorm`` (this package's library): everything the rules recognize; the
other runtimes' norm ops are converted to it, onnxruntime's skip op too.
``onnx``: ONNX ``RMSNormalization`` (opset 23): epsilon inside the sqrt, scale of X's type with one element per
normalized element (a ones scale is added when the graph has none, a constant one that broadcasts is expanded), no
residual op; onnxruntime has no bfloat16 CPU kernel for it, so bfloat16 is skipped.
``ort``: onnxruntime's ``SimplifiedLayerNormalization`` (registered in the default domain) and
``com.microsoft.SkipSimplifiedLayerNormalization``: epsilon inside the sqrt, scale of X's type; the residual op only
normalizes the last axis of a rank-2 or rank-3 input and needs a 1-D gamma of the hidden size.
``auto`` (``_auto``) and ``decomposed`` (``_decomposed``) build on these.

A residual norm op already in the model (ours or onnxruntime's) is written again by each target from a
:class:`SkipSpec`: as its own residual op where that computes the same thing, else as the sum's Adds (in float32
where the contract's sum is) and its norm op.

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
    NORMALIZE_FLOAT32_SUM,
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
    qualified,
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
    op: str | None = None
    """The op to emit, where a target chooses per norm (``auto``); None: the target's norm op."""
    choice: str | None = None
    """Why that op (``auto``), for the report."""
    opset: int | None = None
    """The default opset where the norm is emitted (for a target that writes plain ONNX ops)."""
    derivation: str | None = None
    """How epsilon and the scale were derived from a spelling that is not the mean square's (the L2 family)."""


@dataclasses.dataclass
class SkipSpec:
    """A residual norm op already in the model, ours or onnxruntime's: ``Y = norm(s)`` and ``sum = round_T(s)`` with
    ``s = (x + skip) + bias`` computed in float32 (docs/ops.md). ``norm`` is the norm of the sum as the target emits
    it (its ``x`` the op's X until then; of float32 where Y normalizes the unrounded float32 sum of 16-bit inputs)."""

    x: ir.Value
    skip: ir.Value
    bias: ir.Value | None
    dtype: ir.DataType
    """X's type (the sum's)."""
    float32_sum: bool
    """Y normalizes the float32 sum before it is rounded to the type (onnxruntime's op for 16-bit types, ours with
    ``normalize_float32_sum=1``); for float32 the two are the same."""
    norm: NormSpec
    what: str
    """The op and its node, for reasons."""
    gamma: ir.Value | np.ndarray | None = None
    """onnxruntime's residual op only: its gamma (a value, or the elements of a new constant)."""
    bias_input: ir.Value | np.ndarray | None = None
    """onnxruntime's residual op only: its bias."""
    as_adds: str | None = None
    """Why a target that has a residual op writes this one as the sum's Adds and its norm op (None: it does not)."""

    @property
    def wide(self) -> bool:
        """Whether the norm reads the float32 sum of a 16-bit input."""
        return self.float32_sum and self.dtype in SIXTEEN_BIT


@dataclasses.dataclass
class Emitted:
    """What a target wrote for a residual norm op: Y, the sum, and the node the report names."""

    y: ir.Value
    total: ir.Value
    node: ir.Node


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


def emit_sum(op, spec: SkipSpec) -> tuple[ir.Value, ir.Value]:
    """(the value the norm reads, the ``sum`` output) as Adds: ``(x + skip) + bias``, each addition rounded to
    float32, then rounded to the type. For a 16-bit type the Adds are float32 ones between explicit Casts: onnxruntime
    has no 16-bit Add on the CPU, and the float32 one it puts in for a float16 Add loses that Add's rounding when a
    Cast to float32 follows (it removes the Cast pair it made)."""
    if spec.dtype == ir.DataType.FLOAT:
        total = op.Add(spec.x, spec.skip)
        if spec.bias is not None:
            total = op.Add(total, spec.bias)
        return total, total
    to_float = int(ir.DataType.FLOAT)
    wide = op.Add(op.Cast(spec.x, to=to_float), op.Cast(spec.skip, to=to_float))
    if spec.bias is not None:
        wide = op.Add(wide, op.Cast(spec.bias, to=to_float))
    total = op.Cast(wide, to=int(spec.dtype))
    return (wide if spec.float32_sum else total), total


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
    fuses_subgraphs = True
    """Whether the decomposed-norm rules run (a target that writes plain ONNX ops only converts norm ops)."""

    @property
    def emits(self) -> tuple[str, ...]:
        return (self.norm_op,) + ((self.skip.op,) if self.skip is not None else ())

    @property
    def residual_norm_ops(self) -> tuple[str, ...]:
        """The norm ops an Add before which the residual rule fuses (into :meth:`skip_for`'s op)."""
        return (self.norm_op,) if self.skip is not None else ()

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
    # Our residual op as Adds + the norm, so the model needs no library; onnxruntime's stays (onnxruntime runs it).
    converts = (*(op for op in NORM_OPS if op != ONNX_RMSNORM), OURS_SKIP_RMSNORM)
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


