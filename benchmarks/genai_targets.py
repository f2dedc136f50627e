"""The fusion targets through onnxruntime-genai: tokens per second of real-shaped decoders, every target side by side.

    python benchmarks/genai_targets.py --out benchmarks/results/genai/genai-targets.md
    python benchmarks/genai_targets.py --models smollm2-135m --rounds 15 --out -

For each model shape (SmolLM2-135M's and Qwen2.5-0.5B's: their hidden size, layers, heads, MLP width and vocabulary,
random weights, a shorter context), a Hugging Face folder is made with ``transformers``, built for the CPU by
onnxruntime-genai's model builder (``int4``: int4 weights, the builder's default accuracy level 4; or another build of
``ort_rmsnorm.builders.genai.PRECISIONS``), and fused as a folder once per target. The contenders are the original, a
control (a second ``og.Model`` of the original: what differs between two loads of one folder) and each target's
folder; each round runs one greedy generation of each (the prompt in one step, then one token per step), in the order
of ``ort_rmsnorm.runtime.turns``. A cell is original / contender in tokens per second terms: the ratio of the
contenders' median tokens/s over the original's (above 1: the contender is faster), in brackets the quartiles of the
per-round ratios. The load average is read before and after. Measure on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import ort_rmsnorm
from ort_rmsnorm import folders
from ort_rmsnorm.contract import AUTO, CUSTOM, DEFAULT_TARGET, ORT, TARGETS
from ort_rmsnorm.bench import machine
from ort_rmsnorm.bench.cold import quartiles
from ort_rmsnorm.builders import genai as genai_folders
from ort_rmsnorm.runtime import turns

from genai_e2e import timed_generation, with_session_settings

ORIGINAL, CONTROL = "original", "control"


@dataclasses.dataclass(frozen=True)
class Shape:
    """A real model's shapes (random weights) and the Hugging Face settings that change its graph."""
    architecture: str
    config: genai_folders.TinyConfig
    settings: dict


SHAPES = {
    # HuggingFaceTB/SmolLM2-135M: Llama, hidden 576, 30 layers, 9 heads over 3 KV heads, MLP 1536, vocabulary 49152.
    "smollm2-135m": Shape("llama", genai_folders.TinyConfig(
        hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9, num_key_value_heads=3,
        vocab_size=49152, max_position_embeddings=512), {"tie_word_embeddings": True, "rope_theta": 100000.0}),
    # Qwen/Qwen2.5-0.5B: Qwen2 (q/k/v biases), hidden 896, 24 layers, 14 heads over 2 KV heads, MLP 4864,
    # vocabulary 151936.
    "qwen2.5-0.5b": Shape("qwen2", genai_folders.TinyConfig(
        hidden_size=896, intermediate_size=4864, num_layers=24, num_heads=14, num_key_value_heads=2,
        vocab_size=151936, max_position_embeddings=512, rms_norm_eps=1e-6),
        {"tie_word_embeddings": True, "rope_theta": 1000000.0}),
}


def log(line: str) -> None:
    print(f"genai_targets: {line}", file=sys.stderr, flush=True)


def load_average() -> float:
    return (machine.load_average() or [float("nan")])[0]


def paired(contender: list[float], original: list[float]) -> dict:
    """Tokens/s: median(contender) / median(original), and the quartiles of the per-round ratios."""
    low, _, high = quartiles([a / b for a, b in zip(contender, original)])
    return {"ratio": statistics.median(contender) / statistics.median(original), "low": low, "high": high}


def run_shape(name: str, shape: Shape, args, work: Path) -> dict:
    import onnxruntime_genai as og

    started = time.perf_counter()
    hf_folder = genai_folders.make_hf_folder(shape.architecture, work / f"hf-{name}", shape.config,
                                             **shape.settings)
    log(f"{name}: Hugging Face folder made ({time.perf_counter() - started:.0f} s); building {args.precision}")
    original = genai_folders.build_genai_folder(hf_folder, work / f"{name}-{args.precision}", args.precision,
                                                work / "builder-cache")
    folders_by_contender = {ORIGINAL: original, CONTROL: original}
    fusions = {}
    for target in args.targets:
        destination = work / f"{name}-{args.precision}-{target}"
        report = folders.fuse_folder(original, destination, target=target)
        fusions[target] = {"fused": len(report.models[0].report.fusions),
                           "norm_ops": genai_folders.norm_ops(destination / "model.onnx")}
        folders_by_contender[target] = destination
        log(f"{name}: {target}: {fusions[target]['fused']} norms fused, ops {fusions[target]['norm_ops']}")
    for folder in set(folders_by_contender.values()):
        with_session_settings(folder, args.threads)
    config = json.loads((original / folders.GENAI_CONFIG).read_text())
    max_length = min(config["model"]["context_length"], args.prompt + args.new_tokens + 8)
    prompt = genai_folders.prompt_tokens(args.prompt, shape.config.vocab_size)
    models = {contender: og.Model(str(folder)) for contender, folder in folders_by_contender.items()}
    names = list(models)
    tokens = {}
    for contender in names:  # warm, and the tokens each generates
        tokens[contender] = timed_generation(models[contender], prompt, args.new_tokens, max_length)[2]
    prefill = {contender: [] for contender in names}
    decode = {contender: [] for contender in names}
    load_start = load_average()
    load_high = load_start
    for round_index, index in enumerate(turns(len(names), args.rounds)):
        contender = names[index]
        prefill_s, decode_s, _ = timed_generation(models[contender], prompt, args.new_tokens, max_length)
        prefill[contender].append(len(prompt) / prefill_s)
        decode[contender].append(args.new_tokens / decode_s)
        load_high = max(load_high, load_average())
        if (round_index + 1) % len(names) == 0:
            done = (round_index + 1) // len(names)
            if done % 5 == 0 or done == args.rounds:
                log(f"{name}: round {done}/{args.rounds} (load average {load_average():.2f})")
    return {
        "shape": name, "architecture": shape.architecture, "config": dataclasses.asdict(shape.config),
        "settings": shape.settings, "precision": args.precision, "fusions": fusions,
        "tokens_matched": {contender: sum(a == b for a, b in zip(tokens[ORIGINAL], tokens[contender]))
                           for contender in names},
        "tokens_compared": len(tokens[ORIGINAL]),
        "original_tokens_per_s": {"prefill": statistics.median(prefill[ORIGINAL]),
                                  "decode": statistics.median(decode[ORIGINAL])},
        "cells": {phase: {contender: paired(samples[contender], samples[ORIGINAL]) for contender in names
                          if contender != ORIGINAL}
                  for phase, samples in (("decode", decode), ("prefill", prefill))},
        "samples": {"prefill": prefill, "decode": decode},
        "load_average": {"start": load_start, "highest": load_high},
    }


def cell(entry: dict) -> str:
    bold = entry["low"] > 1 or entry["high"] < 1
    text = f"{entry['ratio']:.3f} [{entry['low']:.3f}-{entry['high']:.3f}]"
    return f"**{text}**" if bold else text


def markdown(result: dict) -> str:
    env = result["environment"]
    targets = result["targets"]
    heads = [f"{target}{' (default)' if target == DEFAULT_TARGET else ''}" for target in targets]
    lines = [
        "# Fusion targets through onnxruntime-genai", "",
        f"`{result['command']}`", "",
        f"Machine: {env['cpu']}, {env['cpus']} CPUs; onnxruntime {env['onnxruntime']}, onnxruntime-genai "
        f"{env['onnxruntime_genai']}, ort-rmsnorm {env['ort_rmsnorm']}; {result['date']}. The auto target's table: "
        f"{result['auto_table']}.", "",
        f"Builds: `{result['precision']}` ({' '.join(genai_folders.PRECISIONS[result['precision']])}), random "
        f"weights, context 512. Each round: one greedy generation of each contender ({result['prompt_tokens']} "
        f"prompt tokens in one step, then {result['new_tokens']} tokens one per step), "
        f"{result['threads']} intra-op thread(s), {result['rounds']} rounds. A cell: the contender's median tokens/s "
        "over the original's (above 1: faster), in brackets the quartiles of the per-round ratios, **bold** where "
        "they do not straddle 1. `control`: a second load of the original folder.", "",
        "| model | phase | original tok/s | control | " + " | ".join(heads) + " | load average |",
        "|---|---|---|---|" + "---|" * len(targets) + "---|",
    ]
    for case in result["cases"]:
        for phase in ("decode", "prefill"):
            cells = case["cells"][phase]
            lines.append(f"| {case['shape']} | {phase} | {case['original_tokens_per_s'][phase]:.1f} | "
                         f"{cell(cells[CONTROL])} | " + " | ".join(cell(cells[target]) for target in targets)
                         + f" | {case['load_average']['start']:.2f} → {case['load_average']['highest']:.2f} |")
    lines += ["", "Norm ops written per target, and tokens equal to the original's (greedy, same prompt):", ""]
    for case in result["cases"]:
        for target in targets:
            ops = ", ".join(f"{count} {op.split('.')[-1]}" for op, count in sorted(
                case["fusions"][target]["norm_ops"].items()))
            lines.append(f"- {case['shape']} `{target}`: {case['fusions'][target]['fused']} norms fused ({ops}); "
                         f"tokens {case['tokens_matched'][target]}/{case['tokens_compared']} as the original's")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(SHAPES), help=f"model shapes ({', '.join(SHAPES)})")
    parser.add_argument("--targets", default=f"{CUSTOM},{AUTO},{ORT}", help="fusion targets to compare")
    parser.add_argument("--precision", default="int4", choices=sorted(genai_folders.PRECISIONS))
    parser.add_argument("--prompt", type=int, default=64, help="prompt tokens (prefill)")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens generated one per step (decode)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads of every decoder")
    parser.add_argument("--out", default="-", help="markdown file (and a .json beside it), or - for stdout")
    args = parser.parse_args(argv)
    shapes = args.models.split(",")
    if unknown := set(shapes) - set(SHAPES):
        parser.error(f"--models: unknown {', '.join(sorted(unknown))} (choose from {', '.join(SHAPES)})")
    args.targets = args.targets.split(",")
    if unknown := set(args.targets) - set(TARGETS):
        parser.error(f"--targets: unknown {', '.join(sorted(unknown))} (choose from {', '.join(TARGETS)})")
    if args.rounds < 2:
        parser.error("--rounds: at least 2 (quartiles of the per-round ratios)")
    if missing := genai_folders.missing_requirements():
        print(f"genai_targets: {missing}", file=sys.stderr)
        return 2
    import onnxruntime
    import onnxruntime_genai

    result = {
        "command": "python benchmarks/genai_targets.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "environment": {"onnxruntime": onnxruntime.__version__, "onnxruntime_genai": onnxruntime_genai.__version__,
                        "ort_rmsnorm": ort_rmsnorm.__version__, "cpu": machine.cpu_model(),
                        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()},
        "auto_table": _auto_table_line(),
        "targets": args.targets, "precision": args.precision, "prompt_tokens": args.prompt,
        "new_tokens": args.new_tokens, "rounds": args.rounds, "threads": args.threads, "cases": [],
    }
    with tempfile.TemporaryDirectory(prefix="genai-targets-") as scratch:
        for name in shapes:
            log(f"{name} (load average {load_average():.2f})")
            result["cases"].append(run_shape(name, SHAPES[name], args, Path(scratch)))
            for path in Path(scratch).iterdir():  # one shape's folders at a time on disk
                if path.name != "builder-cache":
                    _remove(path)
    text = markdown(result)
    if args.out == "-":
        print(text)
    else:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
        print(text)
    return 0


def _remove(path: Path) -> None:
    import shutil

    shutil.rmtree(path) if path.is_dir() else path.unlink()


def _auto_table_line() -> str:
    from ort_rmsnorm.rewrites._target_auto import current_table

    table = current_table()
    return f"{dict(table.faster_up_to)} ({table.describe()})"


if __name__ == "__main__":
    sys.exit(main())
