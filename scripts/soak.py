"""Soak: the installed package's RMSNorm run for a long time in one process, watching for leaks.

Three phases, each in the same process, one after the other:

- ``small``: one session run ``--small`` times on a [1, 64] float32 input (the per-call overhead path),
- ``large``: one session (2 intra-op threads) run ``--large`` times on [512, 4096] float32 (8 MiB, the pooled path),
- ``sessions``: ``--sessions`` sessions created, each with new SessionOptions that register the library again, run
  once and destroyed.

The first output of each phase is checked against a float64 reference; every later output must equal it bit for
bit. At ``--samples`` points per phase it prints the resident set size (VmRSS), the open file descriptors and the
thread count. After the first ``--warmup`` fraction of a phase, the process may grow by at most ``--rss-bound-mib``
(glibc's allocator and onnxruntime's arenas settle in the warm-up; a leak of even a few bytes per run or a few KiB
per session exceeds the bound over the full counts), and its descriptors and threads must be back at their warm-up
counts. Exit status 0: no leak seen; 1: a bound exceeded or an output wrong. Linux only (reads /proc/self).

    scripts/soak                      # the full soak: 1,000,000 small runs, 20,000 large, 10,000 sessions
    scripts/soak --small 20000 --large 200 --sessions 100    # a short one
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path

import numpy as np

from ort_rmsnorm.runtime import make_session

# The test suite's model builder and float64 reference (tests/ holds no package code: the installed one is soaked).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from op_models import norm_model  # noqa: E402
from reference import assert_matches_reference, rmsnorm  # noqa: E402


def scale_of(hidden: int) -> np.ndarray:
    return np.linspace(-2, 2, hidden, dtype=np.float32)


def check_first(output: np.ndarray, x: np.ndarray, phase: str) -> None:
    expected, _ = rmsnorm(x, scale_of(x.shape[-1]))
    try:
        assert_matches_reference(output, expected, np.float32, f"soak {phase}: the first output")
    except AssertionError as error:
        raise SystemExit(str(error)) from None


def status_field(name: str) -> int:
    """A count from /proc/self/status (``VmRSS`` in KiB, ``Threads``)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(f"{name}:"):
                return int(line.split()[1])
    raise RuntimeError(f"no {name} in /proc/self/status")


def fds() -> int:
    return len(os.listdir("/proc/self/fd")) - 1  # less the descriptor listdir itself holds


class Phase:
    """Samples one phase at evenly spaced points and judges its growth after warm-up."""

    def __init__(self, name: str, count: int, samples: int, warmup: float):
        self.name, self.count = name, count
        points = np.linspace(0, count, max(samples, 2) + 1).round().astype(int)[1:]
        self.points = set(int(p) for p in points)
        self.warmup_end = max(1, int(round(count * warmup)))
        self.points.add(self.warmup_end)
        self.curve: list[tuple[int, int, int, int]] = []
        self.start = time.perf_counter()
        self.sample(0)

    def sample(self, done: int) -> None:
        gc.collect()
        row = (done, status_field("VmRSS"), fds(), status_field("Threads"))
        self.curve.append(row)
        rate = done / max(time.perf_counter() - self.start, 1e-9)
        print(f"{self.name:8} {done:>9} runs  rss {row[1] / 1024:8.1f} MiB  fds {row[2]:3}  threads {row[3]:3}"
              f"  ({rate:,.0f}/s)", flush=True)

    def after(self, done: int) -> None:
        if done in self.points:
            self.sample(done)

    def verdict(self, rss_bound_mib: float) -> list[str]:
        warm = next(row for row in self.curve if row[0] == self.warmup_end)
        later = [row for row in self.curve if row[0] >= self.warmup_end]
        growth = max(row[1] for row in later) - warm[1]
        end = self.curve[-1]
        runs = end[0] - warm[0]
        print(f"{self.name:8} after warm-up ({warm[0]} runs, rss {warm[1] / 1024:.1f} MiB): rss grew at most "
              f"{growth / 1024:.1f} MiB over {runs} runs ({growth * 1024 / max(runs, 1):.1f} bytes per run); "
              f"fds {warm[2]} -> {end[2]}, threads {warm[3]} -> {end[3]}; "
              f"{time.perf_counter() - self.start:.1f} s", flush=True)
        problems = []
        if growth > rss_bound_mib * 1024:
            problems.append(f"{self.name}: RSS grew {growth / 1024:.1f} MiB after warm-up (bound {rss_bound_mib} MiB)")
        if end[2] > warm[2]:
            problems.append(f"{self.name}: open file descriptors {warm[2]} -> {end[2]}")
        if end[3] > warm[3]:
            problems.append(f"{self.name}: threads {warm[3]} -> {end[3]}")
        return problems


def run_phase(name: str, count: int, args, step) -> list[str]:
    if count <= 0:
        return []
    phase = Phase(name, count, args.samples, args.warmup)
    for done in range(1, count + 1):
        step()
        phase.after(done)
    return phase.verdict(args.rss_bound_mib)


def model_of(hidden: int):
    return norm_model(np.float32, np.float32, x_shape=("rows", hidden), constant_scale=scale_of(hidden))


def one_session(hidden: int, rows: int, intra_op_threads: int, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, hidden)).astype(np.float32)
    session = make_session(model_of(hidden), threads=intra_op_threads)
    first = session.run(None, {"x": x})[0]
    return session, x, first


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", type=int, default=1_000_000, help="runs on a [1, 64] input (default 1000000)")
    parser.add_argument("--large", type=int, default=20_000, help="runs on a [512, 4096] input (default 20000)")
    parser.add_argument("--sessions", type=int, default=10_000, help="sessions created and destroyed (default 10000)")
    parser.add_argument("--samples", type=int, default=20, help="measurements per phase (default 20)")
    parser.add_argument("--warmup", type=float, default=0.1, help="fraction of each phase before the bounds apply")
    parser.add_argument("--rss-bound-mib", type=float, default=8.0,
                        help="allowed RSS growth after warm-up, per phase (default 8 MiB)")
    parser.add_argument("--inject-leak", type=int, default=0, metavar="BYTES",
                        help="keep BYTES per small run alive: shows that the bound catches a leak "
                             "(tests/ops/test_soak.py)")
    args = parser.parse_args(argv)
    if not os.path.isdir("/proc/self/fd"):
        print("soak: needs Linux's /proc/self", file=sys.stderr)
        return 2
    print(f"soak: {args.small} small runs, {args.large} large runs, {args.sessions} sessions; "
          f"RSS bound {args.rss_bound_mib} MiB per phase after the first {args.warmup:.0%}", flush=True)
    problems: list[str] = []

    for name, count, hidden, rows, pool in (("small", args.small, 64, 1, 1), ("large", args.large, 4096, 512, 2)):
        if count <= 0:
            continue
        session, x, first = one_session(hidden, rows, pool, seed=len(name))
        check_first(first, x, name)
        feeds = {"x": x}
        kept: list[bytes] = []
        leak = args.inject_leak if name == "small" else 0

        def step(session=session, feeds=feeds, first=first, name=name, kept=kept, leak=leak):
            if not np.array_equal(session.run(None, feeds)[0], first):
                raise SystemExit(f"soak {name}: an output differs from the first one")
            if leak:
                kept.append(os.urandom(leak))

        problems += run_phase(name, count, args, step)
        del session, step

    model = model_of(64)
    x = np.random.default_rng(7).standard_normal((4, 64)).astype(np.float32)
    first = make_session(model, threads=1).run(None, {"x": x})[0]
    check_first(first, x, "sessions")

    def new_session():
        session = make_session(model, threads=2)  # new SessionOptions: the library registered again
        if not np.array_equal(session.run(None, {"x": x})[0], first):
            raise SystemExit("soak sessions: an output differs from the first one")

    problems += run_phase("sessions", args.sessions, args, new_session)

    for problem in problems:
        print(f"soak: FAIL {problem}", file=sys.stderr)
    if not problems:
        print("soak: ok")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
