"""Two builds of benchmarks/kernel_bench (say, GCC with libstdc++ against zig's clang with libc++) side by side: each
configuration runs on both in turn, round after round, so that a change of the machine's load reaches both; the
table gives each kernel set's time relative to memcpy (the median over rounds of each run's median) and new / old.

    python benchmarks/compare_builds.py OLD_KERNEL_BENCH NEW_KERNEL_BENCH [--rounds 3] [--repetitions 7] [--out FILE]

Both binaries run on this machine and so copy with its glibc's memcpy, the common yardstick."""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
from pathlib import Path

CONFIGURATIONS = [  # (label, kernel_bench arguments)
    ("RMSNorm float16 2048 x 4096, streaming", ["--dtype", "float16", "--rows", "2048", "--cols", "4096", "--streaming"]),
    ("RMSNorm float32 2048 x 4096, streaming", ["--dtype", "float32", "--rows", "2048", "--cols", "4096", "--streaming"]),
    ("RMSNorm bfloat16 2048 x 4096, streaming",
     ["--dtype", "bfloat16", "--rows", "2048", "--cols", "4096", "--streaming"]),
    ("SkipRMSNorm float16 16 x 4096 (decode)", ["--dtype", "float16", "--rows", "16", "--cols", "4096", "--skip"]),
    ("SkipRMSNorm bfloat16 16 x 4096 (decode)", ["--dtype", "bfloat16", "--rows", "16", "--cols", "4096", "--skip"]),
    ("RMSNorm float32 64 x 4096 (cached)", ["--dtype", "float32", "--rows", "64", "--cols", "4096"]),
]


def run(binary: str, arguments: list[str]) -> dict[str, float]:
    """Contender -> time relative to memcpy, from one kernel_bench run."""
    output = subprocess.run([binary, *arguments], check=True, capture_output=True, text=True).stdout
    ratios = {}
    column = None
    for line in output.splitlines():
        if line.startswith("contender"):
            column = 3  # us per call, ns per el, GB/s, x memcpy[, x stream copy]
            continue
        fields = line.split()
        numbers = [i for i, field in enumerate(fields) if field.replace(".", "", 1).isdigit()]
        if column is None or not numbers:
            continue
        name = " ".join(fields[:numbers[0]])
        values = fields[numbers[0]:]
        if name not in ("memcpy", "stream copy") and len(values) > column:
            ratios[name] = float(values[column])
    if not ratios:
        sys.exit(f"compare_builds: no results from {binary} {' '.join(arguments)}:\n{output}")
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repetitions", type=int, default=7)
    parser.add_argument("--out", type=Path, help="also write the table (markdown) here")
    args = parser.parse_args()
    lines = [f"kernel_bench, time relative to memcpy (lower is faster), median of {args.rounds} alternating rounds "
             f"of {args.repetitions} repetitions; machine: {platform.machine()}, {platform.processor() or ''}".rstrip(", "),
             "", f"old: `{args.old}`", f"new: `{args.new}`", "",
             "| configuration | kernels | old x memcpy | new x memcpy | new / old |", "|---|---|---|---|---|"]
    for label, arguments in CONFIGURATIONS:
        arguments = [*arguments, "--repetitions", str(args.repetitions)]
        old_runs, new_runs = [], []
        for round_index in range(args.rounds):
            pair = [(args.old, old_runs), (args.new, new_runs)]
            for binary, runs in pair if round_index % 2 == 0 else reversed(pair):
                runs.append(run(binary, arguments))
        for contender in old_runs[0]:
            if contender not in new_runs[0]:
                continue
            old = statistics.median(r[contender] for r in old_runs)
            new = statistics.median(r[contender] for r in new_runs)
            lines.append(f"| {label} | {contender} | {old:.2f} | {new:.2f} | {new / old:.3f} |")
        print("\n".join(lines[-len(old_runs[0]):]), flush=True)
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
