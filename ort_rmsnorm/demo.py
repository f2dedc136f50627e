"""``ort-rmsnorm demo``: the case where fusing pays, on a small model: norms found and fused, the result verified, and
both models timed and profiled.

A Llama-style model (:mod:`ort_rmsnorm.builders.llama`) is exported with torch's dynamo exporter when torch is
importable, otherwise built with ``onnx.helper`` in the same spelling; onnxruntime fuses none of its norms at
session start. Its MatMuls are quantized to int4 with onnxruntime's own quantizer (:mod:`ort_rmsnorm.builders.int4`):
with weights 8x smaller, the per-node cost of a decomposed norm (seven nodes, plus the residual Add before it) is a
visible part of a decode step. Where ``onnxruntime.quantization`` cannot be imported the demo says what to install
and goes on with the float model. Then the model is fused and verified, also for the targets ``ort`` (onnxruntime's
own norm ops) and ``auto`` (the faster op per norm), one decode step (a forward over one token: this model has no KV
cache) and one prefill are timed for the original and each distinct fused model (targets that wrote the same model
are timed once), with a second session of the original as the control of the noise (runs interleaved, medians), and
onnxruntime's profiler says which share of each model's kernel time its norms take.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np
import onnx

from . import runtime
from .model.write import save_model
from .contract import AUTO, ORT, RMSNORM, SKIP_RMSNORM
from .builders import int4
from .builders.llama import DEMO_CONFIG, OPSET, LlamaConfig, build_llama_onnx

BUILDERS = ("auto", "torch", "onnx")
QUANTIZATIONS = ("int4", "none")
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
        from .builders import exporters  # imports torch

        exporters.export_llama(config, path, exporter="dynamo", dtype=dtype)
        return f"exported from torch with the dynamo exporter (opset {exporters.EXPORTER_OPSET['dynamo']})"
    # With the shapes of all intermediates, as the dynamo exporter writes them: the int4 quantizer keeps them, and
    # after it shape inference cannot see through the MatMulNBits nodes it made (an op of onnxruntime's).
    save_model(onnx.shape_inference.infer_shapes(build_llama_onnx(config, dtype), strict_mode=True,
                                                       data_prop=True), path)
    return f"built with onnx.helper in the dynamo exporter's spelling (opset {OPSET}; torch not used)"


CONTROL = "original again"  # a second session of the original, timed with the others: what identical models differ by


def same_models(paths: dict[str, Path]) -> dict[str, list[str]]:
    """The models grouped by graph, in order: each first name of a graph with every name whose file has the same
    graph (nodes, attributes, initializers, inputs, outputs; metadata aside). Two targets that wrote the same model
    are one model to time: timed twice, they would only show the noise as a difference."""
    groups: dict[bytes, list[str]] = {}
    for name, path in paths.items():
        graph = onnx.load(str(path)).graph
        _without_metadata(graph)
        groups.setdefault(hashlib.sha256(graph.SerializeToString(deterministic=True)).digest(), []).append(name)
    return {names[0]: names for names in groups.values()}


def _without_metadata(graph: onnx.GraphProto) -> None:
    """Clears what does not change a run: doc strings and metadata (the pass records each fusion's rule in its node's
    metadata, and targets name their rules apart), in subgraphs too."""
    graph.ClearField("doc_string")
    graph.ClearField("metadata_props")
    for node in graph.node:
        node.ClearField("doc_string")
        node.ClearField("metadata_props")
        for attribute in node.attribute:
            for subgraph in (*([attribute.g] if attribute.HasField("g") else []), *attribute.graphs):
                _without_metadata(subgraph)


def deviation(ratio: float) -> float:
    """How far a ratio of times is from 1, the same either way: 0.02 for 1.02 and for 1 / 1.02."""
    return max(ratio, 1 / ratio) - 1


def ratio_words(ratio: float, name: str, control: float | None = None) -> str:
    """``original / name`` in words: "ort 2.1% slower" for 0.979 (its time 2.1% over the original's), "fused 14.5%
    faster" for 1.145; with the control's ratio, "within the noise" when it is no farther from 1 than the control."""
    words = f"{name} {100 * deviation(ratio):.1f}% {'faster' if ratio > 1 else 'slower'}" if ratio != 1 else \
        f"{name} the same"
    if control is not None and deviation(ratio) <= deviation(control):
        words += ", within the noise"
    return words


def control_words(control: float) -> str:
    """What the run can resolve, from the control's ratio (the original against a second session of itself)."""
    return (f"the control: two sessions of one model differ by {100 * deviation(control):.1f}% in this run, so a "
            f"ratio closer to 1 than that is noise")


@dataclasses.dataclass
class Timing:
    """Seconds of the interleaved runs of each model, by name: "original", :data:`CONTROL` and each distinct fused
    model."""

    samples: dict[str, list[float]]

    @staticmethod
    def describe(samples: list[float]) -> str:
        low, _, high = statistics.quantiles(samples, n=4) if len(samples) > 1 else samples * 3
        return f"{statistics.median(samples) * 1e3:8.3f} ms median (quartiles {low * 1e3:.3f} to {high * 1e3:.3f})"

    def ratio(self, name: str) -> float:
        """original / ``name``, of the medians: above 1, ``name`` is faster."""
        return statistics.median(self.samples["original"]) / statistics.median(self.samples[name])


def time_models(models: dict[str, Path], feeds: dict[str, np.ndarray], runs: int, threads: int) -> Timing:
    """Single runs of each model (a session each, so a path twice is two sessions), taking turns, same session
    options. On one thread the calling thread does all the work, and its CPU time leaves out the time other
    processes hold the core."""
    sessions = [runtime.make_session(str(path), threads=threads, options=runtime.timing_options())
                for path in models.values()]
    from .bench.timing import clock_function, clock_name

    clock = clock_function(clock_name(threads, "auto"))
    samples = runtime.time_interleaved(sessions, feeds, runs, warmup=3, clock=clock)
    return Timing(dict(zip(models, samples)))


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

        # Targets that wrote the same model are timed once, under all their names; a second session of the original
        # is timed with them, as the control.
        groups = same_models({"fused": fused, **others})
        for names in groups.values():
            if len(names) > 1:
                log(f"\n{' and '.join(names[1:])} wrote the same model as {names[0]} (the same graph): timed once, "
                    f"as {' = '.join(names)}")
        paths = {"fused": fused, **others}
        labels = {first: " = ".join(names) for first, names in groups.items()}
        models = {"original": original, **{labels[first]: paths[first] for first in groups}, CONTROL: original}

        clock = "the calling thread's CPU time" if threads == 1 else "wall time"
        log(f"\ntiming: {threads} intra-op thread{'s' if threads > 1 else ''}, same session options (onnxruntime "
            f"optimizations on), runs of the models interleaved, {clock}; {CONTROL}: a second session of the "
            "original, the control:")
        from .bench.machine import load_average, load_note

        loads = load_average()
        width = max(map(len, models))
        for phase, phase_runs in (("decode", decode_runs), ("prefill", runs)):
            timing = time_models(models, steps[phase], phase_runs, threads)
            tokens = steps[phase]["input_ids"].shape[1]
            log(f"  {phase} ({tokens} token{'s' if tokens > 1 else ''}), {phase_runs} runs of each model:")
            for name, samples in timing.samples.items():
                log(f"    {name:<{width}} {Timing.describe(samples)}")
            control = timing.ratio(CONTROL)
            for name in models:
                if name not in ("original", CONTROL):
                    ratio = timing.ratio(name)
                    log(f"    original / {name}: {ratio:.3f} ({ratio_words(ratio, name, control)})")
            log(f"    original / {CONTROL}: {control:.3f} ({control_words(control)})")
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
