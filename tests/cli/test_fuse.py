"""`ort-rmsnorm fuse` end to end: output model, summary, JSON report, --verify, targets, atomic writes."""

from __future__ import annotations

import json
import os
import stat
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from ort_rmsnorm.model import write as model_write
from ort_rmsnorm.model.read import ModelFileError, load_model
from ort_rmsnorm.model.write import save_model
from ort_rmsnorm.runtime import make_session, run
from op_models import make_model, skip_unless_runtime_runs

FUSED_OPS = {"RMSNorm", "SkipRMSNorm"}


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def _op_counts(path: Path) -> Counter:
    return Counter(node.op_type for node in onnx.load(path, load_external_data=False).graph.node)


def test_fuse_writes_model_summary_and_report(cli, digest, small_llama, small_llama_config, tmp_path):
    before = digest(small_llama)
    out, report_path = tmp_path / "fused.onnx", tmp_path / "report.json"
    result = cli("fuse", small_llama, out, "--report", report_path)
    assert result.returncode == 0, result
    assert digest(small_llama) == before

    norms = small_llama_config.norm_count
    skips = small_llama_config.norms_after_residual_add
    counts = _op_counts(out)
    assert counts["SkipRMSNorm"] == skips and counts["RMSNorm"] == norms - skips
    assert counts["Pow"] == counts["Sqrt"] == counts["ReduceMean"] == counts["Reciprocal"] == 0
    onnx.checker.check_model(out)

    report = json.loads(report_path.read_text())
    assert report["target"] == "custom"
    assert len(report["fusions"]) == norms and report["skipped"] == []
    for fusion in report["fusions"]:
        assert fusion["location"] == "main graph"
        assert fusion["axis"] == -1
        assert fusion["epsilon"] == pytest.approx(small_llama_config.rms_norm_eps, rel=1e-6)
        assert fusion["eps_placement"] == "inside_sqrt"
        assert fusion["input_dtype"] == "float32" and fusion["scale_dtype"] == "float32"
        assert fusion["replaced_nodes"] and fusion["node"]
    assert sum(fusion["skip"] for fusion in report["fusions"]) == skips
    # Both files with the permissions of any new file (the report was 0600: the temporary file's).
    assert stat.S_IMODE(report_path.stat().st_mode) == stat.S_IMODE(out.stat().st_mode) == 0o666 & ~_umask()

    assert f"RMSNorm fusion (target custom): {norms} fused, 0 skipped" in result.stdout
    assert f"wrote {out}, report {report_path}" in result.stdout
    for stage in ("loading", "fusing", "writing", "done"):
        assert stage in result.stderr  # progress lines


def test_fused_model_matches_the_original(small_llama, tmp_path):
    """Independent of `verify`: both models run here with optimizations disabled, compared in float64."""
    out = tmp_path / "fused.onnx"
    from ort_rmsnorm.cli import main

    assert main(["fuse", str(small_llama), str(out), "--quiet"]) == 0
    ids = np.random.default_rng(0).integers(1, 100, size=(3, 11))
    disabled = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    (want,) = run(make_session(str(small_llama), optimization=disabled), {"input_ids": ids})
    (got,) = run(make_session(str(out), optimization=disabled), {"input_ids": ids})
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-5,
                               atol=1e-5 * np.abs(want).max())


def test_fuse_verify(cli, small_llama, tmp_path):
    result = cli("fuse", small_llama, tmp_path / "fused.onnx", "--verify", "--dim", "sequence=7", "--quiet")
    assert result.returncode == 0, result
    assert "inputs: input_ids int64 [2, 7]" in result.stdout
    assert "output 'logits' float32 [2, 7, 128]" in result.stdout
    assert "verify: all of 1 outputs match" in result.stdout


def test_fuse_verify_bad_input_file_fails_before_fusing(cli, small_llama, tmp_path):
    result = cli("fuse", small_llama, tmp_path / "fused.onnx", "--verify", "--input", "input_ids=missing.npy")
    assert result.returncode == 2 and "missing.npy: no such file" in result.stderr, result
    assert not (tmp_path / "fused.onnx").exists()


@pytest.mark.parametrize("target, ops", [("ort", {"SimplifiedLayerNormalization"}),
                                         ("onnx", {"RMSNormalization"})])
def test_fuse_other_targets(cli, small_llama, small_llama_config, tmp_path, target, ops):
    skip_unless_runtime_runs(target)  # --verify runs the output
    out = tmp_path / "fused.onnx"
    arguments = ["--convert-opset"] if target == "onnx" else []
    result = cli("fuse", small_llama, out, "--target", target, *arguments, "--verify", "--quiet")
    assert result.returncode == 0, result
    counts = _op_counts(out)
    assert sum(counts[op] for op in ops | {"SkipSimplifiedLayerNormalization"}) == small_llama_config.norm_count
    assert not FUSED_OPS & set(counts)
    if target == "ort":  # runs without our library
        session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
        session.run(None, {"input_ids": np.ones((1, 3), np.int64)})


def test_fused_model_with_unnamed_dims_loads_and_matches(cli, tmp_path):
    """A norm whose input dims are unknown and unnamed (no shape annotations), its output's shape feeding a Reshape
    (as attention code does): the fused model must load in onnxruntime and match."""
    from onnx import TensorProto, helper, numpy_helper

    constants = {"two": np.float32(2), "eps": np.float32(1e-5), "axes": np.array([-1], np.int64),
                 "zero": np.array([0], np.int64), **{f"i{k}": np.array(k, np.int64) for k in range(3)}}
    nodes = [
        helper.make_node("Relu", ["x0"], ["x"]),
        helper.make_node("Pow", ["x", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "axes"], ["ms"]),
        helper.make_node("Add", ["ms", "eps"], ["shifted"]),
        helper.make_node("Sqrt", ["shifted"], ["rms"]),
        helper.make_node("Div", ["x", "rms"], ["y"]),
        helper.make_node("Shape", ["y"], ["shape"]),
        *[helper.make_node("Gather", ["shape", f"i{k}"], [f"d{k}"], axis=0) for k in range(3)],
        *[helper.make_node("Unsqueeze", [f"d{k}", "zero"], [f"u{k}"]) for k in range(3)],
        helper.make_node("Concat", ["u0", "u1", "u2"], ["target"], axis=0),
        helper.make_node("Reshape", ["y", "target"], ["z"]),
    ]
    graph = helper.make_graph(nodes, "unnamed_dims",
                              [helper.make_tensor_value_info("x0", TensorProto.FLOAT, [None, None, 8])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [None, None, 8])],
                              [numpy_helper.from_array(value, name) for name, value in constants.items()])
    model = tmp_path / "unnamed.onnx"
    onnx.save(make_model(graph, [helper.make_opsetid("", 18)]), model)
    result = cli("fuse", model, tmp_path / "fused.onnx", "--verify", "--quiet")
    assert "1 fused" in result.stdout, result
    assert result.returncode == 0, result


def test_fuse_replaces_an_existing_output_atomically(cli, small_llama, tmp_path):
    out = tmp_path / "fused.onnx"
    out.write_bytes(b"previous content")
    assert cli("fuse", small_llama, out, "--quiet").returncode == 0
    load_model(out)
    assert sorted(entry.name for entry in tmp_path.iterdir()) == ["fused.onnx", "model.onnx"]


def test_failed_save_leaves_no_partial_output(small_llama, tmp_path, monkeypatch):
    """A failure half-way (here: the final rename of the model file) removes everything written so far."""
    model = load_model(small_llama)
    before = {entry.name for entry in tmp_path.iterdir()}
    real_replace = model_write.os.replace

    def failing_replace(source, destination):
        if str(destination).endswith(".onnx"):
            raise OSError(28, "No space left on device")
        return real_replace(source, destination)

    monkeypatch.setattr(model_write.os, "replace", failing_replace)
    with pytest.raises(ModelFileError, match="No space left on device"):
        save_model(model, tmp_path / "out.onnx", external_data=True, protected=[small_llama])
    assert {entry.name for entry in tmp_path.iterdir()} == before


def test_failed_write_leaves_no_partial_output(small_llama, tmp_path, monkeypatch):
    model = load_model(small_llama)
    before = {entry.name for entry in tmp_path.iterdir()}

    def failing_save(model, path, **options):
        Path(path).write_bytes(b"partial")
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(model_write.ir, "save", failing_save)
    with pytest.raises(ModelFileError, match="Input/output error"):
        save_model(model, tmp_path / "out.onnx")
    assert {entry.name for entry in tmp_path.iterdir()} == before
