"""Runs generated hostile models through onnxruntime with a (sanitized) build of the library, in child processes.

    python tests/adversarial/harness.py --library build/sanitize/libort_rmsnorm.so --cases 300 --seed 1
    python tests/adversarial/harness.py --library ... --replay 1:42 [--save DIR]

One child (tests/adversarial/worker.py) runs many cases in sequence and announces each before running it. A child
that dies (signal, abort, sanitizer report) or exceeds --timeout on a case fails that case: its id, description,
the sanitizer report and a replay command are printed, and a new child continues with the next case. Every other
failing verdict of the worker (unclean error, invalid model accepted, wrong numbers, valid model rejected) is
printed the same way. Exit status 1 when any case failed.

With the sanitized library, `--preload` names the sanitizer runtimes to preload into the child's Python (which is
not instrumented): scripts/test-adversarial passes libasan and libubsan.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/

# allocator_may_return_null=0: an allocation sized from an overflowed or unchecked product aborts the child
# (allocation-size-too-big) instead of surfacing as std::bad_alloc. Leaks are not this harness's subject (Python and
# onnxruntime keep memory until exit by design; scripts/test-sanitizers checks our library's).
ASAN_OPTIONS = "abort_on_error=1:allocator_may_return_null=0:detect_leaks=0:handle_abort=1"
UBSAN_OPTIONS = "print_stacktrace=1:abort_on_error=1:halt_on_error=1"


class Child:
    def __init__(self, args, logs: str):
        self.logs = logs
        env = dict(os.environ)
        env["ASAN_OPTIONS"] = f"{ASAN_OPTIONS}:log_path={logs}/asan"
        env["UBSAN_OPTIONS"] = f"{UBSAN_OPTIONS}:log_path={logs}/ubsan"
        if args.preload:
            env["LD_PRELOAD"] = args.preload
        env.setdefault("OMP_NUM_THREADS", "1")
        self.stderr = open(os.path.join(logs, "stderr"), "w+")
        self.process = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "worker.py"), "--library", args.library],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, env=env, bufsize=0)
        self.buffer = b""

    def send(self, seed: int, index: int) -> None:
        self.process.stdin.write(f"{seed} {index}\n".encode())
        self.process.stdin.flush()

    def line(self, timeout: float) -> str | None:
        """The next line of output, or None when the child ended or the timeout passed."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self.process.stdout], [], [], left)
            if not ready:
                return None
            chunk = os.read(self.process.stdout.fileno(), 65536)
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode(errors="replace")

    def reports(self) -> str:
        """The sanitizer reports and stderr the child left."""
        texts = []
        for name in sorted(os.listdir(self.logs)):
            with open(os.path.join(self.logs, name), errors="replace") as f:
                text = f.read().strip()
            if text:
                texts.append(f"--- {name}\n{text[:6000]}")  # a report's first lines and frames say the most
        return "\n".join(texts)

    def stop(self) -> str:
        """Ends the child and removes its logs (read them first); says how it ended."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        status = self.process.returncode
        self.stderr.close()
        shutil.rmtree(self.logs, ignore_errors=True)
        if status is not None and status < 0:
            return f"killed by signal {signal.Signals(-status).name}"
        return f"exit status {status}"


def describe(case: dict) -> str:
    lines = [f"tags: {' '.join(case['tags'])}"]
    for spec in case["inputs"]:
        lines.append(f"input {spec['name']}: {spec['dtype']} declared {spec['declared']} fed {spec['shape']} "
                     f"values {spec['values']}")
    for spec in case["initializers"]:
        lines.append(f"initializer {spec['name']}: {spec['dtype']} {spec['shape']} values {spec['values']}")
    for node in case["nodes"]:
        lines.append(f"node {node['op']} {node['name']!r}: inputs {node['inputs']} outputs {node['outputs']} "
                     f"attributes {node['attributes']}")
    lines.append(f"graph outputs: {case['outputs']}")
    return "\n".join(lines)


def report_failure(case_id: str, verdict: dict, reports: str = "") -> None:
    from adversarial.cases import generate
    seed, index = (int(part) for part in case_id.split(":"))
    print(f"\nFAILED case {case_id}: {verdict['outcome']}: {verdict.get('detail', '')}", flush=True)
    print(describe(generate(seed, index)))
    if reports:
        print(reports)
    print(f"repro: scripts/test-adversarial --replay {case_id}   (or: python tests/adversarial/harness.py "
          f"--library <libort_rmsnorm.so> --replay {case_id} --save DIR)", flush=True)


def run(args) -> int:
    counts = collections.Counter()
    tag_counts = collections.Counter()
    failed_tags = collections.Counter()
    failures = []
    child = None
    started = time.monotonic()
    log = open(args.log, "w") if args.log else None
    indices = range(args.start, args.start + args.cases)
    for index in indices:
        case_id = f"{args.seed}:{index}"
        if child is None:
            logs = tempfile.mkdtemp(prefix="adversarial-")
            child = Child(args, logs)
        child.send(args.seed, index)
        # The first case of a child also waits for Python and onnxruntime to start.
        begin = child.line(args.timeout + 60)
        verdict = None
        if begin == f"BEGIN {case_id}":
            end = child.line(args.timeout)
            if end and end.startswith(f"END {case_id} "):
                verdict = json.loads(end[len(f"END {case_id} "):])
        if verdict is None:
            try:
                child.process.wait(timeout=5)  # ended (output closed) or still running (the case hangs)
            except subprocess.TimeoutExpired:
                pass
            alive = child.process.poll() is None
            reports = child.reports()
            how = child.stop()
            what = f"did not finish within {args.timeout:g} s" if alive else "died"
            verdict = {"ok": False, "outcome": "timeout" if alive else "child-died",
                       "detail": f"the worker {what} ({how})"}
            report_failure(case_id, verdict, reports)
            child = None
        elif not verdict["ok"]:
            report_failure(case_id, verdict)
        counts[verdict["outcome"]] += 1
        if args.replay:
            print(f"{case_id}: {verdict['outcome']}: {verdict.get('detail', '')}")
        if log:
            log.write(json.dumps({"id": case_id, **verdict}) + "\n")
        from adversarial.cases import generate
        tags = verdict.get("tags") or generate(args.seed, index)["tags"]
        for tag in tags:
            tag_counts[tag] += 1
            if not verdict["ok"]:
                failed_tags[tag] += 1
        if not verdict["ok"]:
            failures.append(case_id)
    if child is not None:
        child.process.stdin.close()
        child.stop()
    elapsed = time.monotonic() - started
    print(f"\n{args.cases} cases (seed {args.seed}, indices {args.start}..{args.start + args.cases - 1}) in "
          f"{elapsed:.0f} s: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    if args.summary:
        with open(args.summary, "w") as f:
            json.dump({"seed": args.seed, "start": args.start, "cases": args.cases, "outcomes": counts,
                       "tags": tag_counts, "failed_tags": failed_tags, "failures": failures}, f, indent=1,
                      sort_keys=True)
    if failures:
        print(f"FAILED {len(failures)} cases: {' '.join(failures[:50])}")
        return 1
    return 0


def replay(args) -> int:
    from adversarial.cases import build, generate
    seed, index = (int(part) for part in args.replay.split(":"))
    case = generate(seed, index)
    print(describe(case))
    if args.save:
        import numpy as np
        import onnx
        os.makedirs(args.save, exist_ok=True)
        model, feeds = build(case)
        onnx.save(model, os.path.join(args.save, "model.onnx"))
        np.savez(os.path.join(args.save, "feeds.npz"),
                 **{k: (v.view(np.uint16) if v.dtype.name == "bfloat16" else v) for k, v in feeds.items()
                    if v is not None})
        with open(os.path.join(args.save, "case.json"), "w") as f:
            json.dump(case, f, indent=1)
        print(f"saved {args.save}/model.onnx, feeds.npz, case.json")
    args.seed, args.start, args.cases = seed, index, 1
    return run(args)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--library", required=True)
    parser.add_argument("--preload", default="", help="LD_PRELOAD for the child (the sanitizer runtimes)")
    parser.add_argument("--cases", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start", type=int, default=0, help="first case index")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds one case may take")
    parser.add_argument("--replay", metavar="SEED:INDEX", help="run this one case (and print it)")
    parser.add_argument("--save", metavar="DIR", help="with --replay: write its model, feeds and description")
    parser.add_argument("--summary", metavar="FILE", help="write counts per outcome and per tag as JSON")
    parser.add_argument("--log", metavar="FILE", help="write every case's verdict as a JSON line")
    args = parser.parse_args()
    return replay(args) if args.replay else run(args)


if __name__ == "__main__":
    sys.exit(main())
