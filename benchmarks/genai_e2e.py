"""onnxruntime-genai end to end: tiny random-weight folders built with genai's model builder, fused as folders.

    python benchmarks/genai_e2e.py --out benchmarks/results/genai      # writes genai_e2e.json and genai_e2e.md

For each architecture (Llama, Qwen3 with its q/k norms, Gemma 2 with float32 casts around its 16-bit norms) and
build (``fp32``; ``int4`` with the builder's default CPU accuracy level 4, where MatMulNBits quantizes its
activations to int8; ``int4-acc1``, int4 weights with float32 activations; ``fp16-cpu``), it builds the folder
(``ort_rmsnorm.builders.genai``: the folders the test suite checks), fuses it with ``ort_rmsnorm.fuse_folder`` and
compares the two with onnxruntime_genai:

- tokens: greedy generation from the same prompt. Builds with float32 activations must match token for token.
- teacher-forced logits: both decoders (and a control) on the same fixed sequence in onnxruntime, largest absolute
  difference and how many positions keep their argmax. The control is the original with one norm's scale moved by
  one unit in the last place, run without our library: in the default int4 build, whose int8 activation
  quantization turns such a change into flipped tokens, the fused folder is judged against it, not by tokens.
- speed: prefill (the prompt in one step) and decode (one token per step) in tokens/s, the two folders taking turns
  in each round (which goes first alternates), medians over the rounds; a ratio above 1 means the fused folder is
  faster. The sessions' threads stop spinning when a run returns, so that neither slows the other's next run.

A build that genai cannot run (fp16 on CPU fails at decode in genai 0.18.0, fused or not) is recorded with its error.
Measure on an otherwise idle machine: at this size a step takes a few milliseconds and the ratio is noise-sized.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx_ir as ir

import ort_rmsnorm
from ort_rmsnorm import folders, runtime, verify
from ort_rmsnorm.model.read import load_model
from ort_rmsnorm.model.write import save_model, write_text_atomically
from ort_rmsnorm.contract import ORT_SIMPLIFIED_LAYER_NORM
from ort_rmsnorm.builders import genai as genai_folders

RESULTS = Path(__file__).resolve().parent / "results" / "genai"

DEFAULT_CONFIG = genai_folders.TinyConfig(hidden_size=512, intermediate_size=1376, num_layers=2, num_heads=8,
                                          num_key_value_heads=4, vocab_size=2048, max_position_embeddings=512)


@dataclasses.dataclass
class Speed:
    prefill_tokens_per_s: list[float] = dataclasses.field(default_factory=list)
    decode_tokens_per_s: list[float] = dataclasses.field(default_factory=list)

    def medians(self) -> dict[str, float]:
        return {"prefill_tokens_per_s": statistics.median(self.prefill_tokens_per_s),
                "decode_tokens_per_s": statistics.median(self.decode_tokens_per_s)}


def _genai_model(folder: Path):
    import onnxruntime_genai as og

    return og.Model(str(folder))


def timed_generation(model, prompt: list[int], new_tokens: int, max_length: int) -> tuple[float, float, list[int]]:
    """(prefill s, decode s for ``new_tokens`` tokens, tokens) of one greedy generation."""
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    params.set_search_options(max_length=max_length, min_length=len(prompt) + new_tokens + 1, do_sample=False)
    generator = og.Generator(model, params)
    start = time.perf_counter()
    generator.append_tokens(prompt)  # runs the prefill and picks the first new token
    prefill = time.perf_counter() - start
    tokens = [int(generator.get_next_tokens()[0])]
    start = time.perf_counter()
    for _ in range(new_tokens):
        generator.generate_next_token()
        tokens.append(int(generator.get_next_tokens()[0]))
    return prefill, time.perf_counter() - start, tokens


def with_session_settings(folder: Path, threads: int | None) -> None:
    """Both folders' decoders: spinning threads stopped at the end of each run; ``threads`` intra-op threads."""
    path = folder / folders.GENAI_CONFIG
    config = json.loads(path.read_text())
    options = config["model"]["decoder"].setdefault("session_options", {})
    options["session.force_spinning_stop"] = "1"  # genai passes string values on as session config entries
    if threads is not None:
        options["intra_op_num_threads"] = threads
    path.write_text(json.dumps(config, indent=4) + "\n")


def _control_folder(original: Path, destination: Path) -> Path:
    """The original with the scale of its first SimplifiedLayerNormalization one ulp larger (towards +inf)."""
    shutil.copytree(original, destination)
    model = load_model(original / "model.onnx")
    node = next(node for node in model.graph if node.op_type == ORT_SIMPLIFIED_LAYER_NORM)
    scale = node.inputs[1]
    values = scale.const_value.numpy()
    scale.const_value = ir.Tensor(np.nextafter(values, np.inf).astype(values.dtype), name=scale.name)
    (destination / "model.onnx").unlink()
    (destination / "model.onnx.data").unlink(missing_ok=True)
    save_model(model, destination / "model.onnx")
    return destination


def _logit_comparison(reference: np.ndarray, other: np.ndarray) -> dict:
    """Largest difference, positions keeping their argmax, and ``ort-rmsnorm verify``'s verdict (its tolerance for
    the logits' dtype)."""
    verdict = verify.compare("logits", reference, other)
    difference = np.abs(reference.astype(np.float64) - other.astype(np.float64))
    return {"max_abs": float(difference.max()), "max_rel": verdict.max_rel, "tolerance": verdict.tolerance,
            "within_tolerance": verdict.ok, "argmax_kept": int(np.sum(reference.argmax(-1) == other.argmax(-1))),
            "positions": len(reference)}


def _matched(first: list[int], second: list[int]) -> int:
    """Tokens equal until the first difference (after it, each generation continues from its own tokens)."""
    for index, (a, b) in enumerate(zip(first, second)):
        if a != b:
            return index
    return min(len(first), len(second))


def run_case(architecture: str, precision: str, hf_folder: Path, work: Path, args) -> dict:
    case = {"architecture": architecture, "precision": precision,
            "builder_options": genai_folders.PRECISIONS[precision]}
    original = genai_folders.build_genai_folder(hf_folder, work / f"{architecture}-{precision}", precision,
                                                work / "builder-cache")
    fused = work / f"{architecture}-{precision}-fused"
    report = folders.fuse_folder(original, fused)
    case["norm_ops"] = {"original": genai_folders.norm_ops(original / "model.onnx"),
                        "fused": genai_folders.norm_ops(fused / "model.onnx")}
    case["fused"] = len(report.models[0].report.fusions)
    case["skipped"] = [dataclasses.asdict(entry) for entry in report.models[0].report.skipped]
    case["config_changes"] = report.config_changes
    for folder in (original, fused):
        with_session_settings(folder, args.threads)
    config = json.loads((original / folders.GENAI_CONFIG).read_text())
    max_length = min(config["model"]["context_length"], args.prompt + args.new_tokens + 8)
    prompt = genai_folders.prompt_tokens(args.prompt, args.config.vocab_size)
    control = _control_folder(original, work / f"{architecture}-{precision}-control")
    case["float32_activations"] = precision in genai_folders.FLOAT32_ACTIVATIONS

    try:
        models = {"original": _genai_model(original), "fused": _genai_model(fused)}
        tokens = {name: timed_generation(model, prompt, args.new_tokens, max_length)[2]
                  for name, model in models.items()}
    except Exception as error:  # genai itself failing on the build (fp16 on CPU): recorded, not raised
        case["error"] = " ".join(str(error).split())
        tokens = None
    # Teacher-forced: the prompt and the original's tokens (or, where genai fails, the prompt twice).
    sequence = prompt + (tokens["original"] if tokens else prompt)
    logits = {name: genai_folders.teacher_forced_logits(folder / "model.onnx", config, sequence)
              for name, folder in (("original", original), ("fused", fused), ("control", control))}
    case["teacher_forced"] = {"fused": _logit_comparison(logits["original"], logits["fused"]),
                              "control_1ulp": _logit_comparison(logits["original"], logits["control"])}
    if tokens is None:
        return case
    case["tokens_matched"] = _matched(tokens["original"], tokens["fused"])
    case["tokens_compared"] = len(tokens["original"])
    case["tokens_identical"] = tokens["original"] == tokens["fused"]
    control_tokens = timed_generation(_genai_model(control), prompt, args.new_tokens, max_length)[2]
    case["control_tokens_matched"] = _matched(tokens["original"], control_tokens)

    speeds = {name: Speed() for name in models}
    for index in runtime.turns(2, args.rounds):
        name = ("original", "fused")[index]
        prefill, decode, _tokens = timed_generation(models[name], prompt, args.new_tokens, max_length)
        speeds[name].prefill_tokens_per_s.append(len(prompt) / prefill)
        speeds[name].decode_tokens_per_s.append(args.new_tokens / decode)
    case["speed"] = {name: {**speed.medians(), "samples": dataclasses.asdict(speed)} for name, speed in speeds.items()}
    case["speedup"] = {phase: case["speed"]["fused"][phase] / case["speed"]["original"][phase]
                       for phase in ("prefill_tokens_per_s", "decode_tokens_per_s")}
    return case


def _verdict(case: dict) -> str:
    """Float32 activations: identical tokens. The default int4 build: logits no further off than the 1-ulp control.
    Otherwise (16-bit): logits within verify's tolerance."""
    teacher = case["teacher_forced"]
    logits = ("logits within tolerance" if teacher["fused"]["within_tolerance"]
              else f"logits OVER tolerance ({teacher['fused']['max_rel']:.2g} > {teacher['fused']['tolerance']:.2g})")
    if "error" in case:
        return f"genai fails; {logits}"
    if case["float32_activations"]:
        return "identical tokens" if case["tokens_identical"] else "TOKENS DIFFER"
    if case["precision"] == "int4":
        ratio = teacher["fused"]["max_abs"] / max(teacher["control_1ulp"]["max_abs"], 1e-30)
        return ("logits within the 1-ulp control" if ratio <= 1
                else f"logits {ratio:.2f} x the 1-ulp control's difference")
    return logits


def _short_error(message: str) -> str:
    """onnxruntime's status message without the source location before it."""
    for marker in (" : FAIL : ", "Status Message: "):
        if marker in message:
            message = message.rsplit(marker, 1)[1]
    return message[:160]


def markdown(result: dict) -> str:
    env = result["environment"]
    lines = [
        f"# onnxruntime-genai end to end ({result['date']})",
        "",
        f"onnxruntime {env['onnxruntime']}, onnxruntime-genai {env['onnxruntime_genai']}, ort-rmsnorm "
        f"{env['ort_rmsnorm']}; {env['cpu']} ({env['cpus']} CPUs); model: hidden {result['model']['hidden_size']}, "
        f"{result['model']['num_hidden_layers']} layers, vocab {result['model']['vocab_size']}; prompt "
        f"{result['prompt_tokens']} tokens, {result['new_tokens']} decoded, {result['rounds']} interleaved rounds"
        + (f", {result['threads']} threads" if result["threads"] else "") + ".",
        "",
        "| model | build | norms before → after | tokens matched | teacher-forced max abs (fused / 1-ulp control) "
        "| prefill tok/s orig → fused | decode tok/s orig → fused | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for case in result["cases"]:
        norms = " → ".join(", ".join(f"{count} {op.split('.')[-1]}" for op, count in sorted(side.items()))
                           for side in (case["norm_ops"]["original"], case["norm_ops"]["fused"]))
        teacher = case["teacher_forced"]
        logits = f"{teacher['fused']['max_abs']:.2g} / {teacher['control_1ulp']['max_abs']:.2g}"
        if "error" in case:
            lines.append(f"| {case['architecture']} | {case['precision']} | {norms} | - | {logits} | - | - | "
                         f"{_verdict(case)}: {_short_error(case['error'])} |")
            continue
        speed = case["speed"]
        lines.append(
            f"| {case['architecture']} | {case['precision']} | {norms} | {case['tokens_matched']}/"
            f"{case['tokens_compared']} (control {case['control_tokens_matched']}) | {logits} | "
            f"{speed['original']['prefill_tokens_per_s']:.0f} → {speed['fused']['prefill_tokens_per_s']:.0f} "
            f"({case['speedup']['prefill_tokens_per_s']:.2f}x) | "
            f"{speed['original']['decode_tokens_per_s']:.0f} → {speed['fused']['decode_tokens_per_s']:.0f} "
            f"({case['speedup']['decode_tokens_per_s']:.2f}x) | {_verdict(case)} |")
    return "\n".join(lines) + "\n"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS,
                        help="folder for genai_e2e.json and genai_e2e.md")
    parser.add_argument("--architectures", default=",".join(genai_folders.ARCHITECTURES))
    parser.add_argument("--precisions", default=",".join(genai_folders.PRECISIONS))
    parser.add_argument("--prompt", type=int, default=64, help="prompt tokens (prefill)")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens generated (decode)")
    parser.add_argument("--rounds", type=int, default=9, help="interleaved timed generations per folder")
    parser.add_argument("--threads", type=int, help="intra-op threads of both decoders (default: onnxruntime's)")
    parser.add_argument("--small", action="store_true", help="the test suite's hidden-64 models (a quick check)")
    parser.add_argument("--keep", type=Path, help="build the folders in this folder and keep them")
    args = parser.parse_args(argv)
    for name in args.architectures.split(","):
        if name not in genai_folders.ARCHITECTURES:
            parser.error(f"--architectures: {name!r} is not one of {', '.join(genai_folders.ARCHITECTURES)}")
    for name in args.precisions.split(","):
        if name not in genai_folders.PRECISIONS:
            parser.error(f"--precisions: {name!r} is not one of {', '.join(genai_folders.PRECISIONS)}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    missing = genai_folders.missing_requirements()
    if missing:
        print(f"genai_e2e: {missing}", file=sys.stderr)
        return 2
    import onnxruntime
    import onnxruntime_genai

    config = args.config = genai_folders.TinyConfig() if args.small else DEFAULT_CONFIG
    args.out.mkdir(parents=True, exist_ok=True)
    work_context = tempfile.TemporaryDirectory(prefix="genai-e2e-") if args.keep is None else None
    work = Path(work_context.name) if work_context else args.keep
    work.mkdir(parents=True, exist_ok=True)
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "environment": {"onnxruntime": onnxruntime.__version__, "onnxruntime_genai": onnxruntime_genai.__version__,
                        "ort_rmsnorm": ort_rmsnorm.__version__, "cpu": platform.processor() or platform.machine(),
                        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
                        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None},
        "model": config.transformers_sizes(),
        "prompt_tokens": args.prompt, "new_tokens": args.new_tokens, "rounds": args.rounds, "threads": args.threads,
        "cases": [],
    }
    try:
        for architecture in args.architectures.split(","):
            hf_folder = genai_folders.make_hf_folder(architecture, work / f"hf-{architecture}", config)
            for precision in args.precisions.split(","):
                print(f"genai_e2e: {architecture} {precision}", file=sys.stderr, flush=True)
                case = run_case(architecture, precision, hf_folder, work, args)
                speedup = case.get("speedup")
                speed = (f"; speed-up prefill {speedup['prefill_tokens_per_s']:.2f}x, decode "
                         f"{speedup['decode_tokens_per_s']:.2f}x" if speedup else "")
                print(f"genai_e2e:   {_verdict(case)}{speed}", file=sys.stderr, flush=True)
                result["cases"].append(case)
    finally:
        if work_context:
            work_context.cleanup()
    write_text_atomically(args.out / "genai_e2e.json", json.dumps(result, indent=2) + "\n")
    write_text_atomically(args.out / "genai_e2e.md", markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
