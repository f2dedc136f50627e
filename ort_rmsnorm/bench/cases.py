"""One case of the kernel benchmark (dtype, rows, hidden size, threads): every contender timed on the same buffers,
medians, bytes moved, and the ratios to the copy roofline and to onnxruntime's kernel."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np

from .buffers import SharedBuffers
from .contenders import CONTENDERS, ROOFLINE_OF, Contender, Shape, moved_bytes
from .timing import clock_function, prepare, time_round_robin


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


def quartile_spread(samples: list[float]) -> float:
    if len(samples) < 4:
        return 0.0
    q1, _, q3 = statistics.quantiles(samples, n=4)
    return (q3 - q1) / statistics.median(samples)


def numpy_copy_seconds(buffers: SharedBuffers, repetitions: int, clock: Callable[[], int]) -> float:
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
    runners = prepare(contenders, shape, threads, buffers, unsupported, clock=clock)
    time_round_robin(runners, repetitions, min_sample_s)
    measurements = []
    for runner in runners:
        seconds = statistics.median(runner.samples)
        size = moved_bytes(runner.contender.family, shape)
        measurements.append(Measurement(runner.contender.name, runner.contender.family, seconds,
                                        quartile_spread(runner.samples), len(runner.samples),
                                        runner.calls_per_sample, size, size / seconds / 1e9))
    result = CaseResult(shape.dtype, shape.rows, shape.hidden, threads, clock, measurements, unsupported,
                        numpy_copy_seconds(buffers, max(3, repetitions), clock_function(clock)))
    add_ratios(result)
    return result


def roofline_seconds(result: CaseResult, family: str) -> float | None:
    """The fastest onnxruntime copy of the bytes a contender of `family` moves."""
    copy_family = ROOFLINE_OF[family]
    times = [m.seconds for m in result.measurements if m.family == copy_family]
    return min(times) if times else None


def add_ratios(result: CaseResult) -> None:
    by_name = {c.name: c for c in CONTENDERS}
    for m in result.measurements:
        roofline = roofline_seconds(result, m.family)
        m.vs_roofline = m.seconds / roofline if roofline else None
        reference = by_name[m.contender].reference
        if reference and (other := result.get(reference)):
            m.speedup_vs_ort = other.seconds / m.seconds


def case_from_dict(case: dict) -> CaseResult:
    return CaseResult(**{**case, "measurements": [Measurement(**m) for m in case["measurements"]]})
