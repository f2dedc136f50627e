"""Timing contenders side by side: a session per contender on the shared buffers, calls per sample calibrated, and
repetitions interleaved round-robin (the first contender rotating)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np
import onnxruntime as ort

from ..runtime import make_session, timing_options, turns
from .buffers import SharedBuffers, check_outputs
from .contenders import Contender, Shape


_STATE = ort.capi.onnxruntime_pybind11_state
# What onnxruntime raises when it has no kernel for a contender's node or cannot run it.
ORT_ERRORS = (_STATE.Fail, _STATE.NotImplemented, _STATE.InvalidGraph, _STATE.InvalidArgument, _STATE.RuntimeException)


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


def prepare(contenders: Iterable[Contender], shape: Shape, threads: int, buffers: SharedBuffers,
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
        if check and (problem := check_outputs(contender, shape, buffers)) is not None:
            unsupported[contender.name] = "wrong result: " + problem
            continue
        runners.append(Runner(contender, session, binding, clock_function(clock)))
    return runners


def calibrate(runners: list[Runner], min_sample_s: float) -> None:
    """Calls per sample so that one sample lasts at least `min_sample_s` (timer and loop overhead negligible)."""
    for runner in runners:
        runner.run()
        start = runner.clock()
        runner.run()
        once = max((runner.clock() - start) * 1e-9, 1e-7)
        runner.calls_per_sample = max(1, min(100_000, math.ceil(min_sample_s / once)))


def time_round_robin(runners: list[Runner], repetitions: int, min_sample_s: float) -> None:
    """Interleaved repetitions: each repetition samples every runner once, starting one further along each time."""
    calibrate(runners, min_sample_s)
    for index in turns(len(runners), repetitions):
        runners[index].sample()
