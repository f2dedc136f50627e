"""The operator contract: names and defaults that models using this library's ops rely on, and those of the other
runtimes' norm ops the pass reads and writes; and the names the command line shares with the public API.

A model file stores these strings, so they are a file format (README, "The operators"): the C++ library registers
the same ones (``custom_op_src/ort/norm_op.h``). This module imports nothing, so that any layer may use it.
"""

from __future__ import annotations

# ---- our operators (custom_op_src/ort/norm_op.h) ------------------------------------------------------------------

OP_DOMAIN = "ort_rmsnorm"
OP_VERSION = 1
RMSNORM = "RMSNorm"
SKIP_RMSNORM = "SkipRMSNorm"
NORMALIZE_FLOAT32_SUM = "normalize_float32_sum"
"""``SkipRMSNorm``'s attribute: 1 normalizes the float32 sum ``x + skip (+ bias)`` before it is rounded to T (as
onnxruntime's ``SkipSimplifiedLayerNormalization`` does), 0 (default) the rounded sum (as a graph's ``Add``)."""
DEFAULT_EPSILON = 1e-5
"""The ``epsilon`` attribute's default in our ops, ``RMSNormalization`` and ``SimplifiedLayerNormalization``."""

# ---- the other runtimes' norm ops --------------------------------------------------------------------------------

MS_DOMAIN = "com.microsoft"
"""onnxruntime's contrib domain."""
ONNX_RMSNORM = "RMSNormalization"
"""ONNX's RMSNorm, from opset :data:`ONNX_RMSNORM_OPSET`."""
ONNX_RMSNORM_OPSET = 23
ORT_SIMPLIFIED_LAYER_NORM = "SimplifiedLayerNormalization"
"""onnxruntime's RMSNorm; onnxruntime registers it in the default ONNX domain, where ONNX itself has no such op."""
ORT_SKIP_SIMPLIFIED_LAYER_NORM = "SkipSimplifiedLayerNormalization"
"""onnxruntime's residual Add + RMSNorm, in :data:`MS_DOMAIN`."""
ORT_SKIP_DEFAULT_EPSILON = 1e-12
"""The ``epsilon`` attribute's default of :data:`ORT_SKIP_SIMPLIFIED_LAYER_NORM` (onnxruntime's contrib schema)."""

# ---- the pass's targets ------------------------------------------------------------------------------------------

TARGETS = ("custom", "onnx", "ort")
"""``custom``: our ops; ``onnx``: ``RMSNormalization``; ``ort``: onnxruntime's built-in ops (docs/fusion.md)."""
DEFAULT_TARGET = "custom"

# ---- verification ------------------------------------------------------------------------------------------------

OPTIMIZATION_LEVEL_NAMES = ("disabled", "basic", "extended", "all")
"""onnxruntime's graph optimization levels, as ``verify`` and the command line's ``--optimization`` name them."""
