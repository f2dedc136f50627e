"""The scale a norm's output is multiplied by, as the fused op takes it: the graph's value, ``1 + w`` (folded when w is
a constant), or nothing for ones that change nothing. Shared by the rules that fuse a decomposed norm and those that
convert a norm op."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ._facts import (
    Facts,
    NotFusable,
    check_scale_shape,
    constant_array,
    constant_scalar,
    is_cast,
    scalar_of,
    static_dims,
)
from ._specs import Scale


def scale_spec(scale: ir.Value | None, x_shape: ir.Shape | None, normalized: int, facts: Facts) -> Scale | None:
    """What multiplies the normalized value: it must broadcast onto the normalized dims alone. None for no scale, or
    for ones that change nothing (torch's opset-23 export of a ``torch.nn.RMSNorm`` without weight passes
    ``ConstantOfShape(Shape(x), 1)`` to RMSNormalization)."""
    if scale is None or _ones_not_enlarging(scale, x_shape, facts):
        return None
    check_scale_shape(facts.shape(scale), x_shape, normalized, scale.producer() or scale)
    dtype = facts.dtype(scale)
    if dtype is None:
        raise NotFusable("scale type unknown", scale)
    producer = scale.producer()
    if producer is not None and producer.op_type == "Add" and producer.domain == "":
        folded = _one_plus_constant(producer, scale, facts)
        if folded is not None:
            return Scale(None, folded, "folded 1+w", dtype)
        if any(_is_one(operand, facts) for operand in producer.inputs):
            return Scale(scale, None, "1+w", dtype)
    form = "cast tensor" if is_cast(producer) else "tensor"
    return Scale(scale, None, form, dtype)


def _ones_not_enlarging(scale: ir.Value, x_shape: ir.Shape | None, facts: Facts) -> bool:
    """ConstantOfShape filled with 1, of a shape that broadcasts onto X without enlarging it (its type is X's, as the
    Mul, or the converted op's output type, requires)."""
    producer = scale.producer()
    if producer is None or producer.op_type != "ConstantOfShape" or producer.domain != "":
        return False
    fill = producer.attributes.get("value")
    if fill is None or fill.type != ir.AttributeType.TENSOR:
        return False  # the default fill is 0
    if scalar_of(fill.value.numpy()) != 1.0 or x_shape is None:
        return False
    try:
        check_scale_shape(facts.shape(scale), x_shape, x_shape.rank(), producer)
    except NotFusable:
        return False
    return True


def _is_one(value: ir.Value | None, facts: Facts) -> bool:
    return constant_scalar(value, facts) == 1.0


def _one_plus_constant(add: ir.Node, scale: ir.Value, facts: Facts) -> np.ndarray | None:
    """(1 + w) with w constant, computed as the graph would (in the Add's type, one rounding)."""
    for one, weight in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
        if not _is_one(one, facts):
            continue
        array = constant_array(weight, facts)
        if array is None:
            return None
        dtype = facts.dtype(scale).numpy()
        folded = array.astype(dtype) + np.ones((), dtype)
        shape = facts.shape(scale)
        return folded if shape is not None and folded.shape == static_dims(shape.dims) else None
    return None
