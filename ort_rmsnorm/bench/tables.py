"""The kernel benchmark's report as markdown tables, and its progress lines."""

from __future__ import annotations

from .cases import CaseResult, case_from_dict, roofline_seconds
from .decode import DecodeCost
from .machine import machine_line
from .contenders import DTYPES

TABLE_COLUMNS = ("copy", "rmsnorm", "ort_simplified", "onnx_rmsnorm23", "decomposed", "copy2", "skip_rmsnorm",
                 "add_rmsnorm", "ort_skip_simplified", "decomposed_skip")


# What the progress lines' and the tables' shorthands mean, printed with them (docs/benchmarks.md has the method).
LEGEND = (
    "Legend: times are medians per call. `x1.19 copy`: the kernel's time over the fastest onnxruntime copy of the "
    "same bytes (1.00 = as fast as copying its input to its output, the memory floor; 1.19 = 19% slower); for a skip "
    "norm the copy is `copy2`, of both inputs into both outputs. `faster/slower than ort`, `speed-up vs SLN` and "
    "`speed-up vs SSLN`: onnxruntime's own kernel's time over ours, SLN being its SimplifiedLayerNormalization "
    "(`ort_simplified`, against `rmsnorm`) and SSLN its SkipSimplifiedLayerNormalization (`ort_skip_simplified`, "
    "against `skip_rmsnorm`).")


def time_of(case: CaseResult, column: str) -> float | None:
    if column in ("copy", "copy2"):
        return roofline_seconds(case, column)
    measurement = case.get(column)
    return measurement.seconds if measurement else None


def ratio(value: float | None) -> str:
    return f"{value:.2f}" if value is not None else "-"


def faster_or_slower(speedup: float | None, than: str) -> str:
    """A speed-up (other's time / ours) in words: "1.35x faster than X", or for one below 1 "1.35x slower than X"."""
    if speedup is None or speedup <= 0:
        return f"no time for {than}"
    return f"{speedup:.2f}x faster than {than}" if speedup >= 1 else f"{1 / speedup:.2f}x slower than {than}"


def format_case_line(case: CaseResult) -> str:
    ours, skip = case.get("rmsnorm"), case.get("skip_rmsnorm")
    parts = [f"{case.dtype:8} threads={case.threads} {case.rows:>5}x{case.hidden:<5}"]
    if ours:
        parts.append(f"rmsnorm {ours.seconds * 1e6:9.1f} us {ours.gb_per_s:6.1f} GB/s "
                     f"x{ratio(ours.vs_roofline)} copy, {faster_or_slower(ours.speedup_vs_ort, 'ort')}")
    if skip:
        parts.append(f"skip {skip.seconds * 1e6:9.1f} us x{ratio(skip.vs_roofline)} copy, "
                     f"{faster_or_slower(skip.speedup_vs_ort, 'ort')}")
    return " | ".join(parts)


def format_decode_line(costs: list[DecodeCost]) -> str:
    if not costs:
        return ""
    parts = [f"{c.contender} {c.in_graph_us:.2f}" for c in costs if c.in_graph_us is not None]
    return f"{costs[0].dtype:8} threads={costs[0].threads} 1x{costs[0].hidden} in-graph us/node: " + ", ".join(parts)


def markdown_tables(report: dict) -> str:
    """One table per (threads, dtype): microseconds per call (median), then the ratios the targets are about."""
    cases = [case_from_dict(c) for c in report["cases"]]
    out = [machine_line(report["machine"]), "", LEGEND, ""]
    for threads in sorted({c.threads for c in cases}):
        for dtype in DTYPES:
            group = [c for c in cases if c.threads == threads and c.dtype == dtype]
            if not group:
                continue
            clock = "calling thread's CPU time" if group[0].clock == "thread_cpu" else "wall time"
            out.append(f"### {dtype}, {threads} thread{'s' if threads > 1 else ''} (median us per call, {clock})\n")
            header = ["rows x H", *TABLE_COLUMNS, "rmsnorm/copy", "skip/copy2", "speed-up vs SLN", "speed-up vs SSLN"]
            out.append("| " + " | ".join(header) + " |")
            out.append("|" + "---|" * len(header))
            for case in group:
                ours, skip = case.get("rmsnorm"), case.get("skip_rmsnorm")
                cells = [f"{case.rows}x{case.hidden}"]
                for column in TABLE_COLUMNS:
                    seconds = time_of(case, column)
                    cells.append(f"{seconds * 1e6:.1f}" if seconds else "n/a")
                cells += [ratio(ours and ours.vs_roofline), ratio(skip and skip.vs_roofline),
                          ratio(ours and ours.speedup_vs_ort), ratio(skip and skip.speedup_vs_ort)]
                out.append("| " + " | ".join(cells) + " |")
            unsupported = {name: why for c in group for name, why in c.unsupported.items()}
            if unsupported:
                out.append("")
                out += [f"- n/a `{name}`: {why}" for name, why in sorted(unsupported.items())]
            out.append("")
    if report["decode"]:
        out.append("### Decode (1 x H): cost per node in microseconds\n")
        out.append("In-graph: chain differencing. Profiled: onnxruntime's profiler, node kernel times per run (mean of "
                   "the fastest 80% of runs, and median; both include the profiler's own floor of a few microseconds, "
                   "see the copies). Pool: the intra-op thread pool was woken.\n")
        out.append("| dtype | threads | H | contender | in-graph | profiled mean (fastest 80%) | profiled median "
                   "| model_run median | pool | nodes run |")
        out.append("|---|---|---|---|---|---|---|---|---|---|")
        for c in report["decode"]:
            in_graph = f"{c['in_graph_us']:.2f}" if c["in_graph_us"] is not None else "-"
            out.append(f"| {c['dtype']} | {c['threads']} | {c['hidden']} | {c['contender']} | {in_graph} | "
                       f"{c['profiled_us_mean']:.2f} | {c['profiled_us_median']:.0f} | "
                       f"{c['session_run_us_median']:.0f} | {'yes' if c['thread_pool_used'] else 'no'} | "
                       f"{', '.join(c['nodes'])} |")
        out.append("")
    return "\n".join(out)
