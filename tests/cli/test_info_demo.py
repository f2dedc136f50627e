"""`ort-rmsnorm info` and `ort-rmsnorm demo`."""

from __future__ import annotations

import re
import time

import onnx
import onnxruntime
import pytest

import ort_rmsnorm


def test_info(cli):
    result = cli("info")
    assert result.returncode == 0, result
    assert f"library: {ort_rmsnorm.get_library_path()}" in result.stdout
    assert f"onnxruntime {onnxruntime.__version__}" in result.stdout
    assert f"ort_api_version: {ort_rmsnorm.build_info()['ort_api_version']}" in result.stdout


def test_info_with_a_missing_library_is_a_clear_error(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("ORT_RMSNORM_LIBRARY", str(tmp_path / "absent.so"))
    result = cli("info")
    assert result.returncode == 2, result
    expected = f"ort-rmsnorm info: error: ORT_RMSNORM_LIBRARY={tmp_path / 'absent.so'}: no such file"
    assert result.stderr.strip().splitlines() == [expected]


def _timings(stdout: str) -> tuple[float, float]:
    original = float(re.search(r"original\s+([\d.]+) ms", stdout).group(1))
    fused = float(re.search(r"fused\s+([\d.]+) ms", stdout).group(1))
    return original, fused


def test_demo_without_torch(cli, tmp_path):
    """The onnx.helper builder: a small model, fused, verified and timed; the models are kept with --keep."""
    result = cli("demo", "--builder", "onnx", "--layers", "2", "--hidden", "64", "--sequence", "16", "--runs", "3",
                 "--keep", tmp_path)
    assert result.returncode == 0, result
    assert "built with onnx.helper" in result.stdout
    assert "RMSNorm fusion (target custom): 5 fused" in result.stdout
    assert "verify: all of 1 outputs match" in result.stdout
    assert all(value > 0 for value in _timings(result.stdout))
    assert (tmp_path / "llama.onnx").is_file() and (tmp_path / "llama.fused.onnx").is_file()
    # The oldest IR version its opset allows, not onnx's newest: onnxruntime 1.20 reads IR 10 at most.
    for name in ("llama.onnx", "llama.fused.onnx"):
        model = onnx.load(tmp_path / name, load_external_data=False)
        default = [opset for opset in model.opset_import if opset.domain == ""]
        assert model.ir_version == onnx.helper.find_min_ir_version_for(default) <= 10, name


def test_demo_usage_errors(cli, tmp_path):
    result = cli("demo", "--hidden", "60")
    assert result.returncode == 2 and "--hidden must be a multiple of the 8 attention heads" in result.stderr
    assert cli("demo", "--layers", "0").returncode == 2
    (tmp_path / "file").write_text("")
    models = tmp_path / "file" / "models"
    result = cli("demo", "--keep", models)
    assert (result.returncode, result.stderr) == (
        2, f"ort-rmsnorm demo: error: --keep: cannot make the directory {models}: Not a directory\n"
    )


@pytest.mark.slow
@pytest.mark.torch
def test_default_demo_runs_in_under_a_minute(cli):
    """About 25 s on 2 idle cores (most of it the torch export); the bound leaves room for a busy machine."""
    pytest.importorskip("torch")
    start = time.perf_counter()
    result = cli("demo")
    elapsed = time.perf_counter() - start
    assert result.returncode == 0, result
    assert "exported from torch with the dynamo exporter" in result.stdout
    assert "RMSNorm fusion (target custom): 9 fused, 0 skipped" in result.stdout
    assert "verify: all of 1 outputs match" in result.stdout
    assert all(value > 0 for value in _timings(result.stdout))
    assert elapsed < 60, f"demo took {elapsed:.0f} s"
