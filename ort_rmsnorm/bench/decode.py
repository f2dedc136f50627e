"""Decode sizes (1 x H): the per-node cost of each contender without Python's ``run()`` overhead.

Two views. onnxruntime's profiler gives each node's kernel time, but with microsecond resolution and a floor of a
few microseconds of its own bookkeeping inside the timed span (see a Cast's time: a 16 KB memcpy). Chain
differencing times graphs of 1 and of `length` copies of the contender in series (each stage consumes the previous
one's outputs, intermediates allocated by onnxruntime as in a real model): the difference per extra stage is what
one node costs inside a graph, kernel plus onnxruntime's per-node dispatch.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, replace
from typing import Callable, Iterable

import onnx

from .buffers import SharedBuffers
from .contenders import Contender, Shape, chained
from .profile import kernel_times, read_profile, trimmed_mean
from .timing import Runner, clock_name, prepare, time_round_robin

DECODE_SKIPPED_FAMILIES = ("copy2",)  # at decode sizes the doubled copy says nothing new
NOT_CHAINED = ("copy_cast",)  # onnxruntime removes a chain of same-type Casts even with optimizations off
PROFILE_CHUNK = 50  # profiled runs of one contender before the next one's turn


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


def profile_interleaved(runners: list[Runner], runs: int) -> None:
    """`runs` runs of each runner, in turns of PROFILE_CHUNK, so that a change in the machine's load over time
    falls on all of them alike."""
    for start in range(0, runs, PROFILE_CHUNK):
        for runner in runners:
            for _ in range(min(PROFILE_CHUNK, runs - start)):
                runner.run()


def decode_costs(shape: Shape, threads: int, contenders: Iterable[Contender], workdir: str, *, profile_runs: int,
                 chain_length: int, repetitions: int, min_sample_s: float,
                 clock: str = "auto") -> tuple[list[DecodeCost], dict[str, str]]:
    """The profiled and (with `chain_length` > 1) the in-graph cost of each contender at `shape`, and the
    contenders that cannot run with the reason. `clock`: see timing.clock_name."""
    contenders = [c for c in contenders if c.family not in DECODE_SKIPPED_FAMILIES]
    buffers = SharedBuffers(shape)
    unsupported: dict[str, str] = {}
    costs = {}
    profiled = [runner for contender in contenders
                for runner in prepare([contender], shape, threads, buffers, unsupported,
                                      profile=os.path.join(workdir, contender.name))]
    profile_interleaved(profiled, profile_runs)
    for runner in profiled:
        # The first run, the check in prepare(), is dropped by kernel_times.
        kernel_us, run_us, pool, nodes = kernel_times(read_profile(runner.session.end_profiling()))
        costs[runner.contender.name] = DecodeCost(shape.dtype, shape.hidden, threads, runner.contender.name,
                                                  trimmed_mean(kernel_us), statistics.median(kernel_us),
                                                  statistics.median(run_us), pool, nodes)
    if chain_length > 1:
        clock = clock_name(threads, clock)
        measured = [c for c in contenders if c.name in costs and c.name not in NOT_CHAINED]
        single = prepare(measured, shape, threads, buffers, {}, clock=clock)
        chains = [replace(c, build=_chain_builder(c, chain_length)) for c in measured]
        long = {r.contender.name: r
                for r in prepare(chains, shape, threads, buffers, {}, clock=clock, check=False)}
        time_round_robin(single + list(long.values()), repetitions, min_sample_s)
        for one in single:
            if (many := long.get(one.contender.name)) is not None:
                extra = statistics.median(many.samples) - statistics.median(one.samples)
                costs[one.contender.name].in_graph_us = extra / (chain_length - 1) * 1e6
    return list(costs.values()), unsupported


def _chain_builder(contender: Contender, length: int) -> Callable[[Shape], onnx.ModelProto]:
    return lambda shape: chained(contender.build(shape), length)
