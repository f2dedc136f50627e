"""The fusion targets side by side, end to end: one model fused once per target, every version timed in one process.

    python benchmarks/targets_e2e.py --out benchmarks/results/targets-e2e.md

Models: the Llama-style model of ``ort_rmsnorm.builders.llama`` built with ``onnx.helper`` (the demo's, in the dynamo
exporter's spelling: onnxruntime fuses none of its norms), with a KV cache, at SmolLM-135M's proportions for each
hidden size (heads of 64, MLP 8/3 of the hidden size: ``ort_rmsnorm.builders.smollm.model_shape``; every head has its
own keys and values, as the onnx.helper model has no grouped ones), ``--layers`` decoder layers, the demo's
vocabulary. Float32 activations with int4 weights (onnxruntime's MatMulNBitsQuantizer, ``ort_rmsnorm.builders.int4``:
block 32, symmetric, accuracy level unset), and one float16 model, not quantized (``--float16-hidden``).

Contenders: the original, and the model fused once per target: ``custom`` (this package's RMSNorm/SkipRMSNorm),
``ort`` (onnxruntime's SimplifiedLayerNormalization/SkipSimplifiedLayerNormalization), ``auto`` (per norm the op
measured faster for its type and row length, by the table in force: ``ort_rmsnorm.auto_table``) and ``onnx`` (RMSNormalization, the model
converted to opset 23), where the pass and the installed onnxruntime can. Every fused model's outputs (logits and
the present keys and values) are checked against the original's with ``ort_rmsnorm.verify``'s tolerance on both
steps before anything is timed: a mismatch stops the run.

Steps: decode, one token after ``--past`` cached ones (random keys and values), and prefill, ``--prefill`` tokens from
an empty cache. Per thread count, all contenders' sessions are open at once and their runs go round-robin (which one
goes first rotates; ``ort_rmsnorm.runtime.time_interleaved``), the intra-op threads stop spinning when a run returns;
the rounds are split over ``--session-sets`` sets of sessions, opened one after the other, each with the contenders
in another order (within a set, each runs after the same other one).
One thread: the calling thread's CPU time (onnxruntime starts no pool, and time other processes hold the core is left
out); two: wall time. A cell is original / contender, the ratio of the medians, above 1 when the contender is faster;
in brackets the quartiles of the paired ratios (each run of the original against the contender's run of the same
round): where they straddle 1 the difference is within the run-to-run noise. ``orig/orig`` is a control: a second
session of the original, timed as a contender. Its distance from 1 is what differs between two sessions of one model
(where its weights and buffers landed in memory, for one), a noise the paired quartiles do not show: read a
contender's difference from another against it too. ``ort/auto`` compares the two fused models directly, above 1
when ``auto`` is faster. Where ``auto`` chose the same op for every norm as another target, its model is that
target's, and the two columns differ by that same session noise. ``--compare-library OLD.so`` adds the ``custom``
model run with another build of the library, side by side: a change to the library, end to end.

Progress goes to stderr, the tables to stdout (and with ``--out`` to a markdown file with the machine's description).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import gc
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

from ort_rmsnorm import fuse_file, runtime, verify
from ort_rmsnorm.model.read import ModelFileError
from ort_rmsnorm.model.write import save_model, write_text_atomically
from ort_rmsnorm.bench.machine import load_average, load_note, machine_info, machine_line
from ort_rmsnorm.bench.timing import clock_function, clock_name
from ort_rmsnorm.contract import AUTO, CUSTOM, DEFAULT_TARGET, ONNX, ORT
from ort_rmsnorm.builders import int4
from ort_rmsnorm.builders.llama import DEMO_CONFIG, LlamaConfig, build_llama_onnx
from ort_rmsnorm.builders.smollm import model_shape

TARGETS = (CUSTOM, ORT, AUTO, ONNX)
CONTROL = "original again"
COMPARED = "custom, compared library"  # the custom model on --compare-library
# The fused ops as the report names them, short.
OP_NAMES = {"ort_rmsnorm.RMSNorm": "ours", "ort_rmsnorm.SkipRMSNorm": "ours Skip",
            "SimplifiedLayerNormalization": "ort", "com.microsoft.SkipSimplifiedLayerNormalization": "ort Skip",
            "RMSNormalization": "onnx"}


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclasses.dataclass
class Model:
    """One original and its fused versions."""

    hidden: int
    dtype: str  # of the activations
    weights: str  # "int4" or the dtype
    config: LlamaConfig
    original: Path
    fused: dict[str, Path] = dataclasses.field(default_factory=dict)  # target -> file, the ones that run
    ops: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)  # target -> fused op counts
    not_run: dict[str, str] = dataclasses.field(default_factory=dict)  # target -> why

    @property
    def label(self) -> str:
        return f"{self.weights}" if self.weights == self.dtype else f"{self.weights}, {self.dtype} act."


def config_for(hidden: int, layers: int, vocab: int) -> LlamaConfig:
    shape = model_shape(hidden, layers, vocab)
    return LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=shape.intermediate,
                       num_layers=layers, num_heads=shape.heads, rms_norm_eps=DEMO_CONFIG.rms_norm_eps)


def build(config: LlamaConfig, dtype: str, quantize: bool, folder: Path) -> Model:
    name = f"llama-{config.hidden_size}x{config.num_layers}-{dtype}"
    path = folder / f"{name}.onnx"
    start = time.perf_counter()
    # Shapes of the intermediates as the dynamo exporter writes them (the demo's reason: the quantizer keeps them).
    save_model(onnx.shape_inference.infer_shapes(build_llama_onnx(config, dtype, kv_cache=True),
                                                 strict_mode=True, data_prop=True), path)
    log(f"  built in {time.perf_counter() - start:.0f} s")
    if not quantize:
        return Model(config.hidden_size, dtype, dtype, config, path)
    start = time.perf_counter()
    quantized = folder / f"{name}.int4.onnx"
    counts = int4.quantize(path, quantized)
    for file in folder.glob(path.name + "*"):
        file.unlink()
    log(f"  int4: {counts['MatMulNBits']} MatMulNBits, {counts['MatMul']} MatMul left, in "
        f"{time.perf_counter() - start:.0f} s")
    return Model(config.hidden_size, dtype, "int4", config, quantized)


def fuse_targets(model: Model, targets: list[str]) -> None:
    for target in targets:
        destination = model.original.with_name(model.original.name.replace(".onnx", f".{target}.onnx"))
        try:
            report = fuse_file(model.original, destination, target, allow_opset_upgrade=target == ONNX).report
        except ModelFileError as error:
            if target != ONNX:
                raise
            # The opset conversion refusing the model (e.g. for an op it cannot convert) is a result to record.
            model.not_run[target] = f"the pass refused the model: {error}"
            log(f"  {target}: {model.not_run[target]}")
            continue
        counts = report.ops_written()
        model.ops[target] = dict(counts)
        if not report.fusions:
            reasons = collections.Counter(skipped.reason for skipped in report.skipped)
            model.not_run[target] = "nothing fused: " + "; ".join(f"{n} x {r}" for r, n in reasons.most_common(3))
            log(f"  {target}: {model.not_run[target]}")
            continue
        model.fused[target] = destination
        log(f"  {target}: {dict(counts)}, {len(report.skipped)} skipped")


def steps(model: Model, past: int, prefill: int) -> dict[str, dict[str, np.ndarray]]:
    config, rng = model.config, np.random.default_rng(0)

    def step(tokens: int, cached: int) -> dict[str, np.ndarray]:
        feeds = {"input_ids": rng.integers(0, config.vocab_size, (1, tokens), dtype=np.int64)}
        for layer in range(config.num_layers):
            for part in ("key", "value"):
                feeds[f"past_key_values.{layer}.{part}"] = rng.standard_normal(
                    (1, config.num_heads, cached, config.head_dim)).astype(model.dtype)
        return feeds

    return {"decode": step(1, past), "prefill": step(prefill, 0)}


def check(model: Model, phases: dict[str, dict[str, np.ndarray]]) -> None:
    """Every output of every fused model within verify's tolerance of the original's, or SystemExit."""
    for target, path in list(model.fused.items()):
        for phase, feeds in phases.items():
            try:
                result = verify.verify(model.original, path, inputs=feeds)
            except verify.FusedModelError as error:
                if target == ONNX:  # onnxruntime without an opset-23 RMSNormalization kernel
                    model.not_run[target] = f"onnxruntime cannot run it: {str(error).splitlines()[0][:160]}"
                    del model.fused[target]
                    log(f"  {target}: {model.not_run[target]}")
                    break
                raise SystemExit(f"hidden {model.hidden} {model.label}, target {target}: {error}")
            if not result.ok:
                raise SystemExit(f"hidden {model.hidden} {model.label}, target {target}, {phase}: the fused model's "
                                 f"outputs differ from the original's beyond verify's tolerance:\n{result.describe()}")
            worst = max(result.outputs, key=lambda output: output.max_rel / (output.tolerance or 1))
            log(f"  verify {target} {phase}: {len(result.outputs)} outputs ok (worst: {worst.name} max rel "
                f"{worst.max_rel:.2g}, tolerance {worst.tolerance:.2g})")


def paired(numerator: list[float], denominator: list[float]) -> dict:
    """median(numerator) / median(denominator) and the quartiles of the per-round ratios."""
    ratios = [a / b for a, b in zip(numerator, denominator)]
    low, _, high = statistics.quantiles(ratios, n=4)
    return {"ratio": statistics.median(numerator) / statistics.median(denominator), "low": low, "high": high}


def rounds_for(sessions: list, feeds: dict[str, np.ndarray], runs: int, seconds: float) -> int:
    """``runs``, or more where ``seconds`` of rounds (each contender once, wall time) hold more."""
    if not seconds:
        return runs
    for session in sessions:  # warm
        runtime.run(session, feeds)
    start = time.perf_counter()
    for session in sessions:
        runtime.run(session, feeds)
    return max(runs, int(seconds / (time.perf_counter() - start)))


def session(path: Path, threads: int, library: str | None):
    """A timing session of ``path``, with this package's library or with ``library``."""
    options = runtime.timing_options()
    if library:
        options.register_custom_ops_library(library)
    return runtime.make_session(str(path), threads=threads, options=options, custom_ops=not library)


def time_model(model: Model, phases: dict[str, dict[str, np.ndarray]], threads: int, runs: dict[str, int],
               seconds: float, session_sets: int, compare_library: str | None = None) -> list:
    """The rows of one model at one thread count. The rounds are split over ``session_sets`` sets of sessions, each
    opened after the one before is closed, so that no contender keeps one session's luck (or bad luck) in where
    its weights landed in memory; a second session of the original is the control for what remains. Within a set
    the turns go round in a fixed cycle, each contender after the same other one, so every set shuffles the cycle."""
    paths = {"original": model.original, CONTROL: model.original, **model.fused}
    if compare_library and CUSTOM in model.fused:
        paths[COMPARED] = model.fused[CUSTOM]
    names = list(paths)
    clock, rng = clock_name(threads, "auto"), np.random.default_rng(threads)
    samples = {phase: {name: [] for name in names} for phase in phases}
    counts, seconds_taken, loads = {}, collections.Counter(), collections.defaultdict(list)
    for index in range(session_sets):
        order = [names[i] for i in rng.permutation(len(names))]
        sessions = [session(paths[name], threads, compare_library if name == COMPARED else None) for name in order]
        for phase, feeds in phases.items():
            start = time.perf_counter()
            if index == 0:
                counts[phase] = -(-rounds_for(sessions, feeds, runs[phase], seconds) // session_sets)
            loads[phase] += load_average()
            timed = runtime.time_interleaved(sessions, feeds, counts[phase], warmup=2, clock=clock_function(clock))
            loads[phase] += load_average()
            for name, times in zip(order, timed):
                samples[phase][name] += times
            seconds_taken[phase] += time.perf_counter() - start
        del sessions
        gc.collect()
    rows = []
    for phase, timed in samples.items():
        row = {"hidden": model.hidden, "model": model.label, "phase": phase, "threads": threads, "clock": clock,
               "runs": len(timed["original"]), "original_ms": statistics.median(timed["original"]) * 1e3,
               "vs": {name: paired(timed["original"], timed[name]) for name in names[1:]},
               "load": max(loads[phase]) if loads[phase] else None}
        if ORT in timed and AUTO in timed:
            row["ort_over_auto"] = paired(timed[ORT], timed[AUTO])
        rows.append(row)
        log(f"  {threads} thread(s), {phase}: original {row['original_ms']:.2f} ms; "
            + ", ".join(f"{t} {c['ratio']:.3f} [{c['low']:.3f}-{c['high']:.3f}]" for t, c in row["vs"].items())
            + f" ({row['runs']} rounds in {session_sets} session sets, {seconds_taken[phase]:.0f} s)")
    return rows


# --- tables ---------------------------------------------------------------------------------------------------------


def cell(entry: dict | None) -> str:
    if entry is None:
        return "-"
    text = f"{entry['ratio']:.3f} [{entry['low']:.3f}-{entry['high']:.3f}]"
    # Bold where the quartiles of the paired ratios do not straddle 1: a difference beyond the noise.
    return f"**{text}**" if entry["low"] > 1 or entry["high"] < 1 else text


def auto_ops(model: Model) -> str:
    counts = model.ops.get(AUTO)
    if not counts:
        return "-"
    return ", ".join(f"{OP_NAMES.get(op, op)} {n}" for op, n in sorted(counts.items(), key=lambda item: -item[1]))


def table(rows: list[dict], models: dict[tuple[int, str], Model], threads: int) -> str:
    columns = [CONTROL, CUSTOM, ORT, AUTO, ONNX] + ([COMPARED] if any(COMPARED in row["vs"] for row in rows) else [])
    heads = {CONTROL: "orig/orig", CUSTOM: f"orig/custom{' (default)' if DEFAULT_TARGET == CUSTOM else ''}",
             ORT: "orig/ort", AUTO: f"orig/auto{' (default)' if DEFAULT_TARGET == AUTO else ''}", ONNX: "orig/onnx",
             COMPARED: "orig/custom, compared library"}
    lines = [f"**{threads} intra-op thread{'s' if threads > 1 else ''}** ({rows[0]['clock'].replace('_', ' ')})", "",
             "| hidden | weights | phase | rounds | original ms | " + " | ".join(heads[c] for c in columns)
             + " | ort/auto | auto's ops |", "|---|---|---|---|---|" + "---|" * len(columns) + "---|---|"]
    for row in rows:
        model = models[(row["hidden"], row["model"])]
        lines.append(f"| {row['hidden']} | {row['model']} | {row['phase']} | {row['runs']} | "
                     f"{row['original_ms']:.2f} | "
                     + " | ".join(cell(row["vs"].get(target)) for target in columns)
                     + f" | {cell(row.get('ort_over_auto'))} | {auto_ops(model)} |")
    return "\n".join(lines)


def notes(models: dict[tuple[int, str], Model]) -> list[str]:
    seen = collections.defaultdict(list)
    for model in models.values():
        for target, why in model.not_run.items():
            seen[(target, why)].append(f"{model.hidden} {model.label}")
    return [f"- `{target}` not run for {', '.join(where)}: {why}" for (target, why), where in seen.items()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", default="256,576,1024,2048", help="hidden sizes of the int4 models")
    parser.add_argument("--float16-hidden", type=int, default=576,
                        help="hidden size of the float16 model (not quantized); 0: none")
    parser.add_argument("--threads", default="1,2", help="intra-op thread counts")
    parser.add_argument("--runs", type=int, default=100,
                        help="interleaved decode rounds (a run of each contender), at least")
    parser.add_argument("--prefill-runs", type=int, default=15, help="interleaved prefill rounds, at least")
    parser.add_argument("--seconds", type=float, default=60,
                        help="more rounds where a cell's rounds fit in this many seconds (0: exactly --runs)")
    parser.add_argument("--session-sets", type=int, default=4,
                        help="open every contender's session this many times, the rounds split between them")
    parser.add_argument("--layers", type=int, default=8, help="decoder layers of every model")
    parser.add_argument("--vocab", type=int, default=DEMO_CONFIG.vocab_size, help="vocabulary (the demo's)")
    parser.add_argument("--past", type=int, default=128, help="cached tokens at the decode step")
    parser.add_argument("--prefill", type=int, default=64, help="tokens of the prefill")
    parser.add_argument("--targets", default=",".join(TARGETS), help="the fusion targets to compare")
    parser.add_argument("--compare-library", metavar="PATH",
                        help="another build of libort_rmsnorm.so: the custom model timed with it too, side by side")
    parser.add_argument("--out", type=Path, help="also write the tables and the machine's description here")
    args = parser.parse_args(argv)
    try:
        hidden_sizes = [int(h) for h in args.hidden.split(",") if h]
        thread_counts = [int(t) for t in args.threads.split(",") if t]
    except ValueError as error:
        parser.error(f"--hidden and --threads take comma-separated integers: {error}")
    if not hidden_sizes or not thread_counts or min(hidden_sizes + thread_counts) < 1:
        parser.error("--hidden and --threads: one positive integer or more")
    targets = [t for t in args.targets.split(",") if t]
    if unknown := set(targets) - set(TARGETS):
        parser.error(f"--targets: unknown {', '.join(sorted(unknown))} (choose from {', '.join(TARGETS)})")
    if args.runs < 2 or args.prefill_runs < 2:
        parser.error("--runs and --prefill-runs: at least 2 (the paired quartiles need two runs)")
    if args.session_sets < 1:
        parser.error("--session-sets: at least 1")
    if (why := int4.unavailable()) is not None:
        parser.error(why)
    runs = {"decode": args.runs, "prefill": args.prefill_runs}

    machine = machine_info()
    start = time.perf_counter()
    models: dict[tuple[int, str], Model] = {}
    rows: list[dict] = []
    specs = [(h, "float32", True) for h in hidden_sizes]
    if args.float16_hidden:
        specs.append((args.float16_hidden, "float16", False))
    with tempfile.TemporaryDirectory(prefix="targets-e2e-") as scratch:
        for hidden, dtype, quantize in specs:
            config = config_for(hidden, args.layers, args.vocab)
            log(f"hidden {hidden}, {config.num_layers} layers, {config.num_heads} heads, MLP "
                f"{config.intermediate_size}, vocabulary {config.vocab_size}, {dtype}"
                + (", int4 weights:" if quantize else ":"))
            folder = Path(scratch) / f"{hidden}-{dtype}"
            folder.mkdir()
            model = build(config, dtype, quantize, folder)
            fuse_targets(model, targets)
            phases = steps(model, args.past, args.prefill)
            check(model, phases)
            models[(model.hidden, model.label)] = model
            for threads in thread_counts:
                rows += time_model(model, phases, threads, runs, args.seconds, args.session_sets,
                                   args.compare_library)
            for file in folder.iterdir():
                file.unlink()
    minutes = (time.perf_counter() - start) / 60

    from ort_rmsnorm.rewrites._target_auto import current_table

    tables = [table([r for r in rows if r["threads"] == threads], models, threads) for threads in thread_counts]
    text = "\n\n".join(tables) + "\n"
    if extra := notes(models):
        text += "\n" + "\n".join(extra) + "\n"
    if load_warning := load_note([r["load"] for r in rows if r["load"] is not None], max(thread_counts)):
        text += f"\n{load_warning}\n"
    print(text)
    if args.out:
        command = "python benchmarks/targets_e2e.py " + shlex.join(argv if argv is not None else sys.argv[1:])
        head = [
            "# Fusion targets end to end", "",
            f"`{command}` ({minutes:.0f} minutes)", "",
            f"Machine: {machine_line(machine)}. Python {machine['python']}; "
            f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC at the end.", "",
            f"Models: the onnx.helper Llama of `ort_rmsnorm.builders.llama` with a KV cache, {args.layers} layers, "
            f"vocabulary {args.vocab}, SmolLM-135M's proportions; int4 weights (MatMulNBits, block 32, symmetric) with "
            f"float32 activations, and a float16 model (not quantized). Decode: 1 token after {args.past} cached; "
            f"prefill: {args.prefill} tokens. Rounds (one run of each contender, interleaved, the first one "
            f"rotating): at least {runs['decode']} for decode and {runs['prefill']} for prefill"
            + (f", more where {args.seconds:.0f} s hold more" if args.seconds else "")
            + f", split over {args.session_sets} sets of sessions opened one after the other.", "",
            f"The `auto` target's table: {dict(current_table().faster_up_to)} ({current_table().describe()}).", "",
            "A cell: original / contender, the ratio of the medians (above 1: the contender is faster), in brackets "
            "the quartiles of the paired per-round ratios; **bold** where they do not straddle 1. `orig/orig`: a "
            "second session of the original as a contender, the control for what differs between two sessions of "
            "one model. `ort/auto`: the `ort` model's time over the `auto` model's (above 1: `auto` faster). "
            "auto's ops: the fused nodes `auto` wrote (ours: ort_rmsnorm.RMSNorm/SkipRMSNorm; ort: "
            "SimplifiedLayerNormalization/SkipSimplifiedLayerNormalization; Skip: the residual form).",
            "",
        ]
        if machine.get("load_average_at_start"):
            head.append(f"Load average at the start {machine['load_average_at_start'][0]:.2f}; the highest seen "
                        f"while timing {max(r['load'] for r in rows if r['load'] is not None):.2f} (2 cores, "
                        "shared with other work).\n")
        write_text_atomically(args.out, "\n".join(head) + "\n" + text, protected=[])
        log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
