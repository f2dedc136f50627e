"""CPU benchmark: our RMSNorm / SkipRMSNorm against onnxruntime's norm kernels, the decomposed graph and a copy.

Every contender is a small ONNX model run by onnxruntime on the CPU with IO binding. All contenders of one case
(dtype, rows, hidden size, threads) read and write the *same* pre-built OrtValues, so Python overhead, buffer
placement and cache state are the same for all of them. Repetitions are interleaved: each repetition times every
contender once (round-robin, starting point rotated), and a contender's time is the median over repetitions.

Bandwidth counts the bytes a contender must move at least once: X + Y + scale for a norm, X + skip + Y + sum +
scale for a skip norm, input + output for a copy. The roofline of a case is the fastest onnxruntime copy of the same
bytes (see docs/benchmarks.md for why a Gather and a same-type Cast, and not an Identity).

``ort-rmsnorm bench`` checks the optional dependencies a run needs (ort_rmsnorm.cli), then calls ``run_bench(args)``;
``python -m ort_rmsnorm.bench`` is that command.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from . import OP_DOMAIN, OP_VERSION, build_info
from .model_io import write_atomically, write_text_atomically
from .runtime import BFLOAT16, make_session, timing_options, to_ort_value, turns

DTYPES = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16), "bfloat16": BFLOAT16}
ONNX_TYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}
HIDDEN_SIZES = (768, 1024, 2048, 4096, 5120, 8192, 16384)
PREFILL_ROWS = 2048
EPSILON = 1e-5
ISA_ENV = "ORT_RMSNORM_CPU_ISA"

# Tolerances of the sanity check that runs before timing (catches a contender that does not write its output or
# computes something else); loose enough for graphs that round twice (the decomposed float16 graph).
CHECK_RTOL = {"float32": 1e-4, "float16": 4e-3, "bfloat16": 3e-2}
CHECKED_ROWS = 64


_STATE = ort.capi.onnxruntime_pybind11_state
# What onnxruntime raises when it has no kernel for a contender's node or cannot run it.
ORT_ERRORS = (_STATE.Fail, _STATE.NotImplemented, _STATE.InvalidGraph, _STATE.InvalidArgument, _STATE.RuntimeException)


# --- models --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    dtype: str
    rows: int
    hidden: int

    @property
    def onnx_type(self) -> int:
        return ONNX_TYPES[self.dtype]

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype].itemsize

    @property
    def tensor_bytes(self) -> int:
        return self.rows * self.hidden * self.itemsize


def _tensor(name: str, shape: Shape, rows: int | None = None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, shape.onnx_type, [rows or shape.rows, shape.hidden])


def _scale_values(hidden: int) -> np.ndarray:
    """The learned gain: deterministic, away from 1 so that a dropped scale fails the check."""
    return (0.5 + (np.arange(hidden) % 7) / 7.0).astype(np.float64)


def _initializer(name: str, values: np.ndarray, dtype: str) -> onnx.TensorProto:
    typed = np.asarray(values).astype(DTYPES[dtype])
    raw = typed.view(np.uint16) if typed.dtype == BFLOAT16 else typed
    return helper.make_tensor(name, ONNX_TYPES[dtype], typed.shape, raw.tobytes(), raw=True)


DEFAULT_OPSETS = (("", 18),)
OURS_OPSETS = (("", 18), (OP_DOMAIN, OP_VERSION))


def _model(nodes, inputs, outputs, initializers=(), opsets=DEFAULT_OPSETS) -> onnx.ModelProto:
    graph = helper.make_graph(list(nodes), "bench", list(inputs), list(outputs), initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets], ir_version=10)


def _norm_model(nodes, shape: Shape, initializers, opsets=DEFAULT_OPSETS) -> onnx.ModelProto:
    """x -> y."""
    return _model(nodes, [_tensor("x", shape)], [_tensor("y", shape)], initializers, opsets)


def _skip_model(nodes, shape: Shape, initializers, opsets=DEFAULT_OPSETS) -> onnx.ModelProto:
    """x, skip -> y, sum."""
    return _model(nodes, [_tensor("x", shape), _tensor("skip", shape)], [_tensor("y", shape), _tensor("sum", shape)],
                  initializers, opsets)


def _scale(shape: Shape) -> onnx.TensorProto:
    return _initializer("scale", _scale_values(shape.hidden), shape.dtype)


def copy_by_cast(shape: Shape, rows: int) -> onnx.ModelProto:
    """A Cast to the same type: onnxruntime's kernel memcpy's into the output (one thread)."""
    node = helper.make_node("Cast", ["x"], ["y"], to=shape.onnx_type)
    return _model([node], [_tensor("x", shape, rows)], [_tensor("y", shape, rows)])


def copy_by_gather(shape: Shape, rows: int) -> onnx.ModelProto:
    """Gather of every row in order: onnxruntime copies the rows on its intra-op thread pool."""
    indices = helper.make_tensor("rows", TensorProto.INT64, [rows], np.arange(rows, dtype=np.int64).tobytes(), True)
    node = helper.make_node("Gather", ["x", "rows"], ["y"], axis=0)
    return _model([node], [_tensor("x", shape, rows)], [_tensor("y", shape, rows)], [indices])


def ours_rmsnorm(shape: Shape) -> onnx.ModelProto:
    node = helper.make_node("RMSNorm", ["x", "scale"], ["y"], domain=OP_DOMAIN, epsilon=EPSILON)
    return _norm_model([node], shape, [_scale(shape)], OURS_OPSETS)


def ours_skip_rmsnorm(shape: Shape) -> onnx.ModelProto:
    node = helper.make_node("SkipRMSNorm", ["x", "skip", "scale"], ["y", "sum"], domain=OP_DOMAIN, epsilon=EPSILON)
    return _skip_model([node], shape, [_scale(shape)], OURS_OPSETS)


def add_then_ours_rmsnorm(shape: Shape) -> onnx.ModelProto:
    """The residual add unfused: onnxruntime's Add, then our RMSNorm."""
    nodes = [helper.make_node("Add", ["x", "skip"], ["sum"]),
             helper.make_node("RMSNorm", ["sum", "scale"], ["y"], domain=OP_DOMAIN, epsilon=EPSILON)]
    return _skip_model(nodes, shape, [_scale(shape)], OURS_OPSETS)


def ort_simplified_layer_norm(shape: Shape) -> onnx.ModelProto:
    node = helper.make_node("SimplifiedLayerNormalization", ["x", "scale"], ["y"], axis=-1, epsilon=EPSILON,
                            stash_type=1)
    return _norm_model([node], shape, [_scale(shape)])


def onnx_rms_normalization(shape: Shape) -> onnx.ModelProto:
    node = helper.make_node("RMSNormalization", ["x", "scale"], ["y"], axis=-1, epsilon=EPSILON, stash_type=1)
    return _norm_model([node], shape, [_scale(shape)], [("", 23)])


def ort_skip_simplified_layer_norm(shape: Shape) -> onnx.ModelProto:
    node = helper.make_node("SkipSimplifiedLayerNormalization", ["x", "skip", "scale"], ["y", "", "", "sum"],
                            domain="com.microsoft", epsilon=EPSILON)
    return _skip_model([node], shape, [_scale(shape)], [("", 18), ("com.microsoft", 1)])


def _decomposed_nodes(source: str, shape: Shape) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """RMSNorm as torch exports the Hugging Face Llama norm: in float32, cast back, then times the weight."""
    wide = source
    nodes = []
    if shape.dtype != "float32":
        nodes.append(helper.make_node("Cast", [source], ["wide"], to=TensorProto.FLOAT))
        wide = "wide"
    nodes += [
        helper.make_node("Pow", [wide, "two"], ["squares"]),
        helper.make_node("ReduceMean", ["squares", "last_axis"], ["mean_square"], keepdims=1),
        helper.make_node("Add", ["mean_square", "eps"], ["shifted"]),
        helper.make_node("Sqrt", ["shifted"], ["rms"]),
        helper.make_node("Reciprocal", ["rms"], ["inverse_rms"]),
        helper.make_node("Mul", [wide, "inverse_rms"], ["normalized_wide"]),
    ]
    normalized = "normalized_wide"
    if shape.dtype != "float32":
        nodes.append(helper.make_node("Cast", ["normalized_wide"], ["normalized"], to=shape.onnx_type))
        normalized = "normalized"
    nodes.append(helper.make_node("Mul", ["scale", normalized], ["y"]))
    constants = [
        helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
        helper.make_tensor("last_axis", TensorProto.INT64, [1], [-1]),
        helper.make_tensor("eps", TensorProto.FLOAT, [], [EPSILON]),
        _scale(shape),
    ]
    return nodes, constants


def decomposed_rmsnorm(shape: Shape) -> onnx.ModelProto:
    nodes, constants = _decomposed_nodes("x", shape)
    return _norm_model(nodes, shape, constants)


def decomposed_skip_rmsnorm(shape: Shape) -> onnx.ModelProto:
    nodes, constants = _decomposed_nodes("sum", shape)
    return _skip_model([helper.make_node("Add", ["x", "skip"], ["sum"]), *nodes], shape, constants)


@dataclass(frozen=True)
class Contender:
    name: str
    family: str  # "norm": X -> Y, "skip": X, skip -> Y, sum, "copy": X -> Y, "copy2": X and skip -> Y and sum
    build: Callable[[Shape], onnx.ModelProto]
    optimized: bool = True  # ORT_ENABLE_ALL; False: ORT_DISABLE_ALL

    @property
    def reference(self) -> str | None:
        """The onnxruntime contender this one is compared with (speed-up column)."""
        return {"rmsnorm": "ort_simplified", "skip_rmsnorm": "ort_skip_simplified"}.get(self.name)


CONTENDERS = (
    # The copies run with optimizations off: the optimizer would remove a same-type Cast.
    Contender("copy_cast", "copy", lambda s: copy_by_cast(s, s.rows), optimized=False),
    Contender("copy_gather", "copy", lambda s: copy_by_gather(s, s.rows), optimized=False),
    Contender("copy2_cast", "copy2", lambda s: copy_by_cast(s, 2 * s.rows), optimized=False),
    Contender("copy2_gather", "copy2", lambda s: copy_by_gather(s, 2 * s.rows), optimized=False),
    Contender("rmsnorm", "norm", ours_rmsnorm),
    Contender("ort_simplified", "norm", ort_simplified_layer_norm),
    Contender("onnx_rmsnorm23", "norm", onnx_rms_normalization),
    Contender("decomposed", "norm", decomposed_rmsnorm, optimized=False),
    Contender("skip_rmsnorm", "skip", ours_skip_rmsnorm),
    Contender("add_rmsnorm", "skip", add_then_ours_rmsnorm),
    Contender("ort_skip_simplified", "skip", ort_skip_simplified_layer_norm),
    Contender("decomposed_skip", "skip", decomposed_skip_rmsnorm, optimized=False),
)
CONTENDER_NAMES = tuple(c.name for c in CONTENDERS)
ROOFLINE_OF = {"norm": "copy", "skip": "copy2", "copy": "copy", "copy2": "copy2"}


def moved_bytes(family: str, shape: Shape) -> int:
    tensors = {"norm": 2, "copy": 2, "skip": 4, "copy2": 4}[family]
    scale = shape.hidden * shape.itemsize if family in ("norm", "skip") else 0
    return tensors * shape.tensor_bytes + scale


# --- buffers shared by the contenders of a case ---------------------------------------------------------------


def _aligned_empty(shape: tuple[int, ...], dtype: np.dtype, alignment: int = 64) -> np.ndarray:
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
        self.inputs = _aligned_empty((2, shape.rows, shape.hidden), dtype)
        self.inputs[...] = rng.standard_normal(self.inputs.shape, dtype=np.float32)
        self.outputs = _aligned_empty(self.inputs.shape, dtype)
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


def _check(contender: Contender, shape: Shape, buffers: SharedBuffers) -> str | None:
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
    expected *= _scale_values(shape.hidden)
    rtol = CHECK_RTOL[shape.dtype]
    if not np.allclose(y, expected, rtol=rtol, atol=rtol):
        return f"Y is off by up to {np.max(np.abs(y - expected)):.3g} (tolerance {rtol:g})"
    return None


# --- timing -----------------------------------------------------------------------------------------------------


@dataclass
class Runner:
    """One contender, ready to run on the shared buffers."""

    contender: Contender
    session: ort.InferenceSession
    binding: ort.IOBinding
    clock: Callable[[], int] = time.perf_counter_ns
    calls_per_sample: int = 1
    samples: list[float] = field(default_factory=list)

    def run(self) -> None:
        self.session.run_with_iobinding(self.binding)

    def sample(self) -> None:
        # One untimed call first: every contender is timed in the steady state of its own repeated calls, not
        # after the previous contender (e.g. the decomposed graph's intermediates) evicted the shared inputs.
        self.session.run_with_iobinding(self.binding)
        calls = self.calls_per_sample
        start = self.clock()
        for _ in range(calls):
            self.session.run_with_iobinding(self.binding)
        self.samples.append((self.clock() - start) * 1e-9 / calls)


CLOCKS = ("auto", "wall")


def clock_name(threads: int, choice: str) -> str:
    """'thread_cpu' when everything runs on the calling thread (one intra-op thread: onnxruntime starts no pool)
    and `choice` is 'auto': on a shared machine that leaves out the time other processes hold the core. Else
    'wall'."""
    return "thread_cpu" if choice == "auto" and threads == 1 else "wall"


def clock_function(name: str) -> Callable[[], int]:
    return time.thread_time_ns if name == "thread_cpu" else time.perf_counter_ns


def session_for(contender: Contender, shape: Shape, threads: int, *,
                profile: str | None = None) -> ort.InferenceSession:
    options = timing_options()  # the contenders' runs take turns
    if profile:
        options.enable_profiling = True
        options.profile_file_prefix = profile
    levels = ort.GraphOptimizationLevel
    level = levels.ORT_ENABLE_ALL if contender.optimized else levels.ORT_DISABLE_ALL
    return make_session(contender.build(shape), optimization=level, threads=threads, options=options)


def _prepare(contenders: Iterable[Contender], shape: Shape, threads: int, buffers: SharedBuffers,
             unsupported: dict[str, str], *, clock: str = "wall", profile: str | None = None,
             check: bool = True) -> list[Runner]:
    """Sessions for the contenders that onnxruntime can run on this shape and (with `check`) compute the right
    thing; the others land in `unsupported` with the reason."""
    runners = []
    for contender in contenders:
        try:
            session = session_for(contender, shape, threads, profile=profile)
            binding = buffers.bind(session, doubled=contender.family == "copy2")
            buffers.outputs.fill(np.nan)
            session.run_with_iobinding(binding)
        except ORT_ERRORS as error:
            unsupported[contender.name] = "onnxruntime cannot run it: " + str(error).splitlines()[0][:200]
            continue
        if check and (problem := _check(contender, shape, buffers)) is not None:
            unsupported[contender.name] = "wrong result: " + problem
            continue
        runners.append(Runner(contender, session, binding, clock_function(clock)))
    return runners


def _calibrate(runners: list[Runner], min_sample_s: float) -> None:
    """Calls per sample so that one sample lasts at least `min_sample_s` (timer and loop overhead negligible)."""
    for runner in runners:
        runner.run()
        start = runner.clock()
        runner.run()
        once = max((runner.clock() - start) * 1e-9, 1e-7)
        runner.calls_per_sample = max(1, min(100_000, math.ceil(min_sample_s / once)))


def time_round_robin(runners: list[Runner], repetitions: int, min_sample_s: float) -> None:
    """Interleaved repetitions: each repetition samples every runner once, starting one further along each time."""
    _calibrate(runners, min_sample_s)
    for index in turns(len(runners), repetitions):
        runners[index].sample()


# --- one case -------------------------------------------------------------------------------------------------


@dataclass
class Measurement:
    contender: str
    family: str
    seconds: float  # median
    spread: float  # (p75 - p25) / median over the repetitions
    samples: int
    calls_per_sample: int
    bytes: int
    gb_per_s: float
    vs_roofline: float | None = None  # time / roofline copy time of the same bytes (1.0 = at the roofline)
    speedup_vs_ort: float | None = None  # onnxruntime's time / ours (ours only)


@dataclass
class CaseResult:
    dtype: str
    rows: int
    hidden: int
    threads: int
    clock: str  # "wall", or "thread_cpu" (see clock_name)
    measurements: list[Measurement]
    unsupported: dict[str, str]
    numpy_copy_s: float | None = None  # numpy.copyto of X into Y: a reference outside onnxruntime

    def get(self, name: str) -> Measurement | None:
        return next((m for m in self.measurements if m.contender == name), None)


def _quartile_spread(samples: list[float]) -> float:
    if len(samples) < 4:
        return 0.0
    q1, _, q3 = statistics.quantiles(samples, n=4)
    return (q3 - q1) / statistics.median(samples)


def _numpy_copy_seconds(buffers: SharedBuffers, repetitions: int, clock: Callable[[], int]) -> float:
    x, y = buffers.inputs[0], buffers.outputs[0]
    times = []
    for _ in range(repetitions):
        start = clock()
        np.copyto(y, x)
        times.append((clock() - start) * 1e-9)
    return statistics.median(times)


def measure_case(shape: Shape, threads: int, contenders: Iterable[Contender], repetitions: int,
                 min_sample_s: float, clock: str = "wall") -> CaseResult:
    buffers = SharedBuffers(shape)
    unsupported: dict[str, str] = {}
    runners = _prepare(contenders, shape, threads, buffers, unsupported, clock=clock)
    time_round_robin(runners, repetitions, min_sample_s)
    measurements = []
    for runner in runners:
        seconds = statistics.median(runner.samples)
        size = moved_bytes(runner.contender.family, shape)
        measurements.append(Measurement(runner.contender.name, runner.contender.family, seconds,
                                        _quartile_spread(runner.samples), len(runner.samples),
                                        runner.calls_per_sample, size, size / seconds / 1e9))
    result = CaseResult(shape.dtype, shape.rows, shape.hidden, threads, clock, measurements, unsupported,
                        _numpy_copy_seconds(buffers, max(3, repetitions), clock_function(clock)))
    _add_ratios(result)
    return result


def roofline_seconds(result: CaseResult, family: str) -> float | None:
    """The fastest onnxruntime copy of the bytes a contender of `family` moves."""
    copy_family = ROOFLINE_OF[family]
    times = [m.seconds for m in result.measurements if m.family == copy_family]
    return min(times) if times else None


def _add_ratios(result: CaseResult) -> None:
    by_name = {c.name: c for c in CONTENDERS}
    for m in result.measurements:
        roofline = roofline_seconds(result, m.family)
        m.vs_roofline = m.seconds / roofline if roofline else None
        reference = by_name[m.contender].reference
        if reference and (other := result.get(reference)):
            m.speedup_vs_ort = other.seconds / m.seconds


# --- decode sizes: per-node cost without Python's run() overhead ----------------------------------------------
#
# Two views. onnxruntime's profiler gives each node's kernel time, but with microsecond resolution and a floor
# of a few microseconds of its own bookkeeping inside the timed span (see a Cast's time: a 16 KB memcpy).
# Chain differencing times graphs of 1 and of `length` copies of the contender in series (each stage consumes the
# previous one's outputs, intermediates allocated by onnxruntime as in a real model): the difference per extra
# stage is what one node costs inside a graph, kernel plus onnxruntime's per-node dispatch.

DECODE_SKIPPED_FAMILIES = ("copy2",)  # at decode sizes the doubled copy says nothing new
NOT_CHAINED = ("copy_cast",)  # onnxruntime removes a chain of same-type Casts even with optimizations off


@dataclass
class DecodeCost:
    dtype: str
    hidden: int
    threads: int
    contender: str
    profiled_us_mean: float  # profiler: the nodes' kernel times summed per run, mean of the fastest 80% of runs
    profiled_us_median: float
    session_run_us_median: float  # profiler: model_run, i.e. kernels plus the session's per-run work
    thread_pool_used: bool  # profiler: the intra-op pool ran part of the node(s)
    nodes: list[str]  # op types onnxruntime ran (after its optimizations)
    in_graph_us: float | None = None  # chain differencing: one more node in a graph costs this


def chained(model: onnx.ModelProto, length: int) -> onnx.ModelProto:
    """`length` copies of the model's nodes in series: stage i+1 reads stage i's y as x (and its sum as skip); the
    last stage writes the graph outputs. Each stage has its own copy of the initializers, as each norm of a model
    has its own weight (a shared one would stay in L1 and flatter the kernels that read it)."""
    graph = model.graph
    constants = {initializer.name for initializer in graph.initializer}
    feeds = {"x": "y", "skip": "sum"}

    def rename(name: str, stage: int) -> str:
        if not name:
            return name
        if name in feeds and name not in constants:
            return name if stage == 0 else rename(feeds[name], stage - 1)
        if name in feeds.values() and stage == length - 1:
            return name
        return f"stage{stage}/{name}"

    result = onnx.ModelProto()
    result.CopyFrom(model)
    del result.graph.node[:]
    del result.graph.initializer[:]
    for stage in range(length):
        for index, node in enumerate(graph.node):
            copy = result.graph.node.add()
            copy.CopyFrom(node)
            copy.name = f"stage{stage}/{index}"
            copy.input[:] = [rename(name, stage) for name in node.input]
            copy.output[:] = [rename(name, stage) for name in node.output]
        for initializer in graph.initializer:
            copy = result.graph.initializer.add()
            copy.CopyFrom(initializer)
            copy.name = rename(initializer.name, stage)
    return result


def _trimmed_mean(values: list[float], keep: float = 0.8) -> float:
    """Mean of the smallest `keep` share: finer than the profiler's whole microseconds, without the runs that
    another process interrupted."""
    kept = sorted(values)[: max(1, int(len(values) * keep))]
    return statistics.fmean(kept)


def read_profile(path: str) -> list[dict]:
    """The events of an onnxruntime profile file, which is deleted."""
    with open(path) as file:
        events = json.load(file)
    os.unlink(path)
    return events


def _used_thread_pool(node_event: dict) -> bool:
    stats = node_event["args"].get("thread_scheduling_stats") or {}
    if isinstance(stats, str):
        stats = json.loads(stats)
    sub_threads = stats.get("sub_threads", {}).values()
    return bool(stats.get("main_thread", {}).get("block_size")) or any(t.get("num_run", 0) for t in sub_threads)


PROFILE_CHUNK = 50  # profiled runs of one contender before the next one's turn


def _profile_interleaved(runners: list[Runner], runs: int) -> None:
    """`runs` runs of each runner, in turns of PROFILE_CHUNK, so that a change in the machine's load over time
    falls on all of them alike."""
    for start in range(0, runs, PROFILE_CHUNK):
        for runner in runners:
            for _ in range(min(PROFILE_CHUNK, runs - start)):
                runner.run()


def _profiled(runner: Runner) -> tuple[list[float], list[float], bool, list[str]]:
    """(kernel us per run, model_run us per run, thread pool used, op types) from the runner's profile."""
    events = read_profile(runner.session.end_profiling())
    run_us = [e["dur"] for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    node_events = [e for e in events if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time")]
    nodes_per_run = len(node_events) // len(run_us)
    kernel_us = [sum(e["dur"] for e in node_events[i * nodes_per_run:(i + 1) * nodes_per_run])
                 for i in range(len(run_us))]
    # The first run (the check in _prepare) pays first-call costs: dropped.
    measured = node_events[nodes_per_run:]
    return (kernel_us[1:], run_us[1:], any(_used_thread_pool(e) for e in measured),
            sorted({e["args"].get("op_name", "?") for e in measured}))


def decode_costs(shape: Shape, threads: int, contenders: Iterable[Contender], plan: "Plan",
                 workdir: str) -> tuple[list[DecodeCost], dict[str, str]]:
    contenders = [c for c in contenders if c.family not in DECODE_SKIPPED_FAMILIES]
    buffers = SharedBuffers(shape)
    unsupported: dict[str, str] = {}
    costs = {}
    profiled = [runner for contender in contenders
                for runner in _prepare([contender], shape, threads, buffers, unsupported,
                                       profile=os.path.join(workdir, contender.name))]
    _profile_interleaved(profiled, plan.profile_runs)
    for runner in profiled:
        kernel_us, run_us, pool, nodes = _profiled(runner)
        costs[runner.contender.name] = DecodeCost(shape.dtype, shape.hidden, threads, runner.contender.name,
                                                  _trimmed_mean(kernel_us), statistics.median(kernel_us),
                                                  statistics.median(run_us), pool, nodes)
    if plan.chain_length > 1:
        clock = clock_name(threads, plan.clock)
        measured = [c for c in contenders if c.name in costs and c.name not in NOT_CHAINED]
        single = _prepare(measured, shape, threads, buffers, {}, clock=clock)
        chains = [replace(c, build=_chain_builder(c, plan.chain_length)) for c in measured]
        long = {r.contender.name: r
                for r in _prepare(chains, shape, threads, buffers, {}, clock=clock, check=False)}
        time_round_robin(single + list(long.values()), plan.repetitions, plan.min_sample_s)
        for one in single:
            if (many := long.get(one.contender.name)) is not None:
                extra = statistics.median(many.samples) - statistics.median(one.samples)
                costs[one.contender.name].in_graph_us = extra / (plan.chain_length - 1) * 1e6
    return list(costs.values()), unsupported


def _chain_builder(contender: Contender, length: int) -> Callable[[Shape], onnx.ModelProto]:
    return lambda shape: chained(contender.build(shape), length)


# --- the whole benchmark ----------------------------------------------------------------------------------------


def all_threads() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def machine_info() -> dict:
    info = {
        "processor": platform.processor() or platform.machine(),
        "cpu_model": _cpu_model(),
        "cores": all_threads(),
        "python": platform.python_version(),
        "onnxruntime": ort.__version__,
        "ort_rmsnorm": build_info(),
        "forced_isa": os.environ.get(ISA_ENV) or None,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    if hasattr(os, "getloadavg"):
        info["load_average_at_start"] = os.getloadavg()
    return info


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as file:
            return next(line.split(":", 1)[1].strip() for line in file if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


@dataclass
class Plan:
    dtypes: list[str]
    hidden_sizes: list[int]
    rows: list[int]
    threads: list[int]
    repetitions: int
    min_sample_s: float
    contenders: list[str]
    decode_hidden: int | None  # the 1 x H case of the decode cost measurements; None: skip them
    profile_runs: int
    chain_length: int
    clock: str = "auto"  # see clock_name


QUICK = dict(hidden_sizes=[1024, 4096], rows=[1, PREFILL_ROWS], repetitions=5, min_sample_s=0.002, profile_runs=300)
FULL = dict(hidden_sizes=list(HIDDEN_SIZES), rows=[1, PREFILL_ROWS], repetitions=11, min_sample_s=0.005,
            profile_runs=2000)
CHAIN_LENGTH = 17


def plan_from_args(args: argparse.Namespace) -> Plan:
    defaults = QUICK if args.quick else FULL
    return Plan(
        dtypes=args.dtypes,
        hidden_sizes=args.hidden or defaults["hidden_sizes"],
        rows=args.rows or defaults["rows"],
        threads=args.threads,
        repetitions=args.repetitions or defaults["repetitions"],
        min_sample_s=args.min_sample_ms / 1e3 if args.min_sample_ms is not None else defaults["min_sample_s"],
        contenders=args.contenders,
        decode_hidden=None if args.no_decode else args.decode_hidden,
        profile_runs=args.profile_runs or defaults["profile_runs"],
        chain_length=args.chain_length,
        clock=args.clock,
    )


def run_plan(plan: Plan, log=print) -> dict:
    unknown = (set(plan.contenders) - set(CONTENDER_NAMES)) | (set(plan.dtypes) - set(DTYPES))
    if unknown:
        raise ValueError(f"unknown contender or dtype {sorted(unknown)}: contenders are {', '.join(CONTENDER_NAMES)}; "
                         f"dtypes are {', '.join(DTYPES)}")
    contenders = [c for c in CONTENDERS if c.name in plan.contenders]
    report = {"machine": machine_info(), "plan": asdict(plan), "cases": [], "decode": [], "decode_unsupported": {}}
    started = time.perf_counter()
    for threads in plan.threads:
        for dtype in plan.dtypes:
            for rows in plan.rows:
                for hidden in plan.hidden_sizes:
                    case = measure_case(Shape(dtype, rows, hidden), threads, contenders, plan.repetitions,
                                        plan.min_sample_s, clock_name(threads, plan.clock))
                    report["cases"].append(asdict(case))
                    log(format_case_line(case))
    if plan.decode_hidden:
        with tempfile.TemporaryDirectory(prefix="ort-rmsnorm-profile-") as workdir:
            for threads in plan.threads:
                for dtype in plan.dtypes:
                    costs, unsupported = decode_costs(Shape(dtype, 1, plan.decode_hidden), threads, contenders, plan,
                                                      workdir)
                    report["decode"] += [asdict(c) for c in costs]
                    report["decode_unsupported"][f"{dtype}/{threads}"] = unsupported
                    log(format_decode_line(costs))
    report["machine"]["seconds"] = round(time.perf_counter() - started, 1)
    if hasattr(os, "getloadavg"):
        report["machine"]["load_average_at_end"] = os.getloadavg()
    return report


# --- output: table, JSON, plot ----------------------------------------------------------------------------------

TABLE_COLUMNS = ("copy", "rmsnorm", "ort_simplified", "onnx_rmsnorm23", "decomposed", "copy2", "skip_rmsnorm",
                 "add_rmsnorm", "ort_skip_simplified", "decomposed_skip")


def _case_from_dict(case: dict) -> CaseResult:
    return CaseResult(**{**case, "measurements": [Measurement(**m) for m in case["measurements"]]})


def _time_of(case: CaseResult, column: str) -> float | None:
    if column in ("copy", "copy2"):
        return roofline_seconds(case, column)
    measurement = case.get(column)
    return measurement.seconds if measurement else None


def _ratio(value: float | None) -> str:
    return f"{value:.2f}" if value is not None else "-"


def format_case_line(case: CaseResult) -> str:
    ours, skip = case.get("rmsnorm"), case.get("skip_rmsnorm")
    parts = [f"{case.dtype:8} threads={case.threads} {case.rows:>5}x{case.hidden:<5}"]
    if ours:
        parts.append(f"rmsnorm {ours.seconds * 1e6:9.1f} us {ours.gb_per_s:6.1f} GB/s "
                     f"x{_ratio(ours.vs_roofline)} copy, x{_ratio(ours.speedup_vs_ort)} faster than ort")
    if skip:
        parts.append(f"skip {skip.seconds * 1e6:9.1f} us x{_ratio(skip.vs_roofline)} copy, "
                     f"x{_ratio(skip.speedup_vs_ort)} faster than ort")
    return " | ".join(parts)


def format_decode_line(costs: list[DecodeCost]) -> str:
    if not costs:
        return ""
    parts = [f"{c.contender} {c.in_graph_us:.2f}" for c in costs if c.in_graph_us is not None]
    return f"{costs[0].dtype:8} threads={costs[0].threads} 1x{costs[0].hidden} in-graph us/node: " + ", ".join(parts)


def markdown_tables(report: dict) -> str:
    """One table per (threads, dtype): microseconds per call (median), then the ratios the targets are about."""
    cases = [_case_from_dict(c) for c in report["cases"]]
    out = [_machine_line(report["machine"]), ""]
    for threads in sorted({c.threads for c in cases}):
        for dtype in DTYPES:
            group = [c for c in cases if c.threads == threads and c.dtype == dtype]
            if not group:
                continue
            clock = "calling thread's CPU time" if group[0].clock == "thread_cpu" else "wall time"
            out.append(f"### {dtype}, {threads} thread{'s' if threads > 1 else ''} (median us per call, {clock})\n")
            header = ["rows x H", *TABLE_COLUMNS, "rmsnorm/copy", "skip/copy2", "speed-up vs SLN", "speed-up vs SSLN"]
            out.append("| " + " | ".join(header) + " |")
            out.append("|" + "---|" * len(header))
            for case in group:
                ours, skip = case.get("rmsnorm"), case.get("skip_rmsnorm")
                cells = [f"{case.rows}x{case.hidden}"]
                for column in TABLE_COLUMNS:
                    seconds = _time_of(case, column)
                    cells.append(f"{seconds * 1e6:.1f}" if seconds else "n/a")
                cells += [_ratio(ours and ours.vs_roofline), _ratio(skip and skip.vs_roofline),
                          _ratio(ours and ours.speedup_vs_ort), _ratio(skip and skip.speedup_vs_ort)]
                out.append("| " + " | ".join(cells) + " |")
            unsupported = {name: why for c in group for name, why in c.unsupported.items()}
            if unsupported:
                out.append("")
                out += [f"- n/a `{name}`: {why}" for name, why in sorted(unsupported.items())]
            out.append("")
    if report["decode"]:
        out.append("### Decode (1 x H): cost per node in microseconds\n")
        out.append("In-graph: chain differencing. Profiled: onnxruntime's profiler, node kernel times per run (mean of "
                   "the fastest 80% of runs, and median; both include the profiler's own floor of a few microseconds, "
                   "see the copies). Pool: the intra-op thread pool was woken.\n")
        out.append("| dtype | threads | H | contender | in-graph | profiled mean (fastest 80%) | profiled median "
                   "| model_run median | pool | nodes run |")
        out.append("|---|---|---|---|---|---|---|---|---|---|")
        for c in report["decode"]:
            in_graph = f"{c['in_graph_us']:.2f}" if c["in_graph_us"] is not None else "-"
            out.append(f"| {c['dtype']} | {c['threads']} | {c['hidden']} | {c['contender']} | {in_graph} | "
                       f"{c['profiled_us_mean']:.2f} | {c['profiled_us_median']:.0f} | "
                       f"{c['session_run_us_median']:.0f} | {'yes' if c['thread_pool_used'] else 'no'} | "
                       f"{', '.join(c['nodes'])} |")
        out.append("")
    return "\n".join(out)


def _machine_line(machine: dict) -> str:
    isa = machine.get("forced_isa") or "best available"
    load = machine.get("load_average_at_start")
    return (f"{machine['cpu_model']}, {machine['cores']} cores, onnxruntime {machine['onnxruntime']}, kernels: {isa}, "
            f"{machine['date']}" + (f", load average {load[0]:.2f} at start" if load else ""))


PLOTTED = ("copy", "rmsnorm", "ort_simplified", "onnx_rmsnorm23", "decomposed", "copy2", "skip_rmsnorm",
           "ort_skip_simplified", "decomposed_skip")


def can_plot() -> bool:
    """Whether :func:`write_plot` can run: it needs matplotlib, an optional dependency (the ``bench`` extra)."""
    return importlib.util.find_spec("matplotlib") is not None


def write_plot(report: dict, path: Path) -> None:
    """GB/s against H per contender: one panel per (dtype, rows, threads)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = [_case_from_dict(c) for c in report["cases"]]
    colors = plt.get_cmap("tab10")  # one color per contender in every panel
    panels = sorted({(c.rows, c.threads) for c in cases})
    dtypes = [d for d in DTYPES if any(c.dtype == d for c in cases)]
    figure, axes = plt.subplots(len(dtypes), len(panels), figsize=(4.2 * len(panels), 3.4 * len(dtypes)),
                                squeeze=False)
    for i, dtype in enumerate(dtypes):
        for j, (rows, threads) in enumerate(panels):
            axis = axes[i][j]
            group = sorted((c for c in cases if c.dtype == dtype and c.rows == rows and c.threads == threads),
                           key=lambda c: c.hidden)
            for column in PLOTTED:
                points = []
                for case in group:
                    if seconds := _time_of(case, column):
                        family = column if column in ("copy", "copy2") else case.get(column).family
                        size = moved_bytes(family, Shape(dtype, rows, case.hidden))
                        points.append((case.hidden, size / seconds / 1e9))
                if points:
                    ours = column in ("rmsnorm", "skip_rmsnorm")
                    style = "--" if column.startswith("copy") else ("-" if ours else ":")
                    axis.plot(*zip(*points), style, marker="o", markersize=3, label=column,
                              color=colors(PLOTTED.index(column)))
            axis.set_xscale("log", base=2)
            sizes = [c.hidden for c in group]
            axis.set_xticks(sizes, [str(h) for h in sizes], fontsize=7, rotation=45)
            axis.minorticks_off()
            axis.set_title(f"{dtype}, {rows} x H, {threads} thread{'s' if threads > 1 else ''}", fontsize=9)
            axis.set_xlabel("H")
            axis.set_ylabel("GB/s")
            axis.grid(True, alpha=0.3)
    axes[0][0].legend(fontsize=7)
    figure.suptitle(_machine_line(report["machine"]), fontsize=8)
    figure.tight_layout()
    write_atomically(path, lambda temporary: figure.savefig(temporary, dpi=90, format="png"))
    plt.close(figure)


# --- command line -----------------------------------------------------------------------------------------------


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def _milliseconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value >= 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of milliseconds >= 0")
    return value


def _positive_list(text: str) -> list[int]:
    return [_positive(item) for item in text.split(",")]


def _thread_counts(text: str) -> list[int]:
    return sorted({all_threads() if item == "all" else _positive(item) for item in text.split(",")})


def _choices(allowed: Iterable[str]) -> Callable[[str], list[str]]:
    allowed = list(allowed)

    def parse(text: str) -> list[str]:
        items = text.split(",")
        if unknown := [item for item in items if item not in allowed]:
            raise argparse.ArgumentTypeError(
                f"unknown {', '.join(map(repr, unknown))} (choose from {', '.join(allowed)})")
        return items

    return parse


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="H in {1024, 4096} and 5 repetitions (about a minute)")
    parser.add_argument("--dtypes", type=_choices(DTYPES), default=list(DTYPES), help="comma-separated element types")
    parser.add_argument("--hidden", type=_positive_list,
                        help=f"comma-separated hidden sizes (default {','.join(map(str, HIDDEN_SIZES))})")
    parser.add_argument("--rows", type=_positive_list,
                        help=f"comma-separated row counts (default 1,{PREFILL_ROWS}: decode and prefill)")
    parser.add_argument("--threads", type=_thread_counts, default="1,all",
                        help="comma-separated intra-op thread counts; 'all' = the cores this process may use")
    parser.add_argument("--contenders", type=_choices(CONTENDER_NAMES), default=list(CONTENDER_NAMES),
                        help=f"comma-separated subset of {','.join(CONTENDER_NAMES)}")
    parser.add_argument("--repetitions", type=_positive, help="interleaved repetitions per case (default 11, quick 5)")
    parser.add_argument("--min-sample-ms", type=_milliseconds,
                        help="calls per sample are repeated to last this long (0: one call per sample)")
    parser.add_argument("--decode-hidden", type=_positive, default=4096,
                        help="H of the 1 x H case whose per-node cost is measured without Python (default 4096)")
    parser.add_argument("--profile-runs", type=_positive, help="profiled runs per contender (default 2000, quick 300)")
    parser.add_argument("--chain-length", type=_positive, default=CHAIN_LENGTH,
                        help=f"nodes in series for chain differencing (default {CHAIN_LENGTH}; 1 = skip)")
    parser.add_argument("--no-decode", action="store_true", help="skip the decode per-node cost measurements")
    parser.add_argument("--clock", choices=CLOCKS, default="auto",
                        help="auto: the calling thread's CPU time for 1-thread cases (robust on a shared machine), "
                             "wall time otherwise; wall: wall time everywhere")
    parser.add_argument("--out", default="bench-results", help="directory for the JSON and markdown results")
    parser.add_argument("--plot", help="PNG path of the GB/s plot (default <out>/cpu.png); 'none' to skip")
    e2e = parser.add_argument_group("end to end (needs torch)")
    e2e.add_argument("--e2e", action="store_true",
                     help="instead of the kernels: a Llama-style model exported from torch, original vs fused")
    e2e.add_argument("--e2e-dtypes", type=_choices(DTYPES), default=["float32", "float16"],
                     help="comma-separated (default float32,float16)")
    e2e.add_argument("--e2e-hidden", type=_positive, default=2048, help="hidden size (default 2048)")
    e2e.add_argument("--e2e-layers", type=_positive, default=4, help="decoder layers (default 4)")
    e2e.add_argument("--e2e-vocab", type=_positive, default=32000, help="vocabulary size (default 32000)")
    e2e.add_argument("--e2e-prefill", type=_positive, default=512, help="prefill tokens (default 512)")
    e2e.add_argument("--e2e-threads", type=_positive,
                     help="intra-op threads (default: onnxruntime's, all cores); 1 is timed with CPU time")
    e2e.add_argument("--e2e-keep", metavar="DIR", help="keep the exported and fused models in DIR")


def run_bench(args: argparse.Namespace) -> int:
    if args.e2e:
        return run_e2e_bench(args)
    plan = plan_from_args(args)
    report = run_plan(plan)
    out = Path(args.out)
    write_text_atomically(out / "cpu.json", json.dumps(report, indent=1))
    tables = markdown_tables(report)
    write_text_atomically(out / "cpu.md", tables)
    print(tables)
    if args.plot != "none":
        plot = Path(args.plot) if args.plot else out / "cpu.png"
        write_plot(report, plot)
        print(f"plot: {plot}")
    print(f"results: {out / 'cpu.json'}, {out / 'cpu.md'}")
    return 0


def run_e2e_bench(args: argparse.Namespace) -> int:
    from . import bench_e2e  # imports torch
    from .demo import LlamaConfig

    config = replace(bench_e2e.E2E_CONFIG, hidden_size=args.e2e_hidden, num_layers=args.e2e_layers,
                     vocab_size=args.e2e_vocab,
                     intermediate_size=args.e2e_hidden * bench_e2e.E2E_CONFIG.intermediate_size
                     // bench_e2e.E2E_CONFIG.hidden_size)
    assert isinstance(config, LlamaConfig)
    report = {"machine": machine_info(), **bench_e2e.run_e2e(config, dtypes=args.e2e_dtypes,
                                                              prefill_tokens=args.e2e_prefill, threads=args.e2e_threads,
                                                              workdir=args.e2e_keep)}
    out = Path(args.out)
    write_text_atomically(out / "e2e.json", json.dumps(report, indent=1))
    table = _machine_line(report["machine"]) + "\n\n" + bench_e2e.markdown(report)
    write_text_atomically(out / "e2e.md", table)
    print(table)
    print(f"results: {out / 'e2e.json'}, {out / 'e2e.md'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m ort_rmsnorm.bench ARGS`` is ``ort-rmsnorm bench ARGS`` (the same checks and error messages)."""
    from .cli import main as cli_main

    return cli_main(["bench", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
