"""``ort-rmsnorm demo``: build a small Llama-style model, fuse it, verify it and time it before and after.

The model (``ort_rmsnorm.llama``) is exported from torch (``ort_rmsnorm.exporters``) when torch is importable,
otherwise built directly with ``onnx.helper`` in the same spelling. Both models are timed on one
prefill with the same session options, runs interleaved, medians reported.
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

from . import model_io, runtime, verify
from .llama import OPSET, LlamaConfig, build_llama_onnx

BUILDERS = ("auto", "torch", "onnx")


# --- the demo -----------------------------------------------------------------------------------------------------


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
    model_io.save_model(build_llama_onnx(config, dtype), path)
    return f"built with onnx.helper (opset {OPSET}; torch not used)"


@dataclasses.dataclass
class Timing:
    """Wall times in seconds of the interleaved runs of each model."""

    original: list[float]
    fused: list[float]

    @staticmethod
    def describe(samples: list[float]) -> str:
        low, _, high = statistics.quantiles(samples, n=4) if len(samples) > 1 else samples * 3
        return f"{statistics.median(samples) * 1e3:8.2f} ms median (quartiles {low * 1e3:.2f} to {high * 1e3:.2f})"

    @property
    def speedup(self) -> float:
        return statistics.median(self.original) / statistics.median(self.fused)


def time_prefill(original: Path, fused: Path, feeds: dict[str, np.ndarray], runs: int) -> Timing:
    """Wall time of single runs of each model; both sessions have the same options and the runs alternate."""
    sessions = [runtime.make_session(str(path), options=runtime.timing_options()) for path in (original, fused)]
    return Timing(*runtime.time_interleaved(sessions, feeds, runs, warmup=2))


def run_demo(
    config: LlamaConfig = LlamaConfig(),
    *,
    dtype: str = "float32",
    builder: str = "auto",
    sequence: int = 256,
    runs: int = 15,
    directory: Path | None = None,
    log: Callable[[str], None] = print,
) -> int:
    """The demo; returns the exit status (1 when verification fails). Models go to ``directory`` when given."""
    from .fusion import fuse_model  # onnxscript is imported only here

    with tempfile.TemporaryDirectory(prefix="ort-rmsnorm-demo-") as scratch:
        folder = Path(directory) if directory is not None else Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        original, fused = folder / "llama.onnx", folder / "llama.fused.onnx"
        kept = directory is not None
        log(
            f"model: Llama-style, {config.num_layers} decoder layers, hidden {config.hidden_size}, "
            f"{config.num_heads} heads, MLP {config.intermediate_size}, vocab {config.vocab_size}, {dtype}; "
            f"{config.norm_count} RMSNorms"
        )
        start = time.perf_counter()
        how = build_model(original, config, dtype, builder)
        log(f"  {how} in {time.perf_counter() - start:.1f} s" + (f" -> {original}" if kept else ""))

        start = time.perf_counter()
        model = model_io.load_model(original)
        report = fuse_model(model)
        model_io.save_model(model, fused, protected=[original])
        elapsed = time.perf_counter() - start
        log(f"\nfuse: loaded, fused and saved in {elapsed:.1f} s" + (f" -> {fused}" if kept else ""))
        log(report.summary())

        feeds = {"input_ids": verify.make_input("input_ids", (1, sequence), np.dtype(np.int64),
                                                np.random.default_rng(0))}
        result = verify.verify(original, fused, inputs=feeds)
        log("\nverify:")
        log(result.describe())
        if not result.ok:
            return 1

        timing = time_prefill(original, fused, feeds, runs)
        log(
            f"\nprefill of {sequence} tokens (batch 1), {runs} interleaved runs of each model, same session options "
            "(onnxruntime optimizations on, default threads):"
        )
        log(f"  original {Timing.describe(timing.original)}")
        log(f"  fused    {Timing.describe(timing.fused)}")
        log(f"  original / fused: {timing.speedup:.2f}")
        log(
            "  Only the norms differ between the two models; the matrix products and attention, most of the time,\n"
            "  are the same. `ort-rmsnorm bench` times the norm kernels alone."
        )
    return 0
