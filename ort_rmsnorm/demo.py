"""``ort-rmsnorm demo``: the case where fusing pays, on a small model: norms found and fused, the result verified, and
both models timed and profiled.

A Llama-style model (:mod:`ort_rmsnorm.llama`) is exported with torch's dynamo exporter when torch is importable,
otherwise built with ``onnx.helper`` in the same spelling; onnxruntime fuses none of its norms at session start.
Its MatMuls are quantized to int4 with onnxruntime's own quantizer (:mod:`ort_rmsnorm.int4`): with weights 8x
smaller, the per-node cost of a decomposed norm (seven nodes, plus the residual Add before it) is a visible part
of a decode step. Where ``onnxruntime.quantization`` cannot be imported the demo says what to install and goes on
with the float model. Then the model is fused and verified, also for the targets ``ort`` (onnxruntime's own norm
ops) and ``auto`` (the faster op per norm), one decode step (a forward over one token: this model has no KV cache)
and one prefill are timed for the original and each fused model (runs interleaved, medians), and onnxruntime's
profiler says which share of each model's kernel time its norms take.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np
import onnx

from . import int4, model_io, runtime
from .contract import AUTO, ORT, RMSNORM, SKIP_RMSNORM
from .llama import OPSET, LlamaConfig, build_llama_onnx

BUILDERS = ("auto", "torch", "onnx")
QUANTIZATIONS = ("int4", "none")
# Small enough for a decode step of about a millisecond, so that the norms' per-node cost shows.
DEMO_CONFIG = LlamaConfig(vocab_size=2048, hidden_size=256, intermediate_size=688, num_layers=8, num_heads=4)
FUSED_OPS = (RMSNORM, SKIP_RMSNORM)  # as the profiler names them (no domain)
PROFILED_RUNS = {"decode": 100, "prefill": 5}
# Fused and timed next to the default target: onnxruntime's own ops, and the faster op per norm.
OTHER_TARGETS = (ORT, AUTO)


def _op_counts(report) -> str:
    """``1 x SimplifiedLayerNormalization, 4 x ...`` for the ops a report's fusions wrote."""
    return ", ".join(f"{count} x {op}" for op, count in sorted(report.ops_written().items())) or "nothing fused"


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


def build_model(path: Path, config: LlamaConfig, dtype: str, builder: str) -> str:
    """Writes the demo model to ``path``; returns how it was built."""
    if builder == "auto":
        builder = "torch" if torch_available() else "onnx"
    if builder == "torch":
        from . import exporters  # imports torch

        exporters.export_llama(config, path, exporter="dynamo", dtype=dtype)
        return f"exported from torch with the dynamo exporter (opset {exporters.EXPORTER_OPSET['dynamo']})"
    # With the shapes of all intermediates, as the dynamo exporter writes them: the int4 quantizer keeps them, and
    # after it shape inference cannot see through the MatMulNBits nodes it made (an op of onnxruntime's).
    model_io.save_model(onnx.shape_inference.infer_shapes(build_llama_onnx(config, dtype), strict_mode=True,
                                                                data_prop=True), path)
    return f"built with onnx.helper in the dynamo exporter's spelling (opset {OPSET}; torch not used)"


@dataclasses.dataclass
class Timing:
    """Seconds of the interleaved runs of each model: the original, the fused one (target custom) and, per other
    target, its fused model."""

    original: list[float]
    fused: list[float]
    others: dict[str, list[float]] = dataclasses.field(default_factory=dict)

    @staticmethod
    def describe(samples: list[float]) -> str:
        low, _, high = statistics.quantiles(samples, n=4) if len(samples) > 1 else samples * 3
        return f"{statistics.median(samples) * 1e3:8.3f} ms median (quartiles {low * 1e3:.3f} to {high * 1e3:.3f})"

    @property
    def speedup(self) -> float:
        return statistics.median(self.original) / statistics.median(self.fused)

    def speedup_of(self, target: str) -> float:
        return statistics.median(self.original) / statistics.median(self.others[target])


def time_models(original: Path, fused: Path, feeds: dict[str, np.ndarray], runs: int, threads: int,
                others: dict[str, Path] | None = None) -> Timing:
    """Single runs of each model, taking turns, same session options. On one thread the calling thread does all
    the work, and its CPU time leaves out the time other processes hold the core."""
    others = others or {}
    sessions = [runtime.make_session(str(path), threads=threads, options=runtime.timing_options())
                for path in (original, fused, *others.values())]
    from .bench.timing import clock_function, clock_name

    clock = clock_function(clock_name(threads, "auto"))
    original_s, fused_s, *rest = runtime.time_interleaved(sessions, feeds, runs, warmup=3, clock=clock)
    return Timing(original_s, fused_s, dict(zip(others, rest)))


def norm_shares(path: Path, steps: dict[str, dict[str, np.ndarray]], threads: int, prefix: Path,
                is_norm: Callable[[str, str], bool]) -> dict:
    """Per phase, the NormShare of the model at ``path`` in onnxruntime's profiler."""
    from .bench.profile import norm_share, profiled_runs

    options = runtime.timing_options()
    options.enable_profiling = True
    options.profile_file_prefix = str(prefix)
    session = runtime.make_session(str(path), threads=threads, options=options)
    return {phase: norm_share(events, is_norm)
            for phase, events in profiled_runs(session, steps, PROFILED_RUNS).items()}


def run_demo(
    config: LlamaConfig = DEMO_CONFIG,
    *,
    dtype: str = "float32",
    builder: str = "auto",
    quantization: str = "int4",
    sequence: int = 256,
    runs: int = 15,
    decode_runs: int = 300,
    threads: int = 1,
    directory: Path | None = None,
    log: Callable[[str], None] = print,
) -> int:
    """The demo; returns the exit status (1 when verification fails). Models go to ``directory`` when given."""
    from . import feeds, verify
    from .fusion import fuse_file

    with tempfile.TemporaryDirectory(prefix="ort-rmsnorm-demo-") as scratch:
        folder = Path(directory) if directory is not None else Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        exported = folder / "llama.onnx"
        kept = directory is not None
        log(
            f"model: Llama-style, {config.num_layers} decoder layers, hidden {config.hidden_size}, "
            f"{config.num_heads} heads, MLP {config.intermediate_size}, vocab {config.vocab_size}, {dtype}; "
            f"{config.norm_count} RMSNorms"
        )
        start = time.perf_counter()
        how = build_model(exported, config, dtype, builder)
        log(f"  {how} in {time.perf_counter() - start:.1f} s" + (f" -> {exported}" if kept else ""))

        original = exported
        if quantization == "int4":
            if (why := int4.unavailable()) is not None:
                log(f"\nint4: {why}\n  going on with the {dtype} model (its norms are a smaller share of its time)")
            else:
                original = folder / "llama.int4.onnx"
                start = time.perf_counter()
                counts = int4.quantize(exported, original)
                options = int4.Int4Options()
                log(f"\nint4 (onnxruntime's {counts['quantizer']}, block {options.block_size}, symmetric): "
                    f"{counts['MatMulNBits']} MatMuls quantized in {time.perf_counter() - start:.1f} s"
                    + (f", {counts['MatMul']} left (no constant weight)" if counts["MatMul"] else "")
                    + (f" -> {original}" if kept else ""))
        fused = original.with_name(original.name.replace(".onnx", ".fused.onnx"))

        start = time.perf_counter()
        report = fuse_file(original, fused).report
        elapsed = time.perf_counter() - start
        log(f"\nfuse: loaded, fused and saved in {elapsed:.1f} s" + (f" -> {fused}" if kept else ""))
        log(report.summary())

        rng = np.random.default_rng(0)
        steps = {"decode": {"input_ids": feeds.make_input("input_ids", (1, 1), np.dtype(np.int64), rng)},
                 "prefill": {"input_ids": feeds.make_input("input_ids", (1, sequence), np.dtype(np.int64), rng)}}
        result = verify.verify(original, fused, inputs=steps["prefill"])
        log("\nverify:")
        log(result.describe())
        if not result.ok:
            return 1

        # The same pass writing onnxruntime's own ops, and the faster op per norm: the alternatives a user has.
        others = {}
        for target in OTHER_TARGETS:
            path = original.with_name(original.name.replace(".onnx", f".{target}.onnx"))
            other = fuse_file(original, path, target).report
            checked = verify.verify(original, path, inputs=steps["prefill"])
            log(f"\ntarget {target}: {_op_counts(other)}; verify: {'ok' if checked.ok else 'FAILED'}"
                + (f" -> {path}" if kept else ""))
            if not checked.ok:
                log(checked.describe())
                return 1
            others[target] = path

        clock = "the calling thread's CPU time" if threads == 1 else "wall time"
        log(f"\ntiming: {threads} intra-op thread{'s' if threads > 1 else ''}, same session options (onnxruntime "
            f"optimizations on), runs of the models interleaved, {clock}:")
        from .bench.machine import load_average, load_note
        from .bench.tables import faster_or_slower

        timings = {}
        loads = load_average()
        for phase, phase_runs in (("decode", decode_runs), ("prefill", runs)):
            timings[phase] = timing = time_models(original, fused, steps[phase], phase_runs, threads, others)
            tokens = steps[phase]["input_ids"].shape[1]
            log(f"  {phase} ({tokens} token{'s' if tokens > 1 else ''}), {phase_runs} runs of each model:")
            log(f"    original {Timing.describe(timing.original)}")
            log(f"    fused    {Timing.describe(timing.fused)}")
            for target in others:
                log(f"    {target:<8} {Timing.describe(timing.others[target])}")
            log(f"    original / fused: {timing.speedup:.3f} (the fused model "
                f"{faster_or_slower(timing.speedup, 'the original')})")
            for target in others:
                log(f"    original / {target}: {timing.speedup_of(target):.3f}")
            loads += load_average()
        if (note := load_note(loads, threads)) is not None:
            log(f"  {note}")

        replaced = {node for fusion in report.fusions for node in fusion.replaced_nodes}
        before = norm_shares(original, steps, threads, folder / "profile-original",
                             lambda name, op: name in replaced)
        after = norm_shares(fused, steps, threads, folder / "profile-fused", lambda name, op: op in FUSED_OPS)
        log("\nthe norms' share of each model's kernel time (onnxruntime's profiler; per node the median over "
            f"{PROFILED_RUNS['decode']} decode and {PROFILED_RUNS['prefill']} prefill runs, summed):")
        for phase in steps:
            b, a = before[phase], after[phase]
            log(f"  {phase}: original {100 * b.share:.1f}% ({b.norm_nodes} nodes, {b.norm_us:.0f} us of "
                f"{b.kernel_us:.0f}), fused {100 * a.share:.1f}% ({a.norm_nodes} nodes, {a.norm_us:.0f} us of "
                f"{a.kernel_us:.0f})")
        log("  In the original each norm is seven nodes or more, and the residual Add before it one more; the "
            "profiler adds a few us of its own to every node, so it overstates what many small nodes cost. The "
            "matrix products and attention are the same in both models: the speed-up is at most the share the norms "
            "give up. `ort-rmsnorm bench --e2e int4` measures a SmolLM-sized model with a KV cache.")
    return 0
