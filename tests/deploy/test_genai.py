"""The onnxruntime-genai round trip: tiny random-weight Hugging Face folders built with genai's model builder, fused
as folders, and generated from greedily with onnxruntime_genai before and after.

Builds with float32 activations must generate the very same tokens; the fused folder must load our library from
inside itself, whatever the working directory. Skipped, with the reason, without onnxruntime-genai (or the torch
and transformers its builder needs). benchmarks/genai_e2e.py runs every architecture and precision, and times them.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

import ort_rmsnorm
from deploy.conftest import run_cli, tree_digest
from ort_rmsnorm.builders.genai import generate, norm_ops, prompt_tokens

NEW_TOKENS = 12
# (architecture, precision): one of each norm layout (Llama; Qwen3's q/k norms; Gemma 2's four norms per layer) with
# float32 activations.
ROUND_TRIPS = [("llama", "fp32"), ("qwen3", "int4-acc1"), ("gemma2", "fp32")]


@pytest.mark.parametrize("architecture, precision", ROUND_TRIPS)
def test_fused_folder_generates_the_same_tokens(genai_builds, architecture, precision, tmp_path):
    original = genai_builds.folder(architecture, precision)
    before = tree_digest(original)
    fused = tmp_path / "fused"
    result = run_cli("fuse", original, fused)
    assert result.returncode == 0, result.stderr
    assert tree_digest(original) == before

    # The builder's norms: SimplifiedLayerNormalization first (and for Qwen3's q/k norms, Gemma 2's post-norms),
    # com.microsoft.SkipSimplifiedLayerNormalization after each residual add. Every SimplifiedLayerNormalization is
    # converted.
    norms = norm_ops(original / "model.onnx")
    assert norms.get("SimplifiedLayerNormalization", 0) >= 1, norms
    assert norms.get("com.microsoft.SkipSimplifiedLayerNormalization", 0) >= 1, norms
    after = norm_ops(fused / "model.onnx")
    assert "SimplifiedLayerNormalization" not in after, after
    converted = after.get("ort_rmsnorm.RMSNorm", 0) + after.get("ort_rmsnorm.SkipRMSNorm", 0)
    assert converted >= norms["SimplifiedLayerNormalization"], after

    library = ort_rmsnorm.get_library_path().rsplit("/", 1)[-1]
    config = json.loads((fused / "genai_config.json").read_text())
    assert config["model"]["decoder"]["session_options"]["custom_ops_library"] == library

    prompt = prompt_tokens(8)
    expected = generate(original, prompt, NEW_TOKENS)
    assert len(expected) == NEW_TOKENS
    assert generate(fused, prompt, NEW_TOKENS) == expected

    verified = run_cli("verify", original, fused)
    assert verified.returncode == 0, verified.stdout + verified.stderr



@pytest.mark.parametrize("architecture, precision", ROUND_TRIPS[:2])
def test_onnx_target_converts_the_builders_folders(genai_builds, architecture, precision, tmp_path):
    """`--target onnx --convert-opset`: onnx's version converter has no schema for the builder's default-domain
    SimplifiedLayerNormalization; the model is converted with those set aside, each becomes RMSNormalization, the
    skip ops and the contrib ops (MatMulNBits, GroupQueryAttention) stay, and genai generates the same tokens."""
    original = genai_builds.folder(architecture, precision)
    fused = tmp_path / "fused"
    result = run_cli("fuse", original, fused, "--target", "onnx", "--convert-opset", "--verify")
    assert result.returncode == 0, result.stdout + result.stderr
    norms, after = norm_ops(original / "model.onnx"), norm_ops(fused / "model.onnx")
    assert after == {"RMSNormalization": norms["SimplifiedLayerNormalization"],
                     "com.microsoft.SkipSimplifiedLayerNormalization":
                         norms["com.microsoft.SkipSimplifiedLayerNormalization"]}, after
    assert "set aside while it converted the model, then restored unchanged" in result.stdout
    prompt = prompt_tokens(8)
    assert generate(fused, prompt, NEW_TOKENS) == generate(original, prompt, NEW_TOKENS)

def test_library_outside_the_folder_is_refused(genai_builds, tmp_path):
    """Why the library is copied: onnxruntime-genai refuses a custom_ops_library outside the model folder (and
    outside the current directory and the execution providers' folders)."""
    og = pytest.importorskip("onnxruntime_genai")
    fused = tmp_path / "fused"
    assert run_cli("fuse", genai_builds.folder("llama", "fp32"), fused).returncode == 0
    config = json.loads((fused / "genai_config.json").read_text())
    config["model"]["decoder"]["session_options"]["custom_ops_library"] = ort_rmsnorm.get_library_path()
    (fused / "genai_config.json").write_text(json.dumps(config))
    with pytest.raises(Exception, match="not within an allowed directory"):
        og.Model(str(fused))


def test_benchmark_runs(genai_builds, tmp_path, monkeypatch):
    """benchmarks/genai_e2e.py end to end in its smallest form (what it measures is not checked here)."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "genai_e2e.py"
    spec = importlib.util.spec_from_file_location("genai_e2e", path)
    benchmark = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, benchmark)  # its dataclasses look their module up there
    spec.loader.exec_module(benchmark)
    status = benchmark.main(["--small", "--architectures", "llama", "--precisions", "fp32,fp16-cpu", "--rounds", "1",
                             "--prompt", "8", "--new-tokens", "4", "--out", str(tmp_path / "out")])
    assert status == 0
    result = json.loads((tmp_path / "out" / "genai_e2e.json").read_text())
    fp32, fp16 = result["cases"]
    assert fp32["tokens_identical"] and fp32["teacher_forced"]["fused"]["within_tolerance"]
    assert set(fp32["speedup"]) == {"prefill_tokens_per_s", "decode_tokens_per_s"}
    assert fp16["teacher_forced"]["fused"]["within_tolerance"]  # whether genai runs it or not
    assert "| llama | fp32 |" in (tmp_path / "out" / "genai_e2e.md").read_text()
