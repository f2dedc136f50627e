"""Running onnxruntime sessions from numpy, bfloat16 included, and timing sessions side by side.

onnxruntime's Python API has no numpy type for bfloat16. Here bfloat16 arrays are ``ml_dtypes.bfloat16`` on both
sides: inputs travel as OrtValues built on their uint16 bits, outputs are copied out of the OrtValue's buffer.
"""

from __future__ import annotations

import ctypes
import random
import time
from typing import Callable, Iterator, Mapping, Sequence

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort

from ._library import register

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


def make_session(
    model: onnx.ModelProto | str | bytes,
    *,
    custom_ops: bool = True,
    optimization: ort.GraphOptimizationLevel = ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    threads: int | None = None,
    providers: Sequence[str] = ("CPUExecutionProvider",),
    options: ort.SessionOptions | None = None,
) -> ort.InferenceSession:
    """An InferenceSession for ``model`` (a ModelProto, a path or serialized bytes), with our ops registered."""
    options = options if options is not None else ort.SessionOptions()
    options.graph_optimization_level = optimization
    if threads is not None:
        options.intra_op_num_threads = threads
    if custom_ops:
        register(options)
    if isinstance(model, onnx.ModelProto):
        model = model.SerializeToString()
    return ort.InferenceSession(model, options, providers=list(providers))


def to_ort_value(array: np.ndarray) -> ort.OrtValue:
    """A CPU OrtValue on the array's memory (no copy when it is C-contiguous); bfloat16 via its uint16 bits."""
    if array.dtype == BFLOAT16:
        bits = np.require(array, requirements="C").view(np.uint16)
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, onnx.TensorProto.BFLOAT16)
    return ort.OrtValue.ortvalue_from_numpy(np.require(array, requirements="C"))  # keeps 0-d arrays 0-d


def to_numpy(value: ort.OrtValue) -> np.ndarray:
    """A numpy copy of a CPU OrtValue; bfloat16 as ml_dtypes.bfloat16."""
    if value.data_type() == "tensor(bfloat16)":
        shape = value.shape()
        size = BFLOAT16.itemsize * int(np.prod(shape, dtype=np.int64))  # (tensor_size_in_bytes: onnxruntime 1.21)
        raw = (ctypes.c_uint8 * size).from_address(value.data_ptr()) if size else b""
        return np.frombuffer(raw, np.uint16).copy().reshape(shape).view(BFLOAT16)
    # A copy: when a graph output is a graph input, onnxruntime returns the input's OrtValue, whose numpy view would
    # share (and outlive) the caller's feed array.
    return np.array(value.numpy(), copy=True)


def run(
    session: ort.InferenceSession,
    feeds: Mapping[str, np.ndarray],
    output_names: Sequence[str] | None = None,
) -> list[np.ndarray]:
    """``session.run`` that accepts and returns ml_dtypes.bfloat16 arrays."""
    values = {name: to_ort_value(np.asarray(array)) for name, array in feeds.items()}
    outputs = session.run_with_ort_values(list(output_names) if output_names else None, values)
    return [to_numpy(value) for value in outputs]


# --- timing sessions side by side ---------------------------------------------------------------------------------


def timing_options() -> ort.SessionOptions:
    """SessionOptions for sessions whose runs alternate with other sessions' runs. Each session owns an intra-op
    pool whose workers keep spinning for a while after Run() returns, taking a core from the next session's run: on
    2 cores a 47 ms prefill then measured 45-92 ms, depending on which session ran before. With this they stop as
    soon as Run() returns."""
    options = ort.SessionOptions()
    options.add_session_config_entry("session.force_spinning_stop", "1")
    return options


def time_interleaved(sessions: Sequence[ort.InferenceSession], feeds: Mapping[str, np.ndarray], runs: int, *,
                     warmup: int = 1, clock: Callable[[], int] = time.perf_counter_ns) -> list[list[float]]:
    """Seconds of ``runs`` runs of each session on ``feeds``, the sessions taking turns (which one goes first
    rotates), after ``warmup`` runs of each. ``clock``: a nanosecond clock (wall time by default)."""
    for session in sessions:
        for _ in range(warmup):
            run(session, feeds)
    samples: list[list[float]] = [[] for _ in sessions]
    for index in turns(len(sessions), runs):
        start = clock()
        run(sessions[index], feeds)
        samples[index].append((clock() - start) * 1e-9)
    return samples


def turns(count: int, repetitions: int) -> Iterator[int]:
    """Indices of ``count`` contenders taking turns ``repetitions`` times, each repetition in its own order: the
    first a rotation (each contender goes first as often as the others), the rest shuffled, seeded so that a run
    repeats, so that no contender always follows the same other one (whose caches and frequency it would inherit)."""
    order = random.Random(count)
    for repetition in range(repetitions):
        rest = [(repetition + offset) % count for offset in range(1, count)]
        order.shuffle(rest)
        yield repetition % count
        yield from rest
