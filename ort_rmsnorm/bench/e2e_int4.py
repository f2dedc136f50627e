"""``ort-rmsnorm bench --e2e int4``: int4 models as onnxruntime users make them, original vs fused.

For each hidden size, a Hugging Face transformers ``LlamaForCausalLM`` with random weights (nothing is downloaded;
:mod:`ort_rmsnorm.models.smollm`) is exported with torch's dynamo exporter with its KV cache as graph inputs and
outputs (:func:`ort_rmsnorm.models.exporters.export_cached_causal_lm`), its MatMuls are quantized to int4 with
onnxruntime's MatMulNBitsQuantizer (:mod:`ort_rmsnorm.models.int4`), and the int4 model is fused. onnxruntime fuses
none of the exported norms itself (the dynamo exporter writes ``Reciprocal(Sqrt(.))``), so the original runs each
norm as seven nodes and the residual Add before it as one more. The embeddings are not tied to the LM head (SmolLM's
are): tied, the head's weight is a Transpose of the embedding table, which the quantizer leaves in float32, and its
49152 x H float32 read would dominate every decode step; onnxruntime-genai's int4 builds quantize the head too.

Measured for each thread count: the logits of both models on a decode step and on a prefill (the largest
difference and the verdict of ``ort-rmsnorm verify``'s tolerance), next to a control: the original with every
norm's weight moved by one unit in the last place; then one decode step (one token after ``past_tokens`` cached
ones) and one prefill (``prefill_tokens`` from an empty cache), the two models' runs interleaved, medians, with the
quartiles of the paired ratios (each run of the original against the fused model's run next to it) as the noise.
Then, on one thread, onnxruntime's profiler: each node's median kernel time over the runs, the norms' cost in each
model (in the original the nodes the pass replaced, residual adds included; in the fused model its RMSNorm and
SkipRMSNorm nodes), and what onnxruntime runs next to each fused norm in its optimized graph (nodes that might be
absorbed into the fused op).

Importing this module imports neither torch nor transformers; running it imports both.
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import onnxruntime as ort

from .. import runtime, verify
from ..model.write import save_model
from ..contract import RMSNORM, SKIP_RMSNORM
from ..fusion import fuse_file
from ..builders import int4
from ..builders.smollm import ModelShape, build_model, model_shape
from .e2e_plan import Int4Plan
from .int4_tables import check_text
from .profile import node_medians, norm_share, profiled_runs
from .tables import faster_or_slower
from .timing import clock_function, clock_name

FUSED_OPS = (RMSNORM, SKIP_RMSNORM)  # as the profiler and the model's nodes name them (no domain)
# Neighbours of a fused norm that might be absorbed into it exactly: casts, shape changes, elementwise arithmetic.
NEIGHBOUR_OPS = ("Cast", "CastLike", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Transpose", "Identity", "Expand",
                 "Add", "Sub", "Mul", "Div")
# onnxruntime's Reshape aliases its input (no data moves): its profiled time is about the profiler's per-node floor.
FLOOR_OP = "Reshape"


# --- inputs ---------------------------------------------------------------------------------------------------------


def feeds(shape: ModelShape, tokens: int, past: int, seed: int = 0) -> dict[str, np.ndarray]:
    """One step: `tokens` new tokens after `past` cached ones (random keys and values)."""
    from ..builders.exporters import kv_cache_names  # imports torch, as the export does

    rng = np.random.default_rng(seed)
    result = {"input_ids": rng.integers(0, shape.vocab, (1, tokens), dtype=np.int64),
              "attention_mask": np.ones((1, past + tokens), np.int64)}
    for name in kv_cache_names(shape.layers)[0]:
        result[name] = rng.standard_normal((1, shape.kv_heads, past, shape.head_dim), dtype=np.float32)
    return result


# --- the models -----------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Models:
    original: Path  # int4
    fused: Path
    control: Path  # the int4 original with each norm weight one ulp away
    parameters: int
    seconds: dict[str, float]  # export, quantize, fuse
    quantized: dict  # int4.quantize's op counts
    fusion: dict  # counts by op type, skipped near misses with their reasons
    replaced: set[str]  # the original's nodes that the fused nodes replaced


def _scale_inputs(model: onnx.ModelProto) -> set[str]:
    """The scale inputs of the fused nodes (RMSNorm's second input, SkipRMSNorm's third)."""
    position = {RMSNORM: 1, SKIP_RMSNORM: 2}
    return {node.input[position[node.op_type]] for node in model.graph.node
            if node.op_type in position and len(node.input) > position[node.op_type]}


def _write_control(original: Path, scales: set[str], path: Path) -> None:
    """The original with the norm weights `scales` moved by one unit in the last place (towards +inf)."""
    model = onnx.load(str(original))
    moved = 0
    for initializer in model.graph.initializer:
        if initializer.name in scales:
            weight = onnx.numpy_helper.to_array(initializer)
            initializer.CopyFrom(onnx.numpy_helper.from_array(np.nextafter(weight, np.inf).astype(weight.dtype),
                                                              initializer.name))
            moved += 1
    if moved != len(scales):
        raise RuntimeError(f"{original}: {len(scales) - moved} norm weights are not initializers of the original")
    save_model(model, path, protected=[original])


def prepare_models(shape: ModelShape, plan: Int4Plan, folder: Path, log: Callable[[str], None], *,
                   keep_export: bool = False) -> Models:
    from ..builders.exporters import export_cached_causal_lm

    seconds = {}
    name = f"llama-{shape.hidden}x{shape.layers}"
    exported, original = folder / f"{name}.onnx", folder / f"{name}.int4.onnx"
    fused, control = folder / f"{name}.int4.fused.onnx", folder / f"{name}.int4.control.onnx"
    start = time.perf_counter()
    model = build_model(shape)
    parameters = sum(p.numel() for p in model.parameters())
    export_cached_causal_lm(model, exported)
    del model
    gc.collect()
    seconds["export"] = time.perf_counter() - start

    start = time.perf_counter()
    options = int4.Int4Options(plan.block_size, plan.symmetric, plan.accuracy_level)
    quantized = int4.quantize(exported, original, options)
    seconds["quantize"] = time.perf_counter() - start
    if not keep_export:
        for path in _files_of(exported):
            path.unlink()  # the float32 export: up to gigabytes, no longer needed

    start = time.perf_counter()
    report = fuse_file(original, fused).report
    seconds["fuse"] = time.perf_counter() - start
    reasons = collections.Counter(s.reason for s in report.skipped)
    fusion = {"fused": dict(collections.Counter(f.op_type for f in report.fusions)),
              "skipped": len(report.skipped), "skipped_reasons": dict(reasons)}
    replaced = {node for f in report.fusions for node in f.replaced_nodes}
    _write_control(original, _scale_inputs(onnx.load(str(fused), load_external_data=False)), control)
    log(f"  {parameters / 1e6:.1f}M parameters; exported in {seconds['export']:.0f} s, int4 in "
        f"{seconds['quantize']:.0f} s ({quantized['MatMulNBits']} MatMulNBits, {quantized['MatMul']} MatMul left), "
        f"fused in {seconds['fuse']:.1f} s: {fusion['fused']}, {fusion['skipped']} skipped")
    return Models(original, fused, control, parameters, seconds, quantized, fusion, replaced)


# --- logits and timing ----------------------------------------------------------------------------------------------


def _session(path: Path, threads: int | None, options: ort.SessionOptions | None = None) -> ort.InferenceSession:
    return runtime.make_session(str(path), threads=threads, options=options or runtime.timing_options())


def check_logits(models: Models, steps: dict[str, dict[str, np.ndarray]], threads: int) -> dict:
    """Per phase: the fused model's logits against the original's (verify's criterion), and the control's."""
    original, fused, control = (_session(path, threads) for path in (models.original, models.fused, models.control))
    result = {}
    for phase, step in steps.items():
        reference = runtime.run(original, step, ["logits"])[0]
        comparison = verify.compare("logits", reference, runtime.run(fused, step, ["logits"])[0])
        control_diff = np.abs(runtime.run(control, step, ["logits"])[0].astype(np.float64) - reference)
        result[phase] = {"ok": comparison.ok, "max_abs": comparison.max_abs, "max_rel": comparison.max_rel,
                         "tolerance": comparison.tolerance, "control_max_abs": float(control_diff.max()),
                         "logits_max_abs": float(np.abs(reference).max()), "describe": comparison.describe()}
    return result


def paired_speedup(original: list[float], fused: list[float]) -> dict:
    """Medians in ms, their ratio, and the quartiles of the paired ratios original[i] / fused[i] (runs taken one
    after the other): where those straddle 1.0 the difference is within the noise."""
    ratios = [o / f for o, f in zip(original, fused)]
    low, _, high = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios[0],) * 3
    return {"original_ms": statistics.median(original) * 1e3, "fused_ms": statistics.median(fused) * 1e3,
            "speedup": statistics.median(original) / statistics.median(fused), "ratio_quartiles": [low, high],
            "runs": len(ratios)}


def time_phases(models: Models, steps: dict[str, dict[str, np.ndarray]], runs: dict[str, int], threads: int,
                clock: str) -> dict[str, dict]:
    sessions = [_session(path, threads) for path in (models.original, models.fused)]
    return {phase: paired_speedup(*runtime.time_interleaved(sessions, step, runs[phase], warmup=2,
                                                            clock=clock_function(clock)))
            for phase, step in steps.items()}


# --- the profile ----------------------------------------------------------------------------------------------------


def _profiling_options(prefix: Path) -> ort.SessionOptions:
    options = runtime.timing_options()
    options.enable_profiling = True
    options.profile_file_prefix = str(prefix)
    return options


def profile(models: Models, steps: dict[str, dict[str, np.ndarray]], runs: int, folder: Path,
            neighbour_names: dict[str, set[str]]) -> dict[str, dict]:
    """Per phase, on one thread: the norm share of each model (NormShare), the fused norms' cost over the
    decomposed ones', the speed-up the removed share alone would give, and the cost of the fused norms'
    neighbours (`neighbour_names`: op type -> node names, from :func:`neighbours`)."""
    is_norm = {"original": lambda name, op: name in models.replaced, "fused": lambda name, op: op in FUSED_OPS}
    events: dict[str, dict[str, list[list[dict]]]] = {}
    for which, path in (("original", models.original), ("fused", models.fused)):
        session = _session(path, 1, _profiling_options(folder / f"profile-{which}"))
        events[which] = profiled_runs(session, steps, {phase: runs for phase in steps})
    result = {}
    for phase in steps:
        before = norm_share(events["original"][phase], is_norm["original"])
        after = norm_share(events["fused"][phase], is_norm["fused"])
        rest = before.kernel_us - before.norm_us
        result[phase] = {
            "original": dataclasses.asdict(before), "fused": dataclasses.asdict(after),
            "original_share": before.share, "fused_share": after.share,
            "fused_over_decomposed": after.norm_us / before.norm_us if before.norm_us else None,
            # Per node: the profiler's floor is in every one of them; a Reshape moves no data.
            "us_per_norm_node": {"original": before.norm_us / max(1, before.norm_nodes),
                                 "fused": after.norm_us / max(1, after.norm_nodes)},
            "us_per_reshape_node": _node_floor(events["fused"][phase]),
            # If the rest of the graph cost the same in both: the speed-up the norms alone account for.
            "expected_speedup": before.kernel_us / (rest + after.norm_us) if rest + after.norm_us else None,
            "kernel_speedup": before.kernel_us / after.kernel_us if after.kernel_us else None,
            "replaced_nodes": len(models.replaced),
            "neighbours_us": {op: norm_share(events["fused"][phase], lambda name, _, names=names: name in names).norm_us
                              for op, names in sorted(neighbour_names.items())},
        }
    return result


def _node_floor(runs: list[list[dict]]) -> float:
    """The median profiled time of the FLOOR_OP nodes (0 when the model has none)."""
    floors = [median for (_, op), median in node_medians(runs).items() if op == FLOOR_OP]
    return statistics.median(floors) if floors else 0.0


def neighbours(models: Models, folder: Path) -> tuple[dict[str, int], dict[str, set[str]]]:
    """What onnxruntime runs next to the fused norms in its optimized graph: per fused node, the op types producing
    its inputs and consuming its outputs, counted by pattern; and the neighbours that are not matrix products
    (op type -> node names), the candidates for absorbing into the fused op."""
    optimized = folder / "fused.optimized.onnx"
    options = runtime.timing_options()
    options.log_severity_level = 3  # the warning that an optimized model may be specific to this machine
    options.optimized_model_filepath = str(optimized)
    options.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                     optimized.name + ".data")
    options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    _session(models.fused, 1, options)
    graph = onnx.load(str(optimized), load_external_data=False).graph
    for path in _files_of(optimized):
        path.unlink()
    producers = {output: node for node in graph.node for output in node.output}
    consumers: dict[str, list[onnx.NodeProto]] = collections.defaultdict(list)
    for node in graph.node:
        for name in node.input:
            consumers[name].append(node)
    constants = {initializer.name for initializer in graph.initializer}

    def source(name: str) -> str:
        return producers[name].op_type if name in producers else ("constant" if name in constants else "input")

    patterns: collections.Counter = collections.Counter()
    around: dict[str, set[str]] = collections.defaultdict(set)
    for node in graph.node:
        if node.op_type not in FUSED_OPS:
            continue
        data_inputs = node.input[:2] if node.op_type == SKIP_RMSNORM else node.input[:1]
        sides = [f"{label}<-{source(name)}" for label, name in zip(("X", "skip"), data_inputs)]
        for label, name in zip(("Y", "sum"), node.output):
            if name:
                sides.append(f"{label}->{'+'.join(sorted(c.op_type for c in consumers[name])) or 'output'}")
        patterns[f"{node.op_type}: {', '.join(sides)}"] += 1
        linked = [producers[n] for n in data_inputs if n in producers]
        linked += [c for n in node.output if n for c in consumers[n]]
        for other in linked:
            if other.op_type in NEIGHBOUR_OPS:
                around[other.op_type].add(other.name)
    return dict(patterns.most_common()), dict(around)


def _files_of(model: Path) -> list[Path]:
    """The model file and its external data file(s) named after it."""
    return sorted(model.parent.glob(model.name + "*"))


# --- the run --------------------------------------------------------------------------------------------------------


def run_int4(plan: Int4Plan = Int4Plan(), *, workdir: str | None = None, log: Callable[[str], None] = print) -> dict:
    """Exports, quantizes, fuses, checks, times and profiles one model per hidden size; the JSON-ready report."""
    results = []
    with tempfile.TemporaryDirectory(prefix="ort-rmsnorm-e2e-int4-") as scratch:
        folder = Path(workdir or scratch)
        folder.mkdir(parents=True, exist_ok=True)
        for hidden in plan.hidden_sizes:
            shape = model_shape(hidden, plan.layers, plan.vocab)
            log(f"{shape.describe()}:")
            models = prepare_models(shape, plan, folder, log, keep_export=workdir is not None)
            steps = {"decode": feeds(shape, 1, plan.past_tokens, seed=1),
                     "prefill": feeds(shape, plan.prefill_tokens, 0, seed=2)}
            runs = {"decode": plan.decode_runs, "prefill": plan.prefill_runs}
            check = check_logits(models, steps, plan.threads[0])
            for phase, c in check.items():
                log(f"  logits at {phase}: {check_text(c)}")
            timings = []
            for threads in plan.threads:
                clock = clock_name(threads, plan.clock)
                for phase, timing in time_phases(models, steps, runs, threads, clock).items():
                    timings.append({"threads": threads, "clock": clock, "phase": phase, **timing})
                    low, high = timing["ratio_quartiles"]
                    log(f"  {threads} thread{'s' if threads > 1 else ''}, {phase}: original "
                        f"{timing['original_ms']:.2f} ms, fused {timing['fused_ms']:.2f} ms, "
                        f"x{timing['speedup']:.3f} ({faster_or_slower(timing['speedup'], 'the original')}; paired "
                        f"quartiles {low:.3f}-{high:.3f})")
            patterns, around = neighbours(models, folder)
            profiled = profile(models, steps, plan.profile_runs, folder, around)
            decode = profiled["decode"]
            log(f"  profile (1 thread, decode): norms {decode['original']['norm_us']:.0f} us of "
                f"{decode['original']['kernel_us']:.0f} ({100 * decode['original_share']:.1f}%) -> "
                f"{decode['fused']['norm_us']:.0f} us of {decode['fused']['kernel_us']:.0f} "
                f"({100 * decode['fused_share']:.1f}%): fused / decomposed {decode['fused_over_decomposed']:.2f}")
            results.append({"shape": dataclasses.asdict(shape), "parameters": models.parameters,
                            "int4_bytes": sum(p.stat().st_size for p in _files_of(models.original)),
                            "seconds": models.seconds,
                            "quantized": models.quantized, "fusion": models.fusion, "check": check,
                            "timings": timings, "profile": profiled,
                            "neighbours": {"patterns": patterns,
                                           "nodes": {op: len(names) for op, names in sorted(around.items())}}})
            if workdir is None:
                for path in folder.iterdir():
                    path.unlink()
    return {"plan": dataclasses.asdict(plan), "models": results}
