"""``ort-rmsnorm bench``: what the command line runs once its options are parsed (ort_rmsnorm.bench.arguments).

:func:`run_checked` is the subcommand: :func:`problem` says, before anything is measured, why a run cannot start (a
missing optional dependency, options that do not go together), reported as a usage error; the folders the run writes
into are made; then :func:`run_bench` runs the kernel benchmark or an end-to-end one and writes its results."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

from ..command_line import UsageError, make_directory
from ..model.write import write_text_atomically
from ..schemas import register_schemas
from . import e2e_plan, plots
from .arguments import plan_from_args
from .machine import load_note, machine_info, machine_line
from .plan import run_plan
from .tables import markdown_tables


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def problem(args: argparse.Namespace) -> str | None:
    """Why the run that `args` asks for cannot start, or None."""
    if args.e2e == "float":
        if not installed("torch"):
            return "--e2e exports its model with torch, which is not installed (pip install torch)"
        several = [option for option, value in (("--e2e-hidden", args.e2e_hidden), ("--e2e-threads", args.e2e_threads))
                   if value is not None and len(value) > 1]
        if several:
            return f"--e2e float measures one model: give {' and '.join(several)} one value (--e2e int4 takes several)"
        if args.e2e_past is not None or args.e2e_asymmetric or args.e2e_accuracy_level is not None:
            return "--e2e-past, --e2e-asymmetric and --e2e-accuracy-level are options of --e2e int4"
    if args.e2e == "int4":
        missing = [name for name in ("torch", "transformers") if not installed(name)]
        if missing:
            return (f"--e2e int4 exports a transformers Llama with torch: {' and '.join(missing)} "
                    f"{'is' if len(missing) == 1 else 'are'} not installed (pip install {' '.join(missing)})")
        from ..builders import int4

        if (why := int4.unavailable()) is not None:
            return f"--e2e int4 quantizes with onnxruntime's quantizer: {why}"
        if args.e2e_dtypes is not None and args.e2e_dtypes != ["float32"]:
            return "--e2e int4 runs float32 activations (the CPU's int4 models): leave out --e2e-dtypes"
    return None


def run_checked(args: argparse.Namespace) -> int:
    """Checks what a run needs before it starts (a full run takes minutes), then runs it; :class:`UsageError` for a
    run that cannot start."""
    if (why := problem(args)) is not None:
        raise UsageError(why)
    if not args.e2e and args.plot != "none" and not plots.can_plot():
        if args.plot is not None:
            raise UsageError(f"--plot {args.plot}: matplotlib is not installed (pip install matplotlib), "
                             "or --plot none")
        print("no plot: matplotlib is not installed (pip install matplotlib)", file=sys.stderr)
        args.plot = "none"
    make_directory("--out", Path(args.out))
    if args.e2e and args.e2e_keep:
        make_directory("--e2e-keep", Path(args.e2e_keep))
    if not args.e2e and args.plot not in (None, "none"):
        make_directory("--plot", Path(args.plot).parent)
    register_schemas()
    return run_bench(args)


def run_bench(args: argparse.Namespace) -> int:
    if args.e2e == "float":
        return run_float_e2e(args)
    if args.e2e == "int4":
        return run_int4_e2e(args)
    plan = plan_from_args(args)
    report = run_plan(plan)
    out = Path(args.out)
    write_text_atomically(out / "cpu.json", json.dumps(report, indent=1))
    tables = markdown_tables(report)
    write_text_atomically(out / "cpu.md", tables)
    print(tables)
    machine = report["machine"]
    loads = [machine[key][0] for key in ("load_average_at_start", "load_average_at_end") if key in machine]
    if (note := load_note(loads, max(plan.threads))) is not None:
        print(note)
    if args.plot != "none":
        plot = Path(args.plot) if args.plot else out / "cpu.png"
        plots.write_plot(report, plot)
        print(f"plot: {plot}")
    print(f"results: {out / 'cpu.json'}, {out / 'cpu.md'}")
    return 0


def _write_e2e(out: Path, name: str, report: dict, table: str) -> None:
    table = machine_line(report["machine"]) + "\n\n" + table
    write_text_atomically(out / f"{name}.json", json.dumps(report, indent=1))
    write_text_atomically(out / f"{name}.md", table)
    print(table)
    print(f"results: {out / f'{name}.json'}, {out / f'{name}.md'}")


def run_float_e2e(args: argparse.Namespace) -> int:
    from . import e2e  # imports torch

    defaults = e2e_plan.FLOAT_CONFIG
    hidden = args.e2e_hidden[0] if args.e2e_hidden else defaults.hidden_size
    config = dataclasses.replace(defaults, hidden_size=hidden, num_layers=args.e2e_layers or defaults.num_layers,
                                 vocab_size=args.e2e_vocab or defaults.vocab_size,
                                 intermediate_size=hidden * defaults.intermediate_size // defaults.hidden_size)
    runs = e2e_plan.FLOAT_RUNS
    machine = machine_info()
    report = e2e.run_e2e(config, dtypes=args.e2e_dtypes or list(e2e_plan.FLOAT_DTYPES),
                         prefill_tokens=args.e2e_prefill or e2e_plan.FLOAT_PREFILL_TOKENS,
                         prefill_runs=args.e2e_prefill_runs or runs["prefill"],
                         decode_runs=args.e2e_decode_runs or runs["decode"],
                         profile_runs=args.e2e_profile_runs or runs["profile"],
                         threads=args.e2e_threads[0] if args.e2e_threads else None, workdir=args.e2e_keep)
    report = {"machine": machine, **report}
    _write_e2e(Path(args.out), "e2e", report, e2e.markdown(report))
    return 0


def int4_plan_from_args(args: argparse.Namespace) -> e2e_plan.Int4Plan:
    defaults = e2e_plan.QUICK_INT4 if args.quick else e2e_plan.Int4Plan()
    given = {
        "hidden_sizes": tuple(args.e2e_hidden) if args.e2e_hidden else None,
        "layers": args.e2e_layers, "vocab": args.e2e_vocab, "past_tokens": args.e2e_past,
        "prefill_tokens": args.e2e_prefill, "threads": tuple(args.e2e_threads) if args.e2e_threads else None,
        "decode_runs": args.e2e_decode_runs, "prefill_runs": args.e2e_prefill_runs,
        "profile_runs": args.e2e_profile_runs, "accuracy_level": args.e2e_accuracy_level,
        "symmetric": False if args.e2e_asymmetric else None, "clock": args.clock,
    }
    return dataclasses.replace(defaults, **{key: value for key, value in given.items() if value is not None})


def run_int4_e2e(args: argparse.Namespace) -> int:
    from . import e2e_int4, int4_tables

    plan = int4_plan_from_args(args)
    machine = machine_info()
    report = {"machine": machine, **e2e_int4.run_int4(plan, workdir=args.e2e_keep)}
    _write_e2e(Path(args.out), "e2e-int4", report, int4_tables.markdown(report))
    return 0
