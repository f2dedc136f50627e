"""What a kernel benchmark run measures (:class:`Plan`: dtypes, sizes, threads, contenders, repetitions) and the
run itself: every case, then the decode per-node costs, into one JSON-ready report."""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import asdict, dataclass

from .cases import measure_case
from .decode import decode_costs
from .machine import machine_info
from .contenders import CONTENDER_NAMES, CONTENDERS, DTYPES, Shape
from .tables import LEGEND, format_case_line, format_decode_line
from .timing import clock_name

HIDDEN_SIZES = (768, 1024, 2048, 4096, 5120, 8192, 16384)
PREFILL_ROWS = 2048
CHAIN_LENGTH = 17


@dataclass
class Plan:
    dtypes: list[str]
    hidden_sizes: list[int]
    rows: list[int]
    threads: list[int]
    repetitions: int
    min_sample_s: float
    contenders: list[str]
    decode_hidden: int | None  # the 1 x H case of the decode cost measurements; None: skip them
    profile_runs: int
    chain_length: int
    clock: str = "auto"  # see timing.clock_name


QUICK = dict(hidden_sizes=[1024, 4096], rows=[1, PREFILL_ROWS], repetitions=5, min_sample_s=0.002, profile_runs=300)
FULL = dict(hidden_sizes=list(HIDDEN_SIZES), rows=[1, PREFILL_ROWS], repetitions=11, min_sample_s=0.005,
            profile_runs=2000)


def run_plan(plan: Plan, log=print) -> dict:
    unknown = (set(plan.contenders) - set(CONTENDER_NAMES)) | (set(plan.dtypes) - set(DTYPES))
    if unknown:
        raise ValueError(f"unknown contender or dtype {sorted(unknown)}: contenders are {', '.join(CONTENDER_NAMES)}; "
                         f"dtypes are {', '.join(DTYPES)}")
    contenders = [c for c in CONTENDERS if c.name in plan.contenders]
    report = {"machine": machine_info(), "plan": asdict(plan), "cases": [], "decode": [], "decode_unsupported": {}}
    started = time.perf_counter()
    log(LEGEND)
    for threads in plan.threads:
        for dtype in plan.dtypes:
            for rows in plan.rows:
                for hidden in plan.hidden_sizes:
                    case = measure_case(Shape(dtype, rows, hidden), threads, contenders, plan.repetitions,
                                        plan.min_sample_s, clock_name(threads, plan.clock))
                    report["cases"].append(asdict(case))
                    log(format_case_line(case))
    if plan.decode_hidden:
        with tempfile.TemporaryDirectory(prefix="ort-rmsnorm-profile-") as workdir:
            for threads in plan.threads:
                for dtype in plan.dtypes:
                    costs, unsupported = decode_costs(
                        Shape(dtype, 1, plan.decode_hidden), threads, contenders, workdir,
                        profile_runs=plan.profile_runs, chain_length=plan.chain_length,
                        repetitions=plan.repetitions, min_sample_s=plan.min_sample_s, clock=plan.clock)
                    report["decode"] += [asdict(c) for c in costs]
                    report["decode_unsupported"][f"{dtype}/{threads}"] = unsupported
                    log(format_decode_line(costs))
    report["machine"]["seconds"] = round(time.perf_counter() - started, 1)
    if hasattr(os, "getloadavg"):
        report["machine"]["load_average_at_end"] = os.getloadavg()
    return report
