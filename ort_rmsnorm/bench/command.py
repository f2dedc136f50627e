"""``ort-rmsnorm bench``: what the command line runs once its options are parsed (ort_rmsnorm.bench.arguments).

:func:`problem` says, before anything is measured, why a run cannot start (a missing optional dependency, options
that do not go together); the command line reports it as a usage error. :func:`run_bench` runs the kernel benchmark
or an end-to-end one and writes its results."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
from pathlib import Path

from ..model_io import write_text_atomically
from . import e2e_plan
from .arguments import plan_from_args
from .machine import machine_info, machine_line
from .plan import run_plan
from .plots import write_plot
from .tables import markdown_tables


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def problem(args: argparse.Namespace) -> str | None:
    """Why the run that `args` asks for cannot start, or None."""
    if args.e2e and not installed("torch"):
        return "--e2e exports its model with torch, which is not installed (pip install torch)"
    return None


def run_bench(args: argparse.Namespace) -> int:
    if args.e2e:
        return run_e2e(args)
    plan = plan_from_args(args)
    report = run_plan(plan)
    out = Path(args.out)
    write_text_atomically(out / "cpu.json", json.dumps(report, indent=1))
    tables = markdown_tables(report)
    write_text_atomically(out / "cpu.md", tables)
    print(tables)
    if args.plot != "none":
        plot = Path(args.plot) if args.plot else out / "cpu.png"
        write_plot(report, plot)
        print(f"plot: {plot}")
    print(f"results: {out / 'cpu.json'}, {out / 'cpu.md'}")
    return 0


def _write_e2e(out: Path, name: str, report: dict, table: str) -> None:
    table = machine_line(report["machine"]) + "\n\n" + table
    write_text_atomically(out / f"{name}.json", json.dumps(report, indent=1))
    write_text_atomically(out / f"{name}.md", table)
    print(table)
    print(f"results: {out / f'{name}.json'}, {out / f'{name}.md'}")


def run_e2e(args: argparse.Namespace) -> int:
    from . import e2e  # imports torch

    defaults = e2e_plan.FLOAT_CONFIG
    config = dataclasses.replace(defaults, hidden_size=args.e2e_hidden, num_layers=args.e2e_layers,
                                 vocab_size=args.e2e_vocab,
                                 intermediate_size=args.e2e_hidden * defaults.intermediate_size // defaults.hidden_size)
    machine = machine_info()
    report = e2e.run_e2e(config, dtypes=args.e2e_dtypes, prefill_tokens=args.e2e_prefill, threads=args.e2e_threads,
                         workdir=args.e2e_keep)
    report = {"machine": machine, **report}
    _write_e2e(Path(args.out), "e2e", report, e2e.markdown(report))
    return 0
