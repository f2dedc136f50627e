"""``ort-rmsnorm bench --e2e float``: a Llama-style model exported from torch, original vs fused.

Both models run with onnxruntime's full optimizations and the same session options, so the original is what
onnxruntime makes of the exported graph (its own fusions turn many decomposed norms into its
``SimplifiedLayerNormalization``). Each phase is timed with interleaved runs (medians), then a separate profiled
session of each model says which share of the kernel time the norms take.

The exported model has no KV cache (``ort_rmsnorm.models.exporters``): the decode step is a forward pass over one
token. That runs every norm on a 1 x H row and reads every weight once, as a cached decode step does; it leaves out
attention over the cached keys and values, which on a CPU is small next to the weight reads at this size
(``--e2e int4``, ort_rmsnorm.bench.e2e_int4, has the cache). Importing this module imports torch.
"""

from __future__ import annotations

import collections
import dataclasses
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np
import onnxruntime as ort

from .. import runtime, verify
from ..contract import (
    ONNX_RMSNORM,
    ORT_SIMPLIFIED_LAYER_NORM,
    ORT_SKIP_SIMPLIFIED_LAYER_NORM,
    RMSNORM,
    SKIP_RMSNORM,
)
from ..fusion import ModelFile
from ..builders import exporters
from ..builders.llama import LlamaConfig
from .e2e_plan import FLOAT_CONFIG, FLOAT_DTYPES, FLOAT_PREFILL_TOKENS, FLOAT_RUNS
from .profile import nodes_by_run, node_name, op_type, read_profile
from .tables import faster_or_slower
from .timing import clock_function, clock_name

# As the profiler names ops (no domain); onnxruntime's LayerNorms too.
NORM_OPS = (RMSNORM, SKIP_RMSNORM, ORT_SIMPLIFIED_LAYER_NORM, ORT_SKIP_SIMPLIFIED_LAYER_NORM, ONNX_RMSNORM,
            "LayerNormalization", "SkipLayerNormalization")


@dataclasses.dataclass
class PhaseResult:
    dtype: str
    phase: str
    tokens: int
    original_ms: float
    fused_ms: float
    runs: int
    original_norm_share: float  # the norm ops' share of kernel time in the profiled original
    fused_norm_share: float
    original_top_ops: list[tuple[str, float]]  # (op type, share of kernel time), largest first
    fused_top_ops: list[tuple[str, float]]

    @property
    def speedup(self) -> float:
        return self.original_ms / self.fused_ms


def _feeds(tokens: int, vocab: int) -> dict[str, np.ndarray]:
    return {"input_ids": np.random.default_rng(tokens).integers(0, vocab, (1, tokens), dtype=np.int64)}


@dataclasses.dataclass
class Shares:
    by_op: dict[str, float]  # op type -> share of the summed node kernel time, largest first
    norms: float  # share of the norm nodes: fused norm ops, or the nodes exported from the norm modules


def _op_shares(session: ort.InferenceSession, phase_feeds: dict[str, dict[str, np.ndarray]], runs: int,
               norm_nodes: set[str]) -> dict[str, Shares]:
    """Per phase: where the node kernel time goes over `runs` profiled runs (each phase after one warm-up run).
    Runs are told apart by the profiler's model_run spans."""
    phase_of_run = []
    for phase, feeds in phase_feeds.items():
        for run in range(runs + 1):
            runtime.run(session, feeds)
            phase_of_run.append(phase if run else None)  # None: warm-up
    totals: dict[str, collections.Counter] = {phase: collections.Counter() for phase in phase_feeds}
    norms: collections.Counter = collections.Counter()
    for phase, nodes in zip(phase_of_run, nodes_by_run(read_profile(session.end_profiling()))):
        if phase is None:
            continue
        for event in nodes:
            op = op_type(event)
            totals[phase][op] += event["dur"]
            if op in NORM_OPS or node_name(event) in norm_nodes:
                norms[phase] += event["dur"]
    return {phase: Shares({op: t / (sum(counter.values()) or 1) for op, t in counter.most_common()},
                          norms[phase] / (sum(counter.values()) or 1))
            for phase, counter in totals.items()}


def _norm_module_nodes(model) -> set[str]:
    """Names of the nodes the exporter emitted for the RMSNorm modules (from its namespace metadata), so that an
    unfused norm's time is counted as the norm's even when onnxruntime leaves it as separate nodes."""
    return {node.name for node in model.graph if "LlamaRMSNorm" in node.metadata_props.get("namespace", "")}


def _profiled_session(path: Path, threads: int | None, prefix: str) -> ort.InferenceSession:
    options = runtime.timing_options()
    options.enable_profiling = True
    options.profile_file_prefix = prefix
    return runtime.make_session(str(path), threads=threads, options=options)


def _export_and_fuse(config: LlamaConfig, dtype: str, folder: Path) -> tuple[Path, Path, set[str], dict]:
    """(original path, fused path, the original's norm node names, what was fused)."""
    original, fused = folder / f"llama-{dtype}.onnx", folder / f"llama-{dtype}.fused.onnx"
    exporters.export_llama(config, original, exporter="dynamo", dtype=dtype)
    model = ModelFile.load(original)
    norm_nodes = _norm_module_nodes(model.model)
    report = model.fuse()
    model.save(fused)
    fusion = {"fused": dict(collections.Counter(f.op_type for f in report.fusions)), "skipped": len(report.skipped)}
    return original, fused, norm_nodes, fusion


def _time_phases(paths: tuple[Path, Path], phases, vocab: int, runs: dict[str, int], threads: int | None,
                 clock: str) -> tuple[str, dict[str, list[float]]]:
    """(the fused model's logits checked against the original's, phase -> [original ms, fused ms])."""
    sessions = [runtime.make_session(str(path), threads=threads, options=runtime.timing_options())
                for path in paths]
    check = verify.compare("logits", *(runtime.run(s, _feeds(8, vocab))[0] for s in sessions)).describe()
    times = {
        phase: [statistics.median(samples) * 1e3
                for samples in runtime.time_interleaved(sessions, _feeds(tokens, vocab), runs[phase],
                                                        clock=clock_function(clock))]
        for phase, tokens in phases
    }
    return check, times


def run_e2e(config: LlamaConfig = FLOAT_CONFIG, *, dtypes=FLOAT_DTYPES, prefill_tokens: int = FLOAT_PREFILL_TOKENS,
            prefill_runs: int = FLOAT_RUNS["prefill"], decode_runs: int = FLOAT_RUNS["decode"],
            profile_runs: int = FLOAT_RUNS["profile"], threads: int | None = None, workdir: str | None = None,
            log: Callable[[str], None] = print) -> dict:
    """Exports, fuses, checks and times the model for each dtype; returns the JSON-ready report."""
    phases = (("prefill", prefill_tokens), ("decode", 1))
    runs = {"prefill": prefill_runs, "decode": decode_runs}
    clock = clock_name(threads, "auto") if threads else "wall"  # CPU time when the calling thread does all
    results, fusions, checks = [], {}, {}
    with tempfile.TemporaryDirectory(prefix="ort-rmsnorm-e2e-") as scratch:
        folder = Path(workdir or scratch)
        folder.mkdir(parents=True, exist_ok=True)
        for dtype in dtypes:
            start = time.perf_counter()
            original, fused, norm_nodes, fusions[dtype] = _export_and_fuse(config, dtype, folder)
            log(f"{dtype}: exported and fused in {time.perf_counter() - start:.0f} s: {fusions[dtype]}")
            checks[dtype], times = _time_phases((original, fused), phases, config.vocab_size, runs, threads, clock)
            log(f"  {checks[dtype]}")
            phase_feeds = {phase: _feeds(tokens, config.vocab_size) for phase, tokens in phases}
            shares = {name: _op_shares(_profiled_session(path, threads, str(folder / f"profile-{dtype}-{name}")),
                                       phase_feeds, profile_runs, norm_nodes)
                      for name, path in (("original", original), ("fused", fused))}
            for phase, tokens in phases:
                before, after = shares["original"][phase], shares["fused"][phase]
                result = PhaseResult(dtype, phase, tokens, *times[phase], runs[phase], before.norms, after.norms,
                                     list(before.by_op.items())[:8], list(after.by_op.items())[:8])
                results.append(result)
                words = faster_or_slower(result.speedup, "the original")
                log(f"  {phase} ({_tokens(tokens)}): original {result.original_ms:.1f} ms, fused "
                    f"{result.fused_ms:.1f} ms, x{result.speedup:.3f} ({words}); norms {100 * before.norms:.2f}% -> "
                    f"{100 * after.norms:.2f}% of kernel time")
    return {"config": dataclasses.asdict(config), "threads": threads, "clock": clock,
            "phases": [dataclasses.asdict(r) for r in results],
            "speedups": {f"{r.dtype}/{r.phase}": r.speedup for r in results}, "fusion": fusions, "check": checks}


def _threads(threads: int | None) -> str:
    return "onnxruntime's default intra-op threads" if threads is None else f"{threads} intra-op thread(s)"


def _tokens(count: int) -> str:
    return f"{count} token{'' if count == 1 else 's'}"


def markdown(report: dict) -> str:
    config = report["config"]
    clock = "the calling thread's CPU time" if report.get("clock") == "thread_cpu" else "wall time"
    lines = [
        f"Llama-style decoder: hidden {config['hidden_size']}, {config['num_layers']} layers, {config['num_heads']} "
        f"heads, MLP {config['intermediate_size']}, vocabulary {config['vocab_size']}; batch 1; onnxruntime "
        f"optimizations on for both models; {_threads(report.get('threads'))}, medians of {clock}. "
        "Decode = a one-token forward (no KV cache).\n",
        "| dtype | phase | original ms | fused ms | speed-up | norm share original | norm share fused "
        "| top ops (original) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in report["phases"]:
        top = ", ".join(f"{op} {100 * share:.1f}%" for op, share in p["original_top_ops"][:4])
        lines.append(f"| {p['dtype']} | {p['phase']} ({_tokens(p['tokens'])}) | {p['original_ms']:.1f} | "
                     f"{p['fused_ms']:.1f} | {p['original_ms'] / p['fused_ms']:.3f} | "
                     f"{100 * p['original_norm_share']:.2f}% | {100 * p['fused_norm_share']:.2f}% | {top} |")
    lines.append("")
    for dtype, summary in report["fusion"].items():
        fused = ", ".join(f"{count} x {op}" for op, count in summary["fused"].items())
        lines.append(f"- {dtype}: fused {fused}, {summary['skipped']} skipped; {report['check'][dtype]}")
    return "\n".join(lines) + "\n"
