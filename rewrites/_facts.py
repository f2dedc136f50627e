"""Facts about values that patterns cannot state: types and shapes, constants, reduction axes, broadcasting.

The onnxscript patterns say which nodes connect how. Everything that depends on values (is this a constant 2, which
axes does this reduction cover, does this scale broadcast without enlarging the output) is decided here, and every
"no" is a :class:`NotFusable` whose reason goes into the report.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from ort_rmsnorm.contract import ONNX_DOMAINS, STASH_TYPE
from ort_rmsnorm.model.types import TypeTable, constant_tensor, dim_key, same_dim

from ._folding import MAX_DEPTH, folded_array

# The types the fused operators take for X (and float32 for the scale).
NORM_DTYPES = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16})
SIXTEEN_BIT = frozenset({ir.DataType.FLOAT16, ir.DataType.BFLOAT16})
# Casts that change no value: the fused op may read the value before them.
EXACT_WIDENINGS = frozenset({(ir.DataType.FLOAT16, ir.DataType.FLOAT), (ir.DataType.BFLOAT16, ir.DataType.FLOAT)})
# The `stash_type` of the standard and onnxruntime norm ops that computes the statistic in float32, as ours do.
STASH_FLOAT32 = int(ir.DataType.FLOAT)


class Facts:
    """What the rules know of one run's values: their types and shapes (a :class:`TypeTable`), and the constants
    folded from constant-only subexpressions (:func:`constant_array`, computed once per value)."""

    def __init__(self, types: TypeTable) -> None:
        self.types = types
        self.folded: dict[ir.Value, np.ndarray | None] = {}
        self.proven: dict[tuple[ir.Value, int], int | None] = {}  # by :func:`proven_shape`: (value, dim from the end)

    def dtype(self, value: ir.Value) -> ir.DataType | None:
        return self.types.dtype(value)

    def shape(self, value: ir.Value) -> ir.Shape | None:
        return self.types.shape(value)

    def symbolic_shape(self, value: ir.Value) -> tuple[ir.Shape | None, str | None]:
        return self.types.symbolic_shape(value)


class NotFusable(Exception):
    """A candidate that stays unfused (or is fused less far); ``reason`` is what the report says."""

    def __init__(self, reason: str, *sources: ir.Node | ir.Value | None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.sources = tuple(source for source in sources if source is not None)


def dtype_name(dtype: ir.DataType | None) -> str:
    """``float32``, ``float16``, ``bfloat16``, ... (numpy's spelling)."""
    if dtype is None:
        return "unknown"
    try:
        return np.dtype(dtype.numpy()).name
    except TypeError:
        return dtype.name.lower()


def label(item: ir.Node | ir.Value) -> str:
    """How a node or value is named in reasons: its name, or its op type when unnamed."""
    if isinstance(item, ir.Node):
        return f"'{item.name}'" if item.name else f"<unnamed {item.op_type}>"
    return f"'{item.name}'" if item.name else "<unnamed value>"


def is_cast(node: ir.Node | None) -> bool:
    """A Cast or CastLike (both change only the type; CastLike takes it from its second input)."""
    return node is not None and node.op_type in ("Cast", "CastLike") and node.domain in ONNX_DOMAINS


def int_attribute(node: ir.Node, name: str, default: int | None = None) -> int | None:
    """An INT attribute's value, ``default`` when absent, None when it is not an INT (a malformed node)."""
    attr = node.attributes.get(name)
    if attr is None:
        return default
    return attr.value if attr.type == ir.AttributeType.INT else None


def float_attribute(node: ir.Node, name: str, default: float) -> float | None:
    attr = node.attributes.get(name)
    if attr is None:
        return default
    return float(attr.value) if attr.type == ir.AttributeType.FLOAT else None


def check_epsilon(value: float, what: str, source) -> None:
    """Our ops take a finite epsilon >= 0."""
    if not (math.isfinite(value) and value >= 0):
        raise NotFusable(f"{what}epsilon {value:g} is not finite and >= 0", source)


def require_stash_float32(node: ir.Node, what: str) -> None:
    stash_type = int_attribute(node, STASH_TYPE, STASH_FLOAT32)
    if stash_type != STASH_FLOAT32:
        raise NotFusable(f"{what} computes in stash_type {stash_type}, not float32", node)


# ---- dimensions and shapes ---------------------------------------------------------------------------------------


def is_one(dim) -> bool:
    return dim_key(dim) == 1


def format_shape(shape: ir.Shape | None) -> str:
    if shape is None:
        return "unknown"
    return "[" + ", ".join(str(key) if (key := dim_key(dim)) is not None else "?" for dim in shape.dims) + "]"


def static_dims(dims) -> tuple[int, ...] | None:
    keys = [dim_key(dim) for dim in dims]
    return tuple(keys) if all(isinstance(key, int) for key in keys) else None


def same_shape(a: ir.Shape | None, b: ir.Shape | None) -> bool:
    return a is not None and b is not None and a.rank() == b.rank() and all(map(same_dim, a.dims, b.dims))


# ---- constants ---------------------------------------------------------------------------------------------------


def constant_array(value: ir.Value | None, facts: Facts, depth: int = 0) -> np.ndarray | None:
    """The value of a constant: an initializer, a Constant node, or a small constant-only subexpression of them
    (``Reshape(Constant, Constant)``, ``Cast(Constant)``, ``Shape`` of a static shape, ...: see ``_folding``)."""
    tensor = constant_tensor(value)
    if tensor is not None:
        try:
            return tensor.numpy()
        except Exception:  # external data that cannot be read is no known constant  # noqa: BLE001
            return None
    node = value.producer() if value is not None else None
    if node is None or depth > MAX_DEPTH:
        return None
    if value not in facts.folded:
        operand = lambda source: constant_array(source, facts, depth + 1)  # noqa: E731
        facts.folded[value] = folded_array(node, value, facts.types, operand)
    return facts.folded[value]


def scalar_of(array: np.ndarray | None) -> float | None:
    """A numeric array with one element (any rank, all dims 1), as a Python float; None otherwise."""
    if array is None or array.size != 1:
        return None
    if array.dtype.kind not in "fiu" and array.dtype.name != "bfloat16":
        return None
    return float(array.reshape(()).astype(np.float64))


def constant_scalar(value: ir.Value | None, facts: Facts) -> float | None:
    """A constant with one element (any rank, all dims 1), as a Python float; None otherwise."""
    return scalar_of(constant_array(value, facts))


def require_scalar(value: ir.Value | None, what: str, facts: Facts, max_rank: int | None) -> float:
    """The scalar a constant operand holds; NotFusable unless it is one constant element that broadcasts harmlessly."""
    number = constant_scalar(value, facts)
    if number is None:
        producer = value.producer() if value is not None else None
        raise NotFusable(f"{what} is not a constant scalar", producer or value)
    rank = len(constant_array(value, facts).shape)
    if max_rank is not None and rank > max_rank:
        raise NotFusable(f"{what} has rank {rank}: broadcasting it would add dims", value)
    return number


# ---- reductions --------------------------------------------------------------------------------------------------


def reduction_axes(node: ir.Node, facts: Facts) -> list[int] | None:
    """The axes a Reduce* node reduces, as written (None: all axes), from the attribute or the constant input; for a
    GlobalAveragePool, every axis after the second (its definition), which needs the input's rank."""
    if node.op_type == "GlobalAveragePool":
        return global_pool_axes(node, facts)
    if "axes" in node.attributes:
        attr = node.attributes["axes"]
        if attr.type != ir.AttributeType.INTS:
            raise NotFusable(f"{node.op_type} {label(node)}: axes attribute is not a list of ints", node)
        axes = list(attr.value)
    elif len(node.inputs) > 1 and node.inputs[1] is not None:
        array = constant_array(node.inputs[1], facts)
        if array is None:
            raise NotFusable(f"{node.op_type} {label(node)}: axes are not constant", node)
        axes = [int(axis) for axis in array.reshape(-1)]
    else:
        axes = []
    if axes:
        return axes
    if int_attribute(node, "noop_with_empty_axes", 0) != 0:
        raise NotFusable(
            f"{node.op_type} {label(node)} has no axes and noop_with_empty_axes=1: it reduces nothing", node
        )
    return None


def global_pool_axes(node: ir.Node, facts: Facts) -> list[int]:
    """The axes GlobalAveragePool averages: [2, rank) of its input, keeping them as dims of 1. tf2onnx writes it for a
    ReduceMean over exactly those axes (at rank 3 the last axis alone); which axes they are follows from the rank."""
    shape = facts.shape(node.inputs[0]) if node.inputs else None
    if shape is None:
        raise NotFusable(
            f"rank unknown: GlobalAveragePool {label(node)} averages every axis after the second, and its input's "
            "rank is unknown",
            node,
        )
    if shape.rank() < 3:
        raise NotFusable(
            f"GlobalAveragePool {label(node)} on an input of rank {shape.rank()}: it averages the axes after the "
            "second, and there are none",
            node,
        )
    return list(range(2, shape.rank()))


def trailing_axis(axes: list[int] | None, rank: int | None, node: ir.Node) -> int:
    """The fused op's ``axis`` (negative, ``-k`` for k normalized dims) for reduction axes that are the trailing ones.

    Negative axes need no rank; positive ones (and "all axes") do.
    """
    if axes is None:
        if rank is None:
            raise NotFusable(
                f"rank unknown: {node.op_type} {label(node)} reduces all axes of an input of unknown rank", node
            )
        return -rank
    if any(axis >= 0 for axis in axes) and rank is None:
        raise NotFusable(f"rank unknown: cannot tell whether axes {axes} of {label(node)} are the trailing ones", node)
    if rank is not None and any(not -rank <= axis < rank for axis in axes):
        raise NotFusable(f"axes {axes} of {label(node)} are out of range for rank {rank}", node)
    negative = sorted({axis - rank if axis >= 0 else axis for axis in axes})
    if negative != list(range(-len(negative), 0)):
        where = f" (rank {rank})" if rank is not None else ""
        raise NotFusable(f"reduction over axes {axes}{where} is not over the trailing axes", node)
    return -len(negative)


def keeps_dims(node: ir.Node) -> bool:
    return int_attribute(node, "keepdims", 1) != 0


def check_dropped_dims(node: ir.Node, x_shape: ir.Shape | None, normalized: int) -> None:
    """keepdims=0: the statistic lost the reduced dims, so it broadcasts against X right-aligned, i.e. along the
    wrong axes, unless it has a single element (every non-normalized dim is 1)."""
    if keeps_dims(node):
        return
    if x_shape is None:
        raise NotFusable(f"keepdims=0 on {label(node)} and the input shape is unknown", node)
    leading = x_shape.dims[: x_shape.rank() - normalized]
    if not all(is_one(dim) for dim in leading):
        raise NotFusable(
            f"keepdims=0 on {label(node)}: the statistic of shape {format_shape(ir.Shape(leading))} broadcasts "
            "against the input along the wrong axes",
            node,
        )


# ---- the scale ---------------------------------------------------------------------------------------------------


def check_scale_shape(scale_shape: ir.Shape | None, x_shape: ir.Shape | None, normalized: int, scale_node) -> None:
    """A scale must broadcast onto X's normalized dims without changing X's shape: right-aligned, each dim 1 or the
    normalized dim, leading dims (along non-normalized axes) 1, and no more dims than X."""
    if scale_shape is None:
        raise NotFusable("scale shape unknown", scale_node)
    if x_shape is None:
        raise NotFusable(
            "input shape unknown: cannot tell whether the scale broadcasts onto the normalized dims", scale_node
        )
    described = f"scale of shape {format_shape(scale_shape)} on input {format_shape(x_shape)}"
    if scale_shape.rank() > x_shape.rank():
        raise NotFusable(f"{described} would enlarge the output (more dims than the input)", scale_node)
    for position in range(1, scale_shape.rank() + 1):
        scale_dim, x_dim = scale_shape.dims[-position], x_shape.dims[-position]
        if is_one(scale_dim) or (position <= normalized and same_dim(scale_dim, x_dim)):
            continue
        if position > normalized:
            raise NotFusable(f"{described} varies along non-normalized axes", scale_node)
        if is_one(x_dim):
            raise NotFusable(f"{described} would enlarge the output", scale_node)
        raise NotFusable(f"{described}: cannot prove the scale's dims match the normalized dims", scale_node)


# ---- dims the graph proves ----------------------------------------------------------------------------------------

# Ops whose output 0 has the shape of input 0.
_SHAPE_KEEPING = frozenset(
    {
        "Abs", "Cast", "CastLike", "Ceil", "Clip", "Cos", "DequantizeLinear", "Dropout", "Elu", "Erf", "Exp", "Floor",
        "Gelu", "HardSigmoid", "HardSwish", "Identity", "LeakyRelu", "Log", "LogSoftmax", "Neg", "QuantizeLinear",
        "Reciprocal", "Relu", "Round", "Selu", "Sigmoid", "Sign", "Sin", "Softmax", "Softplus", "Softsign", "Sqrt",
        "Tanh",
    }
)
# Ops whose output broadcasts their inputs (multidirectionally): a dim is the one operand's dim that is not 1.
_BROADCASTING = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "Where", "PRelu"})
_PROOF_DEPTH = 12  # producers followed back from the norm's input


def proven_shape(value: ir.Value | None, shape: ir.Shape | None, normalized: int, facts: Facts) -> ir.Shape | None:
    """``shape`` (the value's, as inference found it) with those of its trailing ``normalized`` dims that are not
    static replaced by the size the graph proves, where it does; the others as they were.

    A proof comes from what produces the value (a MatMul or Gemm by a weight of static dims, a broadcast with an
    operand of a static dim other than 1, a Reshape to a constant shape, a Transpose, ops that keep their input's
    shape: :func:`_proven_dim`) or from onnxruntime's symbolic shape inference, which follows dims through the graph's
    shape arithmetic. Never from the values the norm's output meets: ``Mul(normed, scale[D])`` has D columns whether
    the norm's last dim is D or 1."""
    if value is None or shape is None:
        return shape
    dims = list(shape.dims)
    symbolic = None
    for position in range(1, min(normalized, len(dims)) + 1):
        if isinstance(dim_key(dims[-position]), int):
            continue
        size = _proven_dim(value, position, facts, 0)
        if size is None:
            if symbolic is None:
                symbolic = facts.symbolic_shape(value)[0] or ir.Shape([])
            if symbolic.rank() == len(dims) and isinstance(dim_key(symbolic.dims[-position]), int):
                size = dim_key(symbolic.dims[-position])
        if size is not None:
            dims[-position] = size
    return ir.Shape(dims)


def _proven_dim(value: ir.Value | None, position: int, facts: Facts, depth: int) -> int | None:
    """The static size of the value's dim ``position`` from the end, as inference or the value's producer proves it;
    None when nothing does (each answer computed once: a value may be reached along many paths)."""
    if value is None:
        return None
    key = (value, position)
    if key not in facts.proven:
        facts.proven[key] = _dim_from_graph(value, position, facts, depth)
    return facts.proven[key]


def _dim_from_graph(value: ir.Value, position: int, facts: Facts, depth: int) -> int | None:
    shape = facts.shape(value)
    if shape is not None:
        if position > shape.rank():
            return None
        key = dim_key(shape.dims[-position])
        if isinstance(key, int):
            return key
    node = value.producer()
    if node is None or depth >= _PROOF_DEPTH or node.domain not in ONNX_DOMAINS:
        return None
    depth += 1
    op_type, inputs = node.op_type, node.inputs
    if op_type in _SHAPE_KEEPING and value is node.outputs[0] and inputs:
        return _proven_dim(inputs[0], position, facts, depth)
    if op_type in _BROADCASTING:
        all_ones = True
        for operand in inputs:
            operand_shape = facts.shape(operand) if operand is not None else None
            if operand_shape is not None and operand_shape.rank() < position:
                continue  # broadcast along this dim
            size = _proven_dim(operand, position, facts, depth)
            if size is not None and size != 1:
                return size
            all_ones = all_ones and size == 1
        return 1 if all_ones else None
    if op_type == "MatMul" and len(inputs) == 2:
        # A 1-D operand adds no dim of its own to the output: B's rank must be known, and A's for A's rows.
        a_shape, b_shape = (facts.shape(operand) if operand is not None else None for operand in inputs)
        if b_shape is None or b_shape.rank() < 2:
            return None
        if position == 1:
            return _proven_dim(inputs[1], 1, facts, depth)
        rows_known = position == 2 and a_shape is not None and a_shape.rank() >= 2
        return _proven_dim(inputs[0], 2, facts, depth) if rows_known else None
    if op_type == "Gemm" and len(inputs) >= 2 and position <= 2:
        if position == 1:  # N: B's dim 1, or dim 0 transposed
            return _proven_dim(inputs[1], 2 if int_attribute(node, "transB", 0) else 1, facts, depth)
        return _proven_dim(inputs[0], 1 if int_attribute(node, "transA", 0) else 2, facts, depth)
    if op_type == "Reshape" and len(inputs) == 2:
        target = constant_array(inputs[1], facts)
        if target is None or target.ndim != 1 or target.dtype.kind not in "iu" or position > target.size:
            return None
        size = int(target[-position])
        if size > 0:
            return size
        source_shape = facts.shape(inputs[0]) if inputs[0] is not None else None
        if size == 0 and not int_attribute(node, "allowzero", 0) and source_shape is not None:
            index = target.size - position  # 0 copies the input's dim at the same index
            if index < source_shape.rank():
                return _proven_dim(inputs[0], source_shape.rank() - index, facts, depth)
        return None
    if op_type == "Transpose" and inputs:
        perm = node.attributes.get("perm")
        if perm is None or perm.type != ir.AttributeType.INTS or position > len(perm.value):
            return None
        order = list(perm.value)
        axis = order[len(order) - position]
        return _proven_dim(inputs[0], len(order) - axis, facts, depth) if 0 <= axis < len(order) else None
    return None
