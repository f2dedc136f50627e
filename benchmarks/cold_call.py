"""What one norm costs per call where a decoder runs it: cold, right after a MatMul (ort_rmsnorm.bench.cold).

    python benchmarks/cold_call.py                                   # H 64 ... 8192, float32 and float16
    python benchmarks/cold_call.py --compare-library OLD.so          # another build of ours, side by side
    python benchmarks/cold_call.py --write-shipped rewrites/_auto_table.py   # the auto target's shipped table

Per op (ours, onnxruntime's) and type, the median over rounds of each contender's per-norm time in onnxruntime's
profiler, and the per-round ratios' quartiles, all contenders interleaved in one process, one thread. Where each
part of our call goes: build the library with ``-DCMAKE_CXX_FLAGS=-DORT_RMSNORM_CALL_STAMPS`` (custom_op_src/ort/
call_stamps.h) and pass it as ``--library``; the medians of each part's time-stamp counter ticks are printed to stderr
when the process ends.
"""

from __future__ import annotations

import argparse
import os
import time

import onnxruntime as ort

from ort_rmsnorm import get_library_path
from ort_rmsnorm.auto_table import cpu_key
from ort_rmsnorm.bench import cold, tune
from ort_rmsnorm.contract import RMSNORM, SKIP_RMSNORM


def write_shipped(path: str, table) -> None:
    """Rewrites the shipped table's module (rewrites/_auto_table.py) below its docstring."""
    with open(path) as file:
        text = file.read()
    head = text[: text.index("MEASURED_ON = ")]
    with open(path, "w") as file:
        file.write(head + f"MEASURED_ON = {table.measured_on!r}\nFASTER_UP_TO: dict[str, dict[str, int]] = {{\n")
        file.writelines(f"    {op!r}: {dict(limits)!r},\n" for op, limits in table.faster_up_to.items())
        file.write("}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--library", help="our library (default: the installed package's)")
    parser.add_argument("--compare-library", help="another build of ours, timed side by side")
    parser.add_argument("--hidden", default="64,128,256,512,576,768,1024,2048,4096,8192")
    parser.add_argument("--dtypes", default="float32,float16")
    parser.add_argument("--weight-mib", type=float, default=tune.DEFAULT_WEIGHT_MIB,
                        help="float32 weights per stage (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--write-shipped", metavar="PATH",
                        help="measure as `ort-rmsnorm tune` does and write the shipped table's module")
    args = parser.parse_args()
    library = args.library or str(get_library_path())
    hidden = [int(h) for h in args.hidden.split(",")]
    dtypes = args.dtypes.split(",")
    print(f"{cpu_key()}, onnxruntime {ort.__version__}, one thread, {args.weight_mib:g} MiB of float32 weights per "
          f"MatMul pair, {args.rounds} rounds of {args.runs} runs, load average {os.getloadavg()[0]:.2f} at start\n")
    if args.write_shipped:
        table, _ = tune.measure(hidden, dtypes, rounds=args.rounds, runs=args.runs, weight_mib=args.weight_mib,
                                library=library)
        write_shipped(args.write_shipped, table)
        print(f"wrote {args.write_shipped}: {dict(table.faster_up_to)} (load average {os.getloadavg()[0]:.2f})")
        return
    labels = ["ours"] + (["compared"] if args.compare_library else [])
    print("| op | type | H | onnxruntime us | " + " | ".join(f"{label} us | {label} / onnxruntime [q1-q3]"
                                                          for label in labels) + " |")
    print("|---|---|---|---|" + "---|---|" * len(labels))
    for dtype in dtypes:
        for h in hidden:
            stage_weights = cold.weights(h, tune.STAGES, args.weight_mib)
            for op in (RMSNORM, SKIP_RMSNORM):
                contenders = [cold.Contender("ours", op, library), cold.Contender("onnxruntime", cold.OPPONENT[op])]
                if args.compare_library:
                    contenders.append(cold.Contender("compared", op, args.compare_library))
                result = cold.measure(contenders, dtype, h, stage_weights, rounds=args.rounds, runs=args.runs)
                cells = []
                for label in labels:
                    q1, median, q3 = cold.quartiles(result.ratios(label, "onnxruntime"))
                    cells.append(f"{result.median(label):.2f} | {median:.3f} [{q1:.3f}-{q3:.3f}]")
                print(f"| {op} | {dtype} | {h} | {result.median('onnxruntime'):.2f} | " + " | ".join(cells) + " |",
                      flush=True)
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end, {time.strftime('%Y-%m-%d %H:%M')}")


if __name__ == "__main__":
    main()
