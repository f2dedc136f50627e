"""Constants computed by constant-only subexpressions: ``Reshape(Constant, Constant)`` for the reduction axes of a
raw dynamo export, ``Cast(Constant)`` for epsilon, ``Shape`` of a static shape, ...

The pass reads such values (axes, exponents, epsilon, ``1/D``, a scale, ``1 + w``) without rewriting the model: each
node is evaluated on its own with ONNX's reference implementation, from inputs that are constants or folded in turn.
Only small tensors are folded (:data:`MAX_FOLDED_BYTES`), so weights are never computed on.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import onnx
import onnx_ir as ir
from onnx.reference import ReferenceEvaluator

from ort_rmsnorm.contract import ONNX_DOMAINS
from ort_rmsnorm.model.types import TypeTable

MAX_FOLDED_BYTES = 1 << 16
"""The largest input or result of a folded node: 64 KiB covers axes, shapes, scalars and a scale of 16384 floats."""
MAX_DEPTH = 16
"""How many folded nodes deep a constant may be computed."""
# Deterministic ops whose result depends on their inputs' values alone.
FOLDABLE = frozenset(
    {
        "Abs", "Add", "Cast", "CastLike", "Concat", "ConstantOfShape", "DequantizeLinear", "Div", "Equal", "Expand",
        "Flatten", "Gather", "Identity", "Max", "Min", "Mul", "Neg", "Pow", "Range", "Reciprocal", "Reshape", "Shape",
        "Slice", "Sqrt", "Squeeze", "Sub", "Transpose", "Unsqueeze", "Where",
    }
)  # fmt: skip
_LEGACY_ATTRIBUTES = {"axes": 11, "starts": 9}  # an attribute spelling of these ops' inputs, and an opset that has it


def folded_array(
    node: ir.Node, output: ir.Value, types: TypeTable, operand: Callable[[ir.Value], np.ndarray | None]
) -> np.ndarray | None:
    """The value of ``output`` of ``node`` when every input it depends on is known (``operand(value)``: the array a
    value holds, or None), else None."""
    if node.domain not in ONNX_DOMAINS or node.op_type not in FOLDABLE:
        return None
    if node.op_type == "Shape":
        dims = _shape_dims(node, types)
        return np.array(dims, np.int64) if dims is not None and None not in dims else None
    if node.op_type == "Gather" and _is_shape(node.inputs[0]):
        return _gathered_dims(node, types, operand)
    arrays: list[np.ndarray | None] = []
    for index, value in enumerate(node.inputs):
        if value is None:
            arrays.append(None)
            continue
        if node.op_type == "CastLike" and index == 1:  # only its type counts
            dtype = types.dtype(value)
            if dtype is None:
                return None
            arrays.append(np.zeros((), dtype.numpy()))
            continue
        array = operand(value)
        if array is None or array.nbytes > MAX_FOLDED_BYTES:
            return None
        arrays.append(array)
    if not _small_result(node, arrays):
        return None
    try:
        results = _evaluate(node, arrays)
    except Exception:  # noqa: BLE001 - an op the reference cannot run on these inputs is simply not folded
        return None
    result = np.asarray(results[output.index() or 0]) if output.index() is not None else None
    if result is None or result.nbytes > MAX_FOLDED_BYTES:
        return None
    return result


def _shape_dims(node: ir.Node, types: TypeTable) -> list[int | None] | None:
    """The dims a Shape node gives: sizes, None where a dim is symbolic; None when the rank is unknown."""
    shape = types.shape(node.inputs[0]) if node.inputs and node.inputs[0] is not None else None
    if shape is None:
        return None
    dims = [int(dim) if isinstance(dim, int) else None for dim in shape.dims]
    return dims[_int_attribute(node, "start", 0) : _int_attribute(node, "end", len(dims))]


def _is_shape(value: ir.Value | None) -> bool:
    producer = value.producer() if value is not None else None
    return producer is not None and producer.op_type == "Shape" and producer.domain in ONNX_DOMAINS


def _gathered_dims(node: ir.Node, types: TypeTable, operand) -> np.ndarray | None:
    """Gather(Shape(x), indices): the static dims it picks, though others of x are symbolic (``x.shape[-1]``)."""
    dims = _shape_dims(node.inputs[0].producer(), types)
    indices = operand(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] is not None else None
    if dims is None or indices is None or indices.dtype.kind not in "iu" or _int_attribute(node, "axis", 0) != 0:
        return None
    picked = [dims[int(index)] if -len(dims) <= int(index) < len(dims) else None for index in indices.reshape(-1)]
    if None in picked:
        return None
    return np.array(picked, np.int64).reshape(indices.shape)


def _int_attribute(node: ir.Node, name: str, default: int) -> int:
    attr = node.attributes.get(name)
    return int(attr.value) if attr is not None and attr.type == ir.AttributeType.INT else default


def _small_result(node: ir.Node, arrays: list[np.ndarray | None]) -> bool:
    """Ops whose result can be much larger than their inputs: only when the result stays small."""
    if node.op_type == "ConstantOfShape" and arrays and arrays[0] is not None:
        return math.prod(int(dim) for dim in arrays[0].reshape(-1)) * 8 <= MAX_FOLDED_BYTES
    if node.op_type == "Expand" and len(arrays) == 2 and all(array is not None for array in arrays):
        try:
            shape = np.broadcast_shapes(arrays[0].shape, tuple(int(dim) for dim in arrays[1].reshape(-1)))
        except ValueError:
            return False
        return math.prod(shape) * arrays[0].itemsize <= MAX_FOLDED_BYTES
    if node.op_type == "Range" and len(arrays) == 3 and all(array is not None and array.size == 1 for array in arrays):
        start, limit, delta = (float(array.reshape(())) for array in arrays)
        return delta != 0 and max(0.0, math.ceil((limit - start) / delta)) * 8 <= MAX_FOLDED_BYTES
    return True


def _evaluate(node: ir.Node, arrays: list[np.ndarray | None]) -> list:
    names = [f"in{index}" if array is not None else "" for index, array in enumerate(arrays)]
    proto = ir.serde.serialize_node(node)
    del proto.input[:]
    proto.input.extend(names)
    del proto.output[:]
    proto.output.extend(f"out{index}" for index in range(len(node.outputs)))
    proto.name = ""
    opset = next((version for attr, version in _LEGACY_ATTRIBUTES.items() if attr in node.attributes), None)
    if opset is None:
        evaluator = ReferenceEvaluator(proto)
    else:
        inputs = [onnx.helper.make_empty_tensor_value_info(name) for name in names if name]
        outputs = [onnx.helper.make_empty_tensor_value_info(name) for name in proto.output]
        graph = onnx.helper.make_graph([proto], "folded", inputs, outputs)
        evaluator = ReferenceEvaluator(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)]))
    return evaluator.run(None, {name: array for name, array in zip(names, arrays) if name})
