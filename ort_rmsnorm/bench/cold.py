"""What one norm costs per call where a decoder runs it: cold, right after a MatMul whose weights do not fit in L2.

Each model is a few repetitions (stages) of ``MatMul(H x F) -> MatMul(F x H) -> norm`` on one row (a decode step), the
norm's X the second MatMul's output and, for the residual norms, its skip the previous norm's sum. The weights of a
stage (:func:`weights`, float32) stream through the caches before the norm runs, as a decoder layer's do. For float16
the MatMuls stay float32 and a ``Cast`` to float16 feeds the norm (onnxruntime's CPU MatMul has no float16 kernel on
every machine); the norm still runs on what the step before it just wrote.

The contenders are one op each: ours (``RMSNorm``, ``SkipRMSNorm``) and onnxruntime's
(``SimplifiedLayerNormalization``, ``com.microsoft.SkipSimplifiedLayerNormalization``), and optionally ours from
another build of the library. Every contender's model has the same weights and feeds; their sessions (one thread,
onnxruntime's profiler on) take turns run by run, and a norm's cost is its node's ``_kernel_time`` in the profile:
the op's whole ``Compute``, the outputs' allocation included. The profiler counts whole microseconds; a round's
figure is the mean over its runs and stages, which resolves a tenth of one.
"""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from ..contract import (
    MS_DOMAIN,
    OP_DOMAIN,
    OP_VERSION,
    ORT_SIMPLIFIED_LAYER_NORM,
    ORT_SKIP_SIMPLIFIED_LAYER_NORM,
    RMSNORM,
    SKIP_RMSNORM,
)
from .profile import node_events, node_name, read_profile, run_events

EPSILON = 1e-5
DTYPES = {"float32": (TensorProto.FLOAT, np.float32), "float16": (TensorProto.FLOAT16, np.float16)}
# Our op and onnxruntime's for each of our ops.
OPPONENT = {RMSNORM: ORT_SIMPLIFIED_LAYER_NORM, SKIP_RMSNORM: ORT_SKIP_SIMPLIFIED_LAYER_NORM}


@dataclasses.dataclass(frozen=True)
class Contender:
    label: str
    op: str  # RMSNORM, SKIP_RMSNORM or onnxruntime's op
    library: str | None = None  # ours: the library to register


def _norm(op: str, x: str, skip: str, y: str, total: str, name: str) -> onnx.NodeProto:
    if op == RMSNORM:
        return helper.make_node(RMSNORM, [x, "scale"], [y], domain=OP_DOMAIN, epsilon=EPSILON, name=name)
    if op == SKIP_RMSNORM:
        return helper.make_node(SKIP_RMSNORM, [x, skip, "scale"], [y, total], domain=OP_DOMAIN, epsilon=EPSILON,
                                name=name)
    if op == ORT_SIMPLIFIED_LAYER_NORM:
        return helper.make_node(op, [x, "scale"], [y], epsilon=EPSILON, axis=-1, stash_type=1, name=name)
    if op == ORT_SKIP_SIMPLIFIED_LAYER_NORM:
        return helper.make_node(op, [x, skip, "scale"], [y, "", "", total], domain=MS_DOMAIN, epsilon=EPSILON,
                                name=name)
    raise ValueError(f"no such norm op: {op}")


def residual(op: str) -> bool:
    return op in (SKIP_RMSNORM, ORT_SKIP_SIMPLIFIED_LAYER_NORM)


def weights(hidden: int, stages: int, weight_mib: float, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each stage's two float32 weights, ``weight_mib`` MiB together: ``H x F`` and ``F x H``."""
    rng = np.random.default_rng(seed)
    inner = max(16, int(weight_mib * 2**20 / 4 / (2 * hidden)))
    return [(rng.standard_normal((hidden, inner), dtype=np.float32) * np.float32(hidden**-0.5),
             rng.standard_normal((inner, hidden), dtype=np.float32) * np.float32(inner**-0.5)) for _ in range(stages)]


def build(op: str, dtype: str, hidden: int, stage_weights: Sequence[tuple[np.ndarray, np.ndarray]]) -> onnx.ModelProto:
    """The model of one stage per pair of ``stage_weights`` (:func:`weights`), each stage's norm one ``op`` node named
    ``norm<i>``."""
    elem, np_type = DTYPES[dtype]
    scale = (1 + np.random.default_rng(hidden).standard_normal(hidden) / 8).astype(np_type)
    inits = [numpy_helper.from_array(scale, "scale")]
    nodes: list[onnx.NodeProto] = []
    x, skip = "x", "skip"
    for i, (up_weight, down_weight) in enumerate(stage_weights):
        up, down = f"up{i}", f"down{i}"
        inits += [numpy_helper.from_array(up_weight, up), numpy_helper.from_array(down_weight, down)]
        source = x if dtype == "float32" else f"x{i}_f32"
        if dtype != "float32":
            nodes.append(helper.make_node("Cast", [x], [source], to=TensorProto.FLOAT, name=f"widen{i}"))
        nodes += [helper.make_node("MatMul", [source, up], [f"h{i}"], name=f"mm_up{i}"),
                  helper.make_node("MatMul", [f"h{i}", down], [f"o{i}"], name=f"mm_down{i}")]
        out = f"o{i}"
        if dtype != "float32":
            nodes.append(helper.make_node("Cast", [out], [f"o{i}_t"], to=elem, name=f"narrow{i}"))
            out = f"o{i}_t"
        y, total = f"y{i}", f"sum{i}"
        nodes.append(_norm(op, out, skip, y, total, f"norm{i}"))
        x = y
        if residual(op):
            skip = total
    value = lambda name: helper.make_tensor_value_info(name, elem, [1, hidden])  # noqa: E731
    inputs = [value("x")] + ([value("skip")] if residual(op) else [])
    outputs = [value(x)] + ([value(skip)] if residual(op) else [])
    graph = helper.make_graph(nodes, "cold_norm", inputs, outputs, inits)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(OP_DOMAIN, OP_VERSION), helper.make_opsetid(MS_DOMAIN, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=9)


class _Profiled:
    """One contender's session, profiling every run; its runs are read back at the end."""

    def __init__(self, contender: Contender, model: onnx.ModelProto, feeds: dict, directory: Path, index: int):
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.enable_profiling = True
        options.profile_file_prefix = str(directory / f"cold{index}")
        # Basic optimizations only: the extended level would fuse nothing here, and keeps the graph as written.
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        if contender.library:
            options.register_custom_ops_library(contender.library)
        self.contender = contender
        self.session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        self.feeds = {name: array for name, array in feeds.items()
                      if name in {i.name for i in self.session.get_inputs()}}

    def run(self) -> None:
        self.session.run(None, self.feeds)

    def per_run_means(self) -> list[float]:
        """Each run's mean norm time (us), the norm nodes only."""
        events = read_profile(self.session.end_profiling())
        starts = [e["ts"] for e in run_events(events)]
        sums, counts = [0.0] * len(starts), [0] * len(starts)
        run = 0
        for event in node_events(events):
            while run + 1 < len(starts) and event["ts"] >= starts[run + 1]:
                run += 1
            if node_name(event).startswith("norm"):
                sums[run] += event["dur"]
                counts[run] += 1
        return [s / c for s, c in zip(sums, counts) if c]


@dataclasses.dataclass
class ColdResult:
    """Per contender, its per-norm cost (us) in each round: the mean over the round's runs and stages."""

    hidden: int
    dtype: str
    rounds: dict[str, list[float]]

    def median(self, label: str) -> float:
        return statistics.median(self.rounds[label])

    def ratios(self, label: str, other: str) -> list[float]:
        """Per round, ``label``'s cost over ``other``'s."""
        return [a / b for a, b in zip(self.rounds[label], self.rounds[other])]


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        return (values[0],) * 3
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def measure(contenders: Sequence[Contender], dtype: str, hidden: int,
            stage_weights: Sequence[tuple[np.ndarray, np.ndarray]], *, rounds: int = 5, runs: int = 10) -> ColdResult:
    """Every contender timed cold, the sessions taking turns run by run; ``rounds`` rounds of ``runs`` runs each
    (after one warm-up run per session)."""
    rng = np.random.default_rng(1)
    np_type = DTYPES[dtype][1]
    feeds = {name: rng.standard_normal((1, hidden)).astype(np_type) for name in ("x", "skip")}
    with tempfile.TemporaryDirectory(prefix="ort-rmsnorm-cold-") as scratch:
        sessions = [_Profiled(c, build(c.op, dtype, hidden, stage_weights), feeds, Path(scratch), i)
                    for i, c in enumerate(contenders)]
        for session in sessions:
            session.run()  # first-call costs
        order = list(range(len(sessions)))
        for run in range(rounds * runs):
            order = order[1:] + order[:1]  # who runs first rotates
            for index in order:
                sessions[index].run()
        per_run = {s.contender.label: s.per_run_means()[1:] for s in sessions}
    return ColdResult(hidden, dtype, {label: [statistics.fmean(values[r * runs:(r + 1) * runs]) for r in range(rounds)]
                                      for label, values in per_run.items()})
