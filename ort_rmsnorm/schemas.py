"""ONNX schemas of ``RMSNorm`` and ``SkipRMSNorm`` (domain ``ort_rmsnorm``, version 1), so that onnx's tools know the
ops: ``onnx.shape_inference.infer_shapes`` types their outputs (Y and ``sum`` have X's type and shape) and
``onnx.checker.check_model(full_check=True)`` validates their attributes, inputs and types (docs/ops.md).

The schemas live in onnx's process-wide registry; onnxruntime has its own (the library registers the ops there).
:func:`register_schemas` registers them (it imports onnx, about a second, so ``import ort_rmsnorm`` does not call it);
the package calls it wherever it runs onnx on models that may hold our ops: :func:`ort_rmsnorm.fuse` and
``fuse_file``, :func:`ort_rmsnorm.verify.verify`, ``fuse_folder`` and ``verify_folder``,
:func:`ort_rmsnorm.everywhere`, ``infer_symbolic_shapes`` and the command line's commands. Code that runs onnx's
checker or inference on a fused model before any of those calls it first. It says why not where it cannot: onnx before
1.19 takes no type inference function from Python (the schemas are registered without one: the checker validates,
``infer_shapes`` leaves our outputs untyped), and a schema of the same name someone else registered first is kept.

The inference function raises ``onnx.shape_inference.InferenceError`` for a node that breaks the contract where the
static types and shapes show it (an axis out of range, a scale that does not broadcast, a ``skip`` of another shape,
a type pair without a kernel, an attribute of the wrong type or value): onnxruntime refuses such a node too, at
session creation or when it runs. onnx reports an error raised in a Python inference function in every mode, ``strict_mode=False``
included, and without the node's name (it gives the function none); the message names the op and the values.

This module imports onnx only inside functions: it is imported by the package's ``__init__``.
"""

from __future__ import annotations

import math
import threading
from typing import Callable

from .contract import (
    DEFAULT_EPSILON,
    EPS_OUTSIDE_SQRT,
    NORMALIZE_FLOAT32_SUM,
    OP_DOMAIN,
    OP_VERSION,
    RMSNORM,
    SKIP_RMSNORM,
)

# docs/ops.md: T (X, Y, skip, sum, bias) and V (scale), as onnx's type strings and TensorProto element types.
FLOAT_TYPES = ("tensor(float)", "tensor(float16)", "tensor(bfloat16)")
_FLOAT, _FLOAT16, _BFLOAT16 = 1, 10, 16  # onnx.TensorProto.FLOAT, FLOAT16, BFLOAT16
_TYPE_NAMES = {_FLOAT: "float32", _FLOAT16: "float16", _BFLOAT16: "bfloat16"}
_SCALE_PAIRS = "f32/f32, f16/f16, f16/f32, bf16/bf16, bf16/f32"

_lock = threading.Lock()
_state: dict[str, object] = {}  # "registered": bool, "note": str; set by the first registration attempt


def register_schemas() -> bool:
    """Registers the ONNX schemas of ``RMSNorm`` and ``SkipRMSNorm`` in onnx's registry (imports onnx), so that
    ``onnx.checker`` and ``onnx.shape_inference`` know the ops; fusing, verifying, :func:`ort_rmsnorm.everywhere` and
    the command line call it, anything else that runs onnx on a fused model calls it first.

    Idempotent and thread-safe: the first call registers, later ones return its answer. Returns True when the schemas
    are registered (now or before), with or without type inference; False when they are not, and
    :func:`schema_note` says why. Never raises for an onnx that cannot."""
    with _lock:
        if not _state:
            _state.update(_register())
        return bool(_state.get("registered"))


def schema_note() -> str:
    """One line on the schemas: registered (with or without type inference), or why not. Registers them first."""
    register_schemas()
    return str(_state["note"])


def _register() -> dict[str, object]:
    try:
        import onnx
        import onnx.defs
    except ImportError as error:
        return {"registered": False, "note": f"not registered: onnx cannot be imported ({error})"}
    version = getattr(onnx, "__version__", "?")
    if not hasattr(onnx.defs, "register_schema") or not hasattr(onnx.defs, "OpSchema"):
        return {"registered": False, "note": f"not registered: onnx {version} cannot register schemas from Python"}
    with_inference = hasattr(onnx.defs.OpSchema, "set_type_and_shape_inference_function")
    registered, kept = [], []
    for schema in build_schemas(with_inference):
        existing = _registered_schema(onnx.defs, schema.name)
        if existing is not None:
            # Ours from an earlier import of this package (a reload, or a second copy of it), or someone else's.
            (registered if _is_ours(existing) else kept).append(schema.name)
            continue
        try:
            onnx.defs.register_schema(schema)
        except Exception as error:  # noqa: BLE001 - a registry that refuses it: the ops stay unknown to onnx
            return {"registered": False, "note": f"not registered: onnx {version} refused {schema.name}: {error}"}
        registered.append(schema.name)
    if kept:
        return {"registered": False,
                "note": f"not registered: onnx already has another schema for {', '.join(kept)} in domain "
                        f"{OP_DOMAIN!r} (kept)"}
    what = f"{' and '.join(registered)} (domain {OP_DOMAIN}, version {OP_VERSION}) registered with onnx {version}"
    if not with_inference:
        return {"registered": True,
                "note": f"{what}, without type inference: onnx {version} takes no inference function from Python "
                        "(onnx >= 1.19), so infer_shapes leaves their outputs untyped"}
    return {"registered": True, "note": f"{what}, with type and shape inference"}


def _registered_schema(defs, name: str):
    try:
        return defs.get_schema(name, OP_VERSION, OP_DOMAIN)
    except defs.SchemaError:
        return None


_DOC_MARK = "ort_rmsnorm custom-op library"


def _is_ours(schema) -> bool:
    return _DOC_MARK in (schema.doc or "")


# ---- the schemas ----------------------------------------------------------------------------------------------


def build_schemas(with_inference: bool = True) -> list:
    """New ``onnx.defs.OpSchema`` objects for both ops (not registered)."""
    from onnx import defs, helper

    schema_class = defs.OpSchema
    options = schema_class.FormalParameterOption

    def parameter(name: str, type_str: str, description: str, optional: bool = False):
        return schema_class.FormalParameter(name, type_str, description,
                                            param_option=options.Optional if optional else options.Single)

    def attribute(name: str, default: int | float, description: str):
        return schema_class.Attribute(name, helper.make_attribute(name, default), description)

    attributes = [
        attribute("axis", -1, "First normalized axis: dims [axis, rank) are normalized together; [-rank, rank)."),
        attribute("epsilon", DEFAULT_EPSILON, "Finite and >= 0."),
        attribute(EPS_OUTSIDE_SQRT, 0, "0: X / sqrt(ms + epsilon); 1: X / (sqrt(ms) + epsilon)."),
    ]
    type_constraints = [
        ("T", list(FLOAT_TYPES), "X, Y (and skip, bias, sum): float32, float16 or bfloat16; Y has X's type."),
        ("V", list(FLOAT_TYPES), "scale: X's type T, or float32."),
    ]
    scale = parameter("scale", "V", "Optional gain, broadcastable onto X.shape[axis:]; absent: 1.", True)
    rmsnorm = schema_class(
        RMSNORM, OP_DOMAIN, OP_VERSION,
        f"RMSNorm of the {_DOC_MARK}: Y = X / sqrt(mean(X[..., axis:]^2) + epsilon) * scale, the statistic "
        "accumulated in float32 or wider, each output rounded once to T (docs/ops.md).",
        inputs=[parameter("X", "T", "Input."), scale],
        outputs=[parameter("Y", "T", "X normalized: X's type and shape.")],
        type_constraints=type_constraints,
        attributes=attributes,
    )
    skip_rmsnorm = schema_class(
        SKIP_RMSNORM, OP_DOMAIN, OP_VERSION,
        f"SkipRMSNorm of the {_DOC_MARK}: s = (X + skip) + bias in float32, sum = round_T(s), Y = RMSNorm(sum) "
        "(normalize_float32_sum = 1: RMSNorm(s)) (docs/ops.md).",
        inputs=[
            parameter("X", "T", "Input."),
            parameter("skip", "T", "Residual, of X's shape."),
            scale,
            parameter("bias", "T", "Optional, of X's type, broadcastable onto X.shape[axis:].", True),
        ],
        outputs=[
            parameter("Y", "T", "The sum normalized: X's type and shape."),
            parameter("sum", "T", "Optional: X + skip (+ bias) rounded to T; X's type and shape.", True),
        ],
        type_constraints=type_constraints,
        attributes=[*attributes, attribute(NORMALIZE_FLOAT32_SUM, 0,
                                           "0: Y normalizes round_T(s); 1: Y normalizes the float32 s.")],
    )
    if with_inference:
        rmsnorm.set_type_and_shape_inference_function(_inference(RMSNORM))
        skip_rmsnorm.set_type_and_shape_inference_function(_inference(SKIP_RMSNORM))
    return [rmsnorm, skip_rmsnorm]


# ---- type and shape inference ----------------------------------------------------------------------------------


def _inference(op: str) -> Callable:
    def infer(context) -> None:
        _infer(context, op)

    return infer


def _fail(op: str, problem: str):
    from onnx.shape_inference import InferenceError

    return InferenceError(f"[ShapeInferenceError] {op}: {problem}")


_ATTRIBUTE_KINDS = {1: "a float", 2: "an int", 3: "a string", 4: "a tensor", 5: "a graph"}


def _attribute(context, op: str, name: str, kind: int, default):
    attribute = context.get_attribute(name)
    if attribute is None:
        return default
    if attribute.type != kind:
        raise _fail(op, f"attribute '{name}' must be {_ATTRIBUTE_KINDS[kind]}, got "
                        f"{_ATTRIBUTE_KINDS.get(attribute.type, 'another type (a list)')}")
    return attribute.i if kind == 2 else attribute.f


def _dims(type_proto) -> list[int | str | None] | None:
    """The dims of a tensor type: sizes, symbol names, None where unknown; None when the rank is unknown."""
    if type_proto is None or not type_proto.HasField("tensor_type") or not type_proto.tensor_type.HasField("shape"):
        return None
    return [dim.dim_value if dim.HasField("dim_value") else (dim.dim_param or None)
            for dim in type_proto.tensor_type.shape.dim]


def _elem_type(type_proto) -> int:
    return type_proto.tensor_type.elem_type if type_proto is not None and type_proto.HasField("tensor_type") else 0


def _shape_text(dims: list) -> str:
    return "[" + ", ".join(str(dim) if dim is not None else "?" for dim in dims) + "]"


def _infer(context, op: str) -> None:
    axis = _attribute(context, op, "axis", 2, -1)
    epsilon = _attribute(context, op, "epsilon", 1, DEFAULT_EPSILON)
    if not math.isfinite(epsilon) or epsilon < 0:
        raise _fail(op, f"attribute 'epsilon' must be finite and >= 0, got {epsilon:.9g}")
    names = [EPS_OUTSIDE_SQRT, NORMALIZE_FLOAT32_SUM]
    if op == RMSNORM and context.get_attribute(NORMALIZE_FLOAT32_SUM) is not None:
        raise _fail(op, f"attribute '{NORMALIZE_FLOAT32_SUM}' is SkipRMSNorm's; RMSNorm has no sum to normalize")
    for name in names:
        value = _attribute(context, op, name, 2, 0)
        if value not in (0, 1):
            raise _fail(op, f"attribute '{name}' must be 0 or 1, got {value}")

    skip = op == SKIP_RMSNORM
    count = context.get_num_inputs()

    def input_type(index: int):
        return context.get_input_type(index) if index < count and context.has_input(index) else None

    x_type = input_type(0)
    x_elem, x_dims = _elem_type(x_type), _dims(x_type)
    if skip:
        skip_type = input_type(1)
        skip_elem, skip_dims = _elem_type(skip_type), _dims(skip_type)
        if x_elem and skip_elem and x_elem != skip_elem:
            raise _fail(op, f"skip of type {_type_name(skip_elem)} must have X's type {_type_name(x_elem)}")
        x_dims = _merged_dims(op, x_dims, skip_dims)
        x_elem = x_elem or skip_elem
    if x_dims is not None:
        rank = len(x_dims)
        if rank == 0:
            raise _fail(op, "X is a scalar; it needs at least one dim to normalize")
        if not -rank <= axis < rank:
            raise _fail(op, f"axis {axis} is out of range for X of shape {_shape_text(x_dims)} "
                            f"(valid: {-rank} to {rank - 1})")
    scale_type = input_type(2 if skip else 1)
    scale_elem = _elem_type(scale_type)
    if x_elem and scale_elem and scale_elem not in (x_elem, _FLOAT):
        raise _fail(op, f"scale of type {_type_name(scale_elem)} with X of type {_type_name(x_elem)}: the "
                        f"(X, scale) pairs are {_SCALE_PAIRS}")
    _check_broadcast(op, "scale", _dims(scale_type), x_dims, axis)
    if skip:
        bias_type = input_type(3)
        bias_elem = _elem_type(bias_type)
        if x_elem and bias_elem and bias_elem != x_elem:
            raise _fail(op, f"bias of type {_type_name(bias_elem)} must have X's type {_type_name(x_elem)}")
        _check_broadcast(op, "bias", _dims(bias_type), x_dims, axis)

    if not x_elem:
        return  # nothing to say about Y's type
    from onnx import helper

    output = helper.make_tensor_type_proto(x_elem, None)
    if x_dims is not None:
        output = helper.make_tensor_type_proto(x_elem, x_dims)
    context.set_output_type(0, output)
    if skip and context.get_num_outputs() > 1 and context.has_output(1):
        context.set_output_type(1, output)


def _type_name(elem_type: int) -> str:
    if elem_type in _TYPE_NAMES:
        return _TYPE_NAMES[elem_type]
    from onnx import TensorProto

    known = elem_type in TensorProto.DataType.values()
    return TensorProto.DataType.Name(elem_type).lower() if known else str(elem_type)


def _merged_dims(op: str, x_dims, skip_dims):
    """X's dims with skip's where X's are unknown (skip must have X's shape); an error where both are known and
    differ."""
    if x_dims is None or skip_dims is None:
        return x_dims if x_dims is not None else skip_dims
    conflict = len(x_dims) != len(skip_dims) or any(
        isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(x_dims, skip_dims))
    if conflict:
        raise _fail(op, f"skip of shape {_shape_text(skip_dims)} must have the shape of X {_shape_text(x_dims)}")
    return [a if isinstance(a, int) or (a is not None and not isinstance(b, int)) else b
            for a, b in zip(x_dims, skip_dims)]


def _check_broadcast(op: str, name: str, dims, x_dims, axis: int) -> None:
    """A scale or bias broadcasts onto X.shape[axis:] without changing X's shape: right-aligned, each dim equal to
    the normalized dim or 1, extra leading dims 1. Checked where both are known (a symbol is not a size)."""
    if dims is None or x_dims is None:
        return
    normalized = x_dims[axis % len(x_dims):]
    bad = len(dims) > len(x_dims)
    for k in range(1, len(dims) + 1):
        dim = dims[-k]
        if not isinstance(dim, int) or dim == 1:
            continue
        target = normalized[-k] if k <= len(normalized) else 1
        if isinstance(target, int) and dim != target:
            bad = True
    if bad:
        raise _fail(op, f"{name} of shape {_shape_text(dims)} does not broadcast onto the normalized dims "
                        f"{_shape_text(normalized)} of X {_shape_text(x_dims)} (each {name} dim must equal the "
                        "normalized dim or be 1, extra leading dims must be 1)")
