"""The ``decomposed`` target: every norm op of the model (ours, onnxruntime's, ONNX's) written as plain ONNX ops that
any runtime at any opset runs, computing the same thing with the float32 accumulation explicit.

``Y = Cast_T(Cast_f32(X) * Reciprocal(Sqrt(ReduceMean(Cast_f32(X)^2) + eps)) * Cast_f32(scale))`` over the
normalized axes (epsilon outside the sqrt: ``Reciprocal(Sqrt(.) + eps)``); the Casts only for 16-bit types, so a
16-bit norm is computed in float32 and rounded once, as ours. A residual op is its sum's Adds (``_emit.emit_sum``)
and the norm of the sum. The steps round in float32 where ours keeps the statistic in float64: the two differ by a
few float32 roundings, inside ``verify``'s tolerance. The pass fuses such a graph back into our ops.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir

from ort_rmsnorm.contract import DECOMPOSED, EPS_OUTSIDE, NORM_OPS, SKIP_NORM_OPS

from ._emit import default_opset, scale_input
from ._facts import NORM_DTYPES, Facts, NotFusable, dtype_name
from ._specs import NormSpec
from ._target_base import Target

# ReduceMean takes its axes as an input from this opset on (before it, as an attribute).
AXES_INPUT_OPSET = 18
# Cast to bfloat16 exists from this opset on.
BFLOAT16_OPSET = 13


class DecomposedTarget(Target):
    name = DECOMPOSED
    norm_op = DECOMPOSED  # names the emitted nodes; it is no op
    converts = (*NORM_OPS, *SKIP_NORM_OPS)
    fuses_subgraphs = False

    @property
    def emits(self) -> tuple[str, ...]:
        return ()

    def label(self, node: ir.Node) -> str:
        return "decomposed ONNX ops"

    def name_for(self, node: ir.Node) -> str:
        return DECOMPOSED

    def adapt(self, spec: NormSpec, graph_like, model: ir.Model, facts: Facts) -> NormSpec:
        if spec.x_dtype not in NORM_DTYPES:
            raise NotFusable(f"{dtype_name(spec.x_dtype)} input: the norm ops take float32, float16, bfloat16")
        opset = default_opset(graph_like, model)
        if spec.x_dtype == ir.DataType.BFLOAT16 and opset < BFLOAT16_OPSET:
            raise NotFusable(f"the default opset is {opset}: a Cast to bfloat16 needs opset {BFLOAT16_OPSET}")
        return dataclasses.replace(spec, opset=opset)

    def emit(self, op, spec: NormSpec, name: str) -> ir.Value:
        to_float = int(ir.DataType.FLOAT)
        wide = spec.x_dtype != ir.DataType.FLOAT
        x = op.Cast(spec.x, to=to_float) if wide else spec.x
        axes = list(range(spec.axis, 0))  # the last -axis dims
        if spec.opset >= AXES_INPUT_OPSET:
            mean_square = op.ReduceMean(op.Mul(x, x), op.Constant(value=ir.tensor(np.array(axes, np.int64))),
                                        keepdims=1)
        else:
            mean_square = op.ReduceMean(op.Mul(x, x), axes=axes, keepdims=1)
        epsilon = op.Constant(value=ir.tensor(np.array(spec.epsilon, np.float32)))
        if spec.eps_placement == EPS_OUTSIDE:
            inverse = op.Reciprocal(op.Add(op.Sqrt(mean_square), epsilon))
        else:
            inverse = op.Reciprocal(op.Sqrt(op.Add(mean_square, epsilon)))
        if spec.scale is None:
            y = op.Mul(x, inverse, _name=None if wide else name)
        else:
            scale = scale_input(op, spec.scale, name)
            scale = op.Cast(scale, to=to_float) if spec.scale.dtype != ir.DataType.FLOAT else scale
            y = op.Mul(op.Mul(x, inverse), scale, _name=None if wide else name)
        return op.Cast(y, to=int(spec.x_dtype), _name=name) if wide else y
