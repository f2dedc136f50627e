"""QuantizeLinear/DequantizeLinear pairs inside a norm, as an int8 QDQ model has them (onnxruntime's
``quantize_static`` puts a pair after each quantized op: the mean, ``ms + eps``, the inverse, the normalized value).

By default a norm is never fused across such a pair: the pair rounds the value to its quantized type's grid and clips
it to the calibrated range, which the fused op would not. With ``through_qdq`` (an explicit request: CLI
``--through-qdq``) the pairs inside the norm are dropped and listed in the fusion's ``roundings``; those at its
boundaries (the DequantizeLinear its input comes from, the QuantizeLinear its output goes to) are no part of the match
and stay, so the fused op reads and writes the quantized values as the model does. A pair is dropped only when it is
a rounding: the QuantizeLinear and the DequantizeLinear take the same constant scale and zero point (and axis); a pair
that also rescales is refused with its reason.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ort_rmsnorm.contract import ONNX_DOMAINS

from ._facts import Facts, NotFusable, constant_array, dtype_name, label
from ._patterns import QUANTIZED

THROUGH_QDQ_HINT = "through_qdq=True, CLI --through-qdq, drops such pairs"
"""How a user asks for the pairs to be dropped (named in the default refusal)."""
_PAIRED_ATTRIBUTES = ("axis", "block_size")


def quantized_roundings(bindings: dict, facts: Facts, through_qdq: bool) -> list[str]:
    """The roundings of the Q/DQ pairs a norm's match holds (``_patterns.QUANTIZED``), for ``Fusion.roundings``;
    NotFusable when there are any and ``through_qdq`` is off, or when one is more than a rounding."""
    pairs = [(QUANTIZED[name], bindings[name].producer()) for name in QUANTIZED if bindings.get(name) is not None]
    # The first pair in the data's order names the reason (every form of the norm then gives the same one).
    return list(dict.fromkeys(_rounding(what, dequantize, facts, through_qdq) for what, dequantize in pairs))


def numerator_roundings(x: ir.Value, x_num: ir.Value, facts: Facts, through_qdq: bool) -> list[str] | None:
    """The divided value ``x_num`` is ``x`` through a Q/DQ pair of its own (a quantizer that gives each consumer its
    own pair, ``DedicatedQDQPair``, quantizes the division's input and not the square's): its rounding, as
    :func:`quantized_roundings`; None when ``x_num`` is no such pair."""
    dequantize = x_num.producer()
    if not _is(dequantize, "DequantizeLinear") or not dequantize.inputs or dequantize.inputs[0] is None:
        return None
    quantize = dequantize.inputs[0].producer()
    if not _is(quantize, "QuantizeLinear") or quantize.inputs[0] is not x:
        return None
    return [_rounding("the divided value", dequantize, facts, through_qdq)]


def _rounding(what: str, dequantize: ir.Node, facts: Facts, through_qdq: bool) -> str:
    quantize = dequantize.inputs[0].producer()
    if not through_qdq:
        raise NotFusable(
            f"a QuantizeLinear/DequantizeLinear pair inside the norm rounds {what} to its quantized type: the fused op "
            f"would not ({THROUGH_QDQ_HINT})",
            dequantize,
        )
    _check_rounding_only(quantize, dequantize, what, facts)
    verb = "are" if what == "the squares" else "is"
    return f"{what} {verb} quantized to {_quantized_type(quantize, facts)} by a Q/DQ pair"


def _is(node: ir.Node | None, op_type: str) -> bool:
    return node is not None and node.op_type == op_type and node.domain in ONNX_DOMAINS


def _check_rounding_only(quantize: ir.Node, dequantize: ir.Node, what: str, facts: Facts) -> None:
    """The pair only rounds and clips: the same constant scale and zero point on both sides, the same axis."""
    pair = f"the QuantizeLinear/DequantizeLinear pair {label(quantize)}/{label(dequantize)} on {what}"
    for index, side in ((1, "scale"), (2, "zero point")):
        values = [node.inputs[index] if len(node.inputs) > index else None for node in (quantize, dequantize)]
        if values == [None, None]:
            continue  # no zero point on either side: 0 on both
        arrays = [constant_array(value, facts) if value is not None else None for value in values]
        if any(array is None for array in arrays):
            raise NotFusable(f"{pair}: its {side} is not a constant on both sides", quantize)
        if arrays[0].shape != arrays[1].shape or not np.array_equal(arrays[0], arrays[1]):
            raise NotFusable(f"{pair} has different {side}s on its two sides: it rescales, not only rounds", quantize)
    for attribute in _PAIRED_ATTRIBUTES:
        q_attr, dq_attr = quantize.attributes.get(attribute), dequantize.attributes.get(attribute)
        if (q_attr.value if q_attr is not None else None) != (dq_attr.value if dq_attr is not None else None):
            raise NotFusable(f"{pair} has different {attribute} attributes on its two sides", quantize)


def _quantized_type(quantize: ir.Node, facts: Facts) -> str:
    dtype = facts.dtype(quantize.outputs[0])
    if dtype is None and len(quantize.inputs) > 2 and quantize.inputs[2] is not None:
        dtype = facts.dtype(quantize.inputs[2])
    return dtype_name(dtype if dtype is not None else ir.DataType.UINT8)  # QuantizeLinear's default
