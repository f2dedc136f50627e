"""The operator contract: names and defaults that models using this library's ops rely on, and those of the other
runtimes' norm ops the pass reads and writes; and the names the command line shares with the public API.

A model file stores these strings, so they are a file format (docs/ops.md, the operators' full contract): the C++
library registers the same ones (``custom_op_src/ort/norm_op.h``). This module imports nothing, so that any layer may
use it.
"""

from __future__ import annotations

# ---- our operators (custom_op_src/ort/norm_op.h) ------------------------------------------------------------------

OP_DOMAIN = "ort_rmsnorm"
OP_VERSION = 1
RMSNORM = "RMSNorm"
SKIP_RMSNORM = "SkipRMSNorm"
DEFAULT_EPSILON = 1e-5
"""The ``epsilon`` attribute's default in our ops, ``RMSNormalization`` and ``SimplifiedLayerNormalization``."""

# Attributes. ``axis``, ``epsilon`` and ``stash_type`` are spelled alike in the other runtimes' norm ops.
AXIS = "axis"
EPSILON = "epsilon"
EPS_OUTSIDE_SQRT = "eps_outside_sqrt"
"""1: epsilon is added to the RMS, ``x / (sqrt(ms) + eps)``; 0 (default): inside the sqrt, ``x / sqrt(ms + eps)``."""
NORMALIZE_FLOAT32_SUM = "normalize_float32_sum"
"""``SkipRMSNorm``'s attribute: 1 normalizes the float32 sum ``x + skip (+ bias)`` before it is rounded to T (as
onnxruntime's ``SkipSimplifiedLayerNormalization`` does), 0 (default) the rounded sum (as a graph's ``Add``)."""
STASH_TYPE = "stash_type"
"""The type ``RMSNormalization`` and onnxruntime's norm ops compute the statistic in (1, float32, as ours do)."""

# Where epsilon is added, as the fusion report names it.
EPS_INSIDE = "inside_sqrt"
EPS_OUTSIDE = "outside_sqrt"
EPS_NONE = "none"
"""No epsilon: the graph adds none."""

# ---- the other runtimes' norm ops --------------------------------------------------------------------------------

ONNX_DOMAINS = ("", "ai.onnx")
"""The two spellings of ONNX's default domain."""
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


def qualified(domain: str, op_type: str) -> str:
    """An op's name as the fusion report writes it: ``domain.op_type``, or the op type alone in ONNX's domain."""
    return op_type if domain in ONNX_DOMAINS else f"{domain}.{op_type}"


def unqualified(name: str) -> tuple[str, str]:
    """``(domain, op_type)`` of a :func:`qualified` name (domain ``""`` for ONNX's)."""
    domain, _, op_type = name.rpartition(".")
    return domain, op_type


# The norm ops the pass knows, as :func:`qualified` names them.
OURS_RMSNORM = qualified(OP_DOMAIN, RMSNORM)
OURS_SKIP_RMSNORM = qualified(OP_DOMAIN, SKIP_RMSNORM)
ORT_SKIP_NORM = qualified(MS_DOMAIN, ORT_SKIP_SIMPLIFIED_LAYER_NORM)
NORM_OPS = (ONNX_RMSNORM, ORT_SIMPLIFIED_LAYER_NORM, OURS_RMSNORM)
"""The single-output norm ops: each normalizes dims ``[axis, rank)`` and broadcasts its scale onto them."""
SKIP_NORM_OPS = (OURS_SKIP_RMSNORM, ORT_SKIP_NORM)
"""The residual norm ops: ``Add`` + norm."""

# ---- the pass's targets ------------------------------------------------------------------------------------------

CUSTOM, ONNX, ORT, AUTO, DECOMPOSED = "custom", "onnx", "ort", "auto", "decomposed"
TARGETS = (CUSTOM, ONNX, ORT, AUTO, DECOMPOSED)
"""``custom``: our ops; ``onnx``: ``RMSNormalization``; ``ort``: onnxruntime's built-in ops; ``auto``: per norm, ours or
onnxruntime's, whichever is faster on the CPU; ``decomposed``: plain ONNX ops (docs/fusion.md). The pass defines what
each emits (``rewrites/_target_<name>.py``) and lists them in this order (``rewrites/_target_list.py``)."""
DEFAULT_TARGET = CUSTOM

# ---- verification ------------------------------------------------------------------------------------------------

OPTIMIZATION_LEVEL_NAMES = ("disabled", "basic", "extended", "all")
"""onnxruntime's graph optimization levels, as ``verify`` and the command line's ``--optimization`` name them."""
