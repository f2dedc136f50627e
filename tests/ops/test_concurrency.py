"""Concurrency through onnxruntime: one session run from 16 threads at once; many sessions (different types and
attributes) created from many threads and run concurrently; sessions created and destroyed, the library registered
for each, while other sessions keep running. Each input is first run once, alone, and checked against the float64
reference; every concurrent run must then reproduce that output bit for bit (rows are independent, so neither the
caller's threads nor the intra-op pool may change a single bit).

onnxruntime itself is not built with ThreadSanitizer instrumentation, so a data race inside a session would go
unseen by it: ThreadSanitizer covers the kernels, called from many threads without onnxruntime
(``scripts/test-tsan``), and these tests cover the sessions, by their results."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pytest

from op_models import norm_model
from ort_rmsnorm.runtime import make_session, run
from reference import BFLOAT16, assert_matches_reference, random_array, rmsnorm, tolerance

THREADS = 16
RUNS_PER_THREAD = 12
# Rows per call: the small ones run inline on the caller's thread, 600 rows of 8 x 96 (1.8 MB for float32) are split
# over the intra-op pool.
ROW_COUNTS = (1, 3, 37, 600)


def _run_together(count, fn):
    """fn(0) ... fn(count - 1) on `count` threads released at the same moment; returns their results and re-raises
    the first failure."""
    barrier = threading.Barrier(count)

    def task(index):
        barrier.wait()
        return fn(index)

    with ThreadPoolExecutor(count) as pool:
        futures = [pool.submit(task, index) for index in range(count)]
        return [future.result() for future in futures]


def _bits(array):
    array = np.asarray(array)
    return array.view({2: np.uint16, 4: np.uint32}[array.dtype.itemsize])


@dataclass
class Variant:
    """One model (op, types, attributes, scale layout) and the inputs it is run on, with their checked outputs."""

    name: str
    x_dtype: np.dtype
    scale_dtype: np.dtype = np.dtype(np.float32)
    skip: bool = False
    axis: int = -1
    epsilon: float = 1e-5
    outside: int = 0
    # "input": a graph input of the normalized shape; "constant [8, 1]": an initializer broadcast over [8, 96]
    # (axis -2); "none"
    scale: str = "input"
    magnitude: float = 1.0
    cases: list = field(default_factory=list)  # [(feeds, outputs)]

    def __post_init__(self):
        self.constant_scale = None
        if self.scale == "constant [8, 1]":
            self.constant_scale = np.linspace(-2, 2, 8).reshape(8, 1).astype(np.float32).astype(self.scale_dtype)

    def model(self):
        return norm_model(
            self.x_dtype, self.scale_dtype, skip=self.skip, sum_output=self.skip, x_shape=("rows", "a", "b"),
            scale_shape=["rows", "a", "b"][3 + self.axis:] if self.scale == "input" else None,
            constant_scale=self.constant_scale,
            attributes={"axis": self.axis, "epsilon": self.epsilon, "eps_outside_sqrt": self.outside},
            node_name=self.name,
        )

    def make_cases(self, rng):
        for rows in ROW_COUNTS:
            shape = (rows, 8, 96)
            feeds = {"x": random_array(rng, shape, self.x_dtype, magnitude=self.magnitude)}
            if self.skip:
                feeds["skip"] = random_array(rng, shape, self.x_dtype, magnitude=self.magnitude)
            if self.scale == "input":
                feeds["scale"] = rng.uniform(-2, 2, shape[self.axis:]).astype(np.float32).astype(self.scale_dtype)
            self.cases.append((feeds, None))

    def reference(self, feeds):
        scale = self.constant_scale if self.constant_scale is not None else feeds.get("scale")
        return rmsnorm(feeds["x"], scale, axis=self.axis, epsilon=self.epsilon, eps_outside_sqrt=bool(self.outside),
                       skip=feeds.get("skip"))

    def run_alone_and_check(self, session):
        """Runs every case once and checks it against the reference; keeps the outputs."""
        for index, (feeds, _) in enumerate(self.cases):
            outputs = run(session, feeds)
            expected, h = self.reference(feeds)
            what = f"{self.name} rows={feeds['x'].shape[0]}"
            assert_matches_reference(outputs[0], expected, self.x_dtype, what)
            if self.skip:
                np.testing.assert_array_equal(_bits(outputs[1]), _bits(h), err_msg=f"{what}: sum output")
            self.cases[index] = (feeds, outputs)

    def check_again(self, session, index):
        feeds, expected = self.cases[index]
        outputs = run(session, feeds)
        for got, want in zip(outputs, expected):
            np.testing.assert_array_equal(_bits(got), _bits(want), err_msg=f"{self.name}: concurrent run differs")


# Types, ops, axes, epsilon values and placements, scale layouts: sessions that a mix-up between them would break.
# Epsilon 1e-2 with inputs of magnitude 0.05 makes epsilon's value and placement change results far beyond tolerance.
VARIANTS = [
    dict(name="f32_axis-1", x_dtype=np.dtype(np.float32)),
    dict(name="f32_axis-2_eps_outside", x_dtype=np.dtype(np.float32), axis=-2, epsilon=1e-2, outside=1,
         magnitude=0.05),
    dict(name="f32_axis-2_eps_inside", x_dtype=np.dtype(np.float32), axis=-2, epsilon=1e-2, magnitude=0.05),
    dict(name="f32_constant_broadcast_scale", x_dtype=np.dtype(np.float32), axis=-2, scale="constant [8, 1]"),
    dict(name="f16_skip", x_dtype=np.dtype(np.float16), skip=True),
    dict(name="f16_f16scale_axis-3", x_dtype=np.dtype(np.float16), scale_dtype=np.dtype(np.float16), axis=-3,
         scale="none"),
    dict(name="f16_f16scale_constant", x_dtype=np.dtype(np.float16), scale_dtype=np.dtype(np.float16), axis=-2,
         scale="constant [8, 1]"),
    dict(name="bf16_bf16scale", x_dtype=BFLOAT16, scale_dtype=BFLOAT16),
    dict(name="bf16_skip_eps0", x_dtype=BFLOAT16, skip=True, epsilon=0.0, axis=-2),
    dict(name="bf16_f32scale_outside", x_dtype=BFLOAT16, epsilon=1e-2, outside=1, magnitude=0.05),
]


ONE_SESSION_VARIANTS = [
    v for v in VARIANTS if v["name"] in ("f32_constant_broadcast_scale", "f16_skip", "bf16_skip_eps0")
]


@pytest.mark.parametrize("intra_op_threads", [1, 2], ids=["serial-kernels", "pooled-kernels"])
@pytest.mark.parametrize("variant", ONE_SESSION_VARIANTS, ids=lambda v: v["name"])
def test_one_session_many_threads(rng, variant, intra_op_threads):
    variant = Variant(**variant)
    session = make_session(variant.model(), threads=intra_op_threads)
    variant.make_cases(rng)
    variant.run_alone_and_check(session)

    def worker(thread):
        order = np.random.default_rng(thread).integers(len(variant.cases), size=RUNS_PER_THREAD)
        for index in order:
            variant.check_again(session, int(index))
        return len(order)

    assert sum(_run_together(THREADS, worker)) == THREADS * RUNS_PER_THREAD


def test_many_sessions_in_one_process(rng):
    variants = [Variant(**v) for v in VARIANTS]
    for variant in variants:
        variant.make_cases(rng)

    # Created from many threads at once: the library is registered by every session's options concurrently.
    def create(index):
        return make_session(variants[index].model(), threads=2)

    sessions = _run_together(len(variants), create)
    for variant, session in zip(variants, sessions):
        variant.run_alone_and_check(session)

    # Every thread runs every session, each in its own order, all sessions alive and running at the same time.
    def worker(thread):
        runs = 0
        order_rng = np.random.default_rng(100 + thread)
        for _ in range(3):
            for v in order_rng.permutation(len(variants)):
                variants[v].check_again(sessions[v], int(order_rng.integers(len(variants[v].cases))))
                runs += 1
        return runs

    assert sum(_run_together(THREADS, worker)) == THREADS * 3 * len(variants)


def test_sessions_that_differ_only_in_epsilon_placement_give_distinguishable_results(rng):
    """The data above is sensitive to the attributes that distinguish the sessions: swapping the epsilon placement
    between two sessions would be far outside tolerance, so a mix-up could not hide."""
    by_name = {v["name"]: v for v in VARIANTS}
    outside, inside = Variant(**by_name["f32_axis-2_eps_outside"]), Variant(**by_name["f32_axis-2_eps_inside"])
    outside.make_cases(rng)
    feeds, _ = outside.cases[2]
    results = [run(make_session(v.model()), feeds)[0].astype(np.float64) for v in (outside, inside)]
    rtol, _ = tolerance(np.float32)
    assert np.max(np.abs(results[0] - results[1]) / np.abs(results[1])) > 100 * rtol


# Sessions created and destroyed per round, each on its own thread, while the long-lived sessions keep running.
CHURN_THREADS = 16
CHURN_ROUNDS = 4
CHURN_VARIANTS = ("f32_axis-2_eps_outside", "f16_f16scale_constant", "bf16_skip_eps0", "f32_constant_broadcast_scale")
RUNNING = ("f32_axis-1", "f16_skip", "bf16_f32scale_outside")


def test_sessions_created_and_destroyed_while_others_run(rng):
    by_name = {v["name"]: v for v in VARIANTS}
    running = [Variant(**by_name[name]) for name in RUNNING]
    churned = [Variant(**by_name[name]) for name in CHURN_VARIANTS]
    for variant in (*running, *churned):
        variant.make_cases(rng)
    running_sessions = [make_session(v.model(), threads=2) for v in running]
    for variant, session in zip(running, running_sessions):
        variant.run_alone_and_check(session)
    for variant in churned:
        variant.run_alone_and_check(make_session(variant.model(), threads=1))
    models = {v.name: v.model().SerializeToString() for v in churned}

    stop = threading.Event()
    runs_while_churning = [0] * len(running)

    def keep_running(index):
        order_rng = np.random.default_rng(200 + index)
        variant, session = running[index], running_sessions[index]
        while not stop.is_set():
            variant.check_again(session, int(order_rng.integers(len(variant.cases))))
            runs_while_churning[index] += 1

    def churn(thread):
        # A new session each time: its options register the library again, then the session is run, checked and
        # dropped (destroyed here, on this thread, while the other threads create theirs and run).
        variant = churned[thread % len(churned)]
        session = make_session(models[variant.name], threads=1 + thread % 2)
        for index in range(len(variant.cases)):
            variant.check_again(session, index)
        del session
        return len(variant.cases)

    with ThreadPoolExecutor(len(running)) as runners:
        futures = [runners.submit(keep_running, index) for index in range(len(running))]
        try:
            checked = sum(sum(_run_together(CHURN_THREADS, churn)) for _ in range(CHURN_ROUNDS))
        finally:
            stop.set()
        for future in futures:
            future.result()
    assert checked == CHURN_ROUNDS * CHURN_THREADS * len(ROW_COUNTS)
    assert all(count > 0 for count in runs_while_churning), runs_while_churning
