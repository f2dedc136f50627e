"""Reading onnxruntime's profiles: node kernel times, runs told apart by their ``model_run`` spans, and whether a
node woke the intra-op thread pool.

onnxruntime's profiler times each node with microsecond resolution, and its own bookkeeping (input sizes, thread
statistics, its argument map) falls inside each node's span: a floor of a few microseconds per node.
"""

from __future__ import annotations

import bisect
import collections
import json
import os
import statistics
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np
import onnxruntime as ort

from .. import runtime


def read_profile(path: str) -> list[dict]:
    """The events of an onnxruntime profile file, which is deleted."""
    with open(path) as file:
        events = json.load(file)
    os.unlink(path)
    return events


def run_events(events: list[dict]) -> list[dict]:
    """The ``model_run`` spans, one per ``session.run``, in order."""
    return sorted((e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
                  key=lambda e: e["ts"])


def node_events(events: list[dict]) -> list[dict]:
    """The node kernel time events (``<node name>_kernel_time``), in order."""
    return [e for e in events if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time")]


def node_name(event: dict) -> str:
    return event["name"].removesuffix("_kernel_time")


def op_type(event: dict) -> str:
    return event["args"].get("op_name", "?")


def nodes_by_run(events: list[dict]) -> list[list[dict]]:
    """The node events of each run, told apart by the runs' start times."""
    starts = [e["ts"] for e in run_events(events)]
    runs: list[list[dict]] = [[] for _ in starts]
    for event in node_events(events):
        run = bisect.bisect_right(starts, event["ts"]) - 1
        if run >= 0:
            runs[run].append(event)
    return runs


def used_thread_pool(node_event: dict) -> bool:
    stats = node_event["args"].get("thread_scheduling_stats") or {}
    if isinstance(stats, str):
        stats = json.loads(stats)
    sub_threads = stats.get("sub_threads", {}).values()
    return bool(stats.get("main_thread", {}).get("block_size")) or any(t.get("num_run", 0) for t in sub_threads)


def trimmed_mean(values: list[float], keep: float = 0.8) -> float:
    """Mean of the smallest `keep` share: finer than the profiler's whole microseconds, without the runs that
    another process interrupted."""
    kept = sorted(values)[: max(1, int(len(values) * keep))]
    return statistics.fmean(kept)


def kernel_times(events: list[dict]) -> tuple[list[float], list[float], bool, list[str]]:
    """(kernel us per run, model_run us per run, thread pool used, op types) of a session whose runs all run the
    same nodes. The first run pays first-call costs: dropped."""
    run_us = [e["dur"] for e in run_events(events)]
    nodes = node_events(events)
    nodes_per_run = len(nodes) // len(run_us)
    kernel_us = [sum(e["dur"] for e in nodes[i * nodes_per_run:(i + 1) * nodes_per_run]) for i in range(len(run_us))]
    measured = nodes[nodes_per_run:]
    return (kernel_us[1:], run_us[1:], any(used_thread_pool(e) for e in measured),
            sorted({op_type(e) for e in measured}))


def profiled_runs(session: ort.InferenceSession, phase_feeds: Mapping[str, Mapping[str, np.ndarray]],
                  runs: Mapping[str, int]) -> dict[str, list[list[dict]]]:
    """Runs a profiling session (``enable_profiling``) on each phase's feeds: one warm-up run, then ``runs[phase]``
    runs; returns each phase's node events, run by run. The session's profile is ended and its file deleted."""
    phase_of_run: list[str | None] = []
    for phase, feeds in phase_feeds.items():
        for run in range(runs[phase] + 1):
            runtime.run(session, feeds)
            phase_of_run.append(phase if run else None)  # None: the warm-up
    by_phase: dict[str, list[list[dict]]] = {phase: [] for phase in phase_feeds}
    for phase, nodes in zip(phase_of_run, nodes_by_run(read_profile(session.end_profiling()))):
        if phase is not None:
            by_phase[phase].append(nodes)
    return by_phase


@dataclass
class NormShare:
    """Where a model's kernel time goes in profiled runs of one phase: per run, each node's median over the runs
    (a run that another process interrupted moves no median), summed."""

    runs: int
    kernel_us: float
    norm_us: float  # the nodes `is_norm` picked
    norm_nodes: int  # how many nodes that is per run
    by_op: list[tuple[str, float]]  # (op type, us per run), largest first

    @property
    def share(self) -> float:
        return self.norm_us / self.kernel_us if self.kernel_us else 0.0


def node_medians(runs: list[list[dict]]) -> dict[tuple[str, str], float]:
    """(node name, op type) -> the node's kernel time (us) in a run, median over the runs (0 in a run without it)."""
    durations: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    for nodes in runs:
        per_run: collections.Counter = collections.Counter()
        for event in nodes:
            per_run[node_name(event), op_type(event)] += event["dur"]
        for key, duration in per_run.items():
            durations[key].append(duration)
    return {key: statistics.median(values + [0.0] * (len(runs) - len(values))) for key, values in durations.items()}


def norm_share(runs: list[list[dict]], is_norm: Callable[[str, str], bool]) -> NormShare:
    """`is_norm(node name, op type)`: whether a node is part of a norm (decomposed or fused)."""
    medians = node_medians(runs)
    by_op: collections.Counter = collections.Counter()
    for (_, op), median in medians.items():
        by_op[op] += median
    norms = [median for (name, op), median in medians.items() if is_norm(name, op)]
    return NormShare(len(runs), sum(medians.values()), sum(norms), len(norms), by_op.most_common())
