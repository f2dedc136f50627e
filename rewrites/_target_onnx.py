"""The ``onnx`` target: ONNX ``RMSNormalization`` (opset 23): epsilon inside the sqrt, scale of X's type with one
element per normalized element (a ones scale is added when the graph has none, a constant one that broadcasts is
expanded), no residual op; onnxruntime has no bfloat16 CPU kernel for it, so bfloat16 is skipped."""

from __future__ import annotations

import onnx_ir as ir

from ort_rmsnorm.contract import NORM_OPS, ONNX, ONNX_RMSNORM, ONNX_RMSNORM_OPSET, OURS_SKIP_RMSNORM

from ._emit import default_opset
from ._facts import NotFusable
from ._target_base import StandardLikeTarget


class OnnxTarget(StandardLikeTarget):
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
