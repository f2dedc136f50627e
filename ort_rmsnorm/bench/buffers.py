"""The input and output buffers that all contenders of a case share, and the check of a contender's outputs that
runs before it is timed."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from ..runtime import to_ort_value
from .contenders import DTYPES, EPSILON, Contender, Shape, scale_values


# Tolerances of the sanity check that runs before timing (catches a contender that does not write its output or
# computes something else); loose enough for graphs that round twice (the decomposed float16 graph).
CHECK_RTOL = {"float32": 1e-4, "float16": 4e-3, "bfloat16": 3e-2}
CHECKED_ROWS = 64


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype, alignment: int = 64) -> np.ndarray:
    """An uninitialized array starting on an `alignment`-byte boundary, as onnxruntime's CPU allocator places
    tensors (numpy only guarantees 16 bytes)."""
    size = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(size + alignment, np.uint8)
    start = -raw.ctypes.data % alignment
    return raw[start:start + size].view(dtype).reshape(shape)


class SharedBuffers:
    """Inputs (x, skip) and outputs (y, sum) of one shape, each pair one allocation so that the "copy2" contenders
    read x and skip as one [2 * rows, hidden] tensor and write y and sum the same way."""

    def __init__(self, shape: Shape, seed: int = 0):
        dtype = DTYPES[shape.dtype]
        rng = np.random.default_rng(seed)
        self.inputs = aligned_empty((2, shape.rows, shape.hidden), dtype)
        self.inputs[...] = rng.standard_normal(self.inputs.shape, dtype=np.float32)
        self.outputs = aligned_empty(self.inputs.shape, dtype)
        self.outputs.fill(0)
        self.values = {
            "x": to_ort_value(self.inputs[0]),
            "skip": to_ort_value(self.inputs[1]),
            "x2": to_ort_value(self.inputs.reshape(2 * shape.rows, shape.hidden)),
            "y": to_ort_value(self.outputs[0]),
            "sum": to_ort_value(self.outputs[1]),
            "y2": to_ort_value(self.outputs.reshape(2 * shape.rows, shape.hidden)),
        }

    def bind(self, session: ort.InferenceSession, doubled: bool) -> ort.IOBinding:
        """IO binding of `session` onto these buffers; `doubled` maps x -> x2 and y -> y2 (the copy2 contenders)."""
        binding = session.io_binding()
        rename = {"x": "x2", "y": "y2"} if doubled else {}
        for value in session.get_inputs():
            binding.bind_ortvalue_input(value.name, self.values[rename.get(value.name, value.name)])
        for value in session.get_outputs():
            binding.bind_ortvalue_output(value.name, self.values[rename.get(value.name, value.name)])
        return binding


def check_outputs(contender: Contender, shape: Shape, buffers: SharedBuffers) -> str | None:
    """None when the contender's outputs (written into the shared buffers) are right on sampled rows, else why not."""
    rows = np.unique(np.linspace(0, shape.rows - 1, CHECKED_ROWS).astype(int))
    x, skip = buffers.inputs[0][rows].astype(np.float64), buffers.inputs[1][rows].astype(np.float64)
    y, total = buffers.outputs[0][rows].astype(np.float64), buffers.outputs[1][rows].astype(np.float64)
    if contender.family in ("copy", "copy2"):
        same = np.array_equal(y, x) and (contender.family == "copy" or np.array_equal(total, skip))
        return None if same else "the copy's output differs from its input"
    normalized = x
    if contender.family == "skip":
        rounded_sum = (x + skip).astype(np.float32).astype(DTYPES[shape.dtype]).astype(np.float64)
        if not np.array_equal(total, rounded_sum):
            return "sum output differs from round(x + skip)"
        normalized = rounded_sum
    expected = normalized / np.sqrt(np.mean(normalized**2, axis=-1, keepdims=True) + EPSILON)
    expected *= scale_values(shape.hidden)
    rtol = CHECK_RTOL[shape.dtype]
    if not np.allclose(y, expected, rtol=rtol, atol=rtol):
        return f"Y is off by up to {np.max(np.abs(y - expected)):.3g} (tolerance {rtol:g})"
    return None
