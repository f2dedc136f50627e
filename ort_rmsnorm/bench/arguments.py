"""The options of ``ort-rmsnorm bench`` (the command line adds them to its ``bench`` parser) and the plans they
describe. Importing this module imports neither torch nor onnxscript."""

from __future__ import annotations

import argparse
import math
from typing import Callable, Iterable

from . import e2e_plan
from .machine import all_threads
from .contenders import CONTENDER_NAMES, DTYPES
from .plan import CHAIN_LENGTH, FULL, HIDDEN_SIZES, PREFILL_ROWS, QUICK, Plan
from .timing import CLOCKS


"""The subcommand's one-line description."""


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


def _non_negative(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a non-negative integer")
    return int(text)


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
    floats, int4 = e2e_plan.FLOAT_CONFIG, e2e_plan.Int4Plan()
    e2e = parser.add_argument_group(
        "end to end (needs torch; int4 also transformers)",
        "Defaults are given as 'float | int4'. --clock applies here too; with --e2e int4, --quick checks the "
        f"harness on a small model (hidden {e2e_plan.QUICK_INT4.hidden_sizes[0]}, {e2e_plan.QUICK_INT4.layers} "
        "layers, few runs).")
    e2e.add_argument("--e2e", nargs="?", const="float", choices=e2e_plan.MODES, metavar="MODE",
                     help="instead of the kernels, a whole model, original vs fused: 'float' (the default MODE): a "
                          "Llama-style model exported from torch in float32/float16, no KV cache; 'int4': a Hugging "
                          "Face Llama with a KV cache, its MatMuls quantized to int4 (onnxruntime's MatMulNBits)")
    e2e.add_argument("--e2e-dtypes", type=_choices(DTYPES), metavar="DTYPES",
                     help=f"float: comma-separated (default {','.join(e2e_plan.FLOAT_DTYPES)}); int4 runs float32")
    e2e.add_argument("--e2e-hidden", type=_positive_list, metavar="H[,H...]",
                     help=f"hidden size (default {floats.hidden_size} | {','.join(map(str, int4.hidden_sizes))}); "
                          "int4: comma-separated, one model per size")
    e2e.add_argument("--e2e-layers", type=_positive, metavar="N",
                     help=f"decoder layers (default {floats.num_layers} | {int4.layers})")
    e2e.add_argument("--e2e-vocab", type=_positive, metavar="N",
                     help=f"vocabulary size (default {floats.vocab_size} | {int4.vocab})")
    e2e.add_argument("--e2e-prefill", type=_positive, metavar="TOKENS",
                     help=f"prefill tokens (default {e2e_plan.FLOAT_PREFILL_TOKENS} | {int4.prefill_tokens})")
    e2e.add_argument("--e2e-past", type=_non_negative, metavar="TOKENS",
                     help=f"int4: tokens in the KV cache at the timed decode step (default {int4.past_tokens})")
    e2e.add_argument("--e2e-threads", type=_thread_counts, metavar="N[,N...]",
                     help="intra-op threads (default: onnxruntime's | "
                          f"{','.join(map(str, int4.threads))}); int4: comma-separated; 1 is timed with CPU time")
    e2e.add_argument("--e2e-decode-runs", type=_positive, metavar="N",
                     help=f"interleaved decode runs per model (default {e2e_plan.FLOAT_RUNS['decode']} | "
                          f"{int4.decode_runs})")
    e2e.add_argument("--e2e-prefill-runs", type=_positive, metavar="N",
                     help=f"interleaved prefill runs per model (default {e2e_plan.FLOAT_RUNS['prefill']} | "
                          f"{int4.prefill_runs})")
    e2e.add_argument("--e2e-profile-runs", type=_positive, metavar="N",
                     help=f"profiled runs per model and phase (default {e2e_plan.FLOAT_RUNS['profile']} | "
                          f"{int4.profile_runs})")
    e2e.add_argument("--e2e-accuracy-level", type=int, choices=e2e_plan.ACCURACY_LEVELS,
                     help=f"int4: MatMulNBits accuracy_level (default {int4.accuracy_level}: unset, float32 "
                          "arithmetic; 4 quantizes the activations to int8 inside MatMulNBits)")
    e2e.add_argument("--e2e-asymmetric", action="store_true",
                     help="int4: quantize with zero points (default symmetric)")
    e2e.add_argument("--e2e-keep", metavar="DIR", help="keep the exported, quantized and fused models in DIR")


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
