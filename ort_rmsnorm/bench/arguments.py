"""The options of ``ort-rmsnorm bench`` (the command line adds them to its ``bench`` parser) and the plans they
describe. Importing this module imports neither torch nor onnxscript."""

from __future__ import annotations

import argparse
import math
from typing import Callable, Iterable

from . import e2e_plan
from .machine import all_threads
from .models import CONTENDER_NAMES, DTYPES
from .plan import CHAIN_LENGTH, FULL, HIDDEN_SIZES, PREFILL_ROWS, QUICK, Plan
from .timing import CLOCKS


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def _milliseconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value >= 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of milliseconds >= 0")
    return value


def _positive_list(text: str) -> list[int]:
    return [_positive(item) for item in text.split(",")]


def _thread_counts(text: str) -> list[int]:
    return sorted({all_threads() if item == "all" else _positive(item) for item in text.split(",")})


def _choices(allowed: Iterable[str]) -> Callable[[str], list[str]]:
    allowed = list(allowed)

    def parse(text: str) -> list[str]:
        items = text.split(",")
        if unknown := [item for item in items if item not in allowed]:
            raise argparse.ArgumentTypeError(
                f"unknown {', '.join(map(repr, unknown))} (choose from {', '.join(allowed)})")
        return items

    return parse


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="H in {1024, 4096} and 5 repetitions (about a minute)")
    parser.add_argument("--dtypes", type=_choices(DTYPES), default=list(DTYPES), help="comma-separated element types")
    parser.add_argument("--hidden", type=_positive_list,
                        help=f"comma-separated hidden sizes (default {','.join(map(str, HIDDEN_SIZES))})")
    parser.add_argument("--rows", type=_positive_list,
                        help=f"comma-separated row counts (default 1,{PREFILL_ROWS}: decode and prefill)")
    parser.add_argument("--threads", type=_thread_counts, default="1,all",
                        help="comma-separated intra-op thread counts; 'all' = the cores this process may use")
    parser.add_argument("--contenders", type=_choices(CONTENDER_NAMES), default=list(CONTENDER_NAMES),
                        help=f"comma-separated subset of {','.join(CONTENDER_NAMES)}")
    parser.add_argument("--repetitions", type=_positive, help="interleaved repetitions per case (default 11, quick 5)")
    parser.add_argument("--min-sample-ms", type=_milliseconds,
                        help="calls per sample are repeated to last this long (0: one call per sample)")
    parser.add_argument("--decode-hidden", type=_positive, default=4096,
                        help="H of the 1 x H case whose per-node cost is measured without Python (default 4096)")
    parser.add_argument("--profile-runs", type=_positive, help="profiled runs per contender (default 2000, quick 300)")
    parser.add_argument("--chain-length", type=_positive, default=CHAIN_LENGTH,
                        help=f"nodes in series for chain differencing (default {CHAIN_LENGTH}; 1 = skip)")
    parser.add_argument("--no-decode", action="store_true", help="skip the decode per-node cost measurements")
    parser.add_argument("--clock", choices=CLOCKS, default="auto",
                        help="auto: the calling thread's CPU time for 1-thread cases (robust on a shared machine), "
                             "wall time otherwise; wall: wall time everywhere")
    parser.add_argument("--out", default="bench-results", help="directory for the JSON and markdown results")
    parser.add_argument("--plot", help="PNG path of the GB/s plot (default <out>/cpu.png); 'none' to skip")
    _add_e2e_arguments(parser)


def _add_e2e_arguments(parser: argparse.ArgumentParser) -> None:
    config = e2e_plan.FLOAT_CONFIG
    e2e = parser.add_argument_group("end to end (needs torch)")
    e2e.add_argument("--e2e", action="store_true",
                     help="instead of the kernels: a Llama-style model exported from torch, original vs fused")
    e2e.add_argument("--e2e-dtypes", type=_choices(DTYPES), default=list(e2e_plan.FLOAT_DTYPES),
                     help=f"comma-separated (default {','.join(e2e_plan.FLOAT_DTYPES)})")
    e2e.add_argument("--e2e-hidden", type=_positive, default=config.hidden_size,
                     help=f"hidden size (default {config.hidden_size})")
    e2e.add_argument("--e2e-layers", type=_positive, default=config.num_layers,
                     help=f"decoder layers (default {config.num_layers})")
    e2e.add_argument("--e2e-vocab", type=_positive, default=config.vocab_size,
                     help=f"vocabulary size (default {config.vocab_size})")
    e2e.add_argument("--e2e-prefill", type=_positive, default=e2e_plan.FLOAT_PREFILL_TOKENS,
                     help=f"prefill tokens (default {e2e_plan.FLOAT_PREFILL_TOKENS})")
    e2e.add_argument("--e2e-threads", type=_positive,
                     help="intra-op threads (default: onnxruntime's, all cores); 1 is timed with CPU time")
    e2e.add_argument("--e2e-keep", metavar="DIR", help="keep the exported and fused models in DIR")


def plan_from_args(args: argparse.Namespace) -> Plan:
    defaults = QUICK if args.quick else FULL
    return Plan(
        dtypes=args.dtypes,
        hidden_sizes=args.hidden or defaults["hidden_sizes"],
        rows=args.rows or defaults["rows"],
        threads=args.threads,
        repetitions=args.repetitions or defaults["repetitions"],
        min_sample_s=args.min_sample_ms / 1e3 if args.min_sample_ms is not None else defaults["min_sample_s"],
        contenders=args.contenders,
        decode_hidden=None if args.no_decode else args.decode_hidden,
        profile_runs=args.profile_runs or defaults["profile_runs"],
        chain_length=args.chain_length,
        clock=args.clock,
    )
