"""The package's face for tools and their users: ``python -m ort_rmsnorm``, ``dir(ort_rmsnorm)`` with the names loaded
on first use, and command-line messages that name command-line flags, not the API's options."""

from __future__ import annotations

import json
import subprocess
import sys

import ort_rmsnorm
from ort_rmsnorm import command_line
from ort_rmsnorm.model.write import save_model
from tools.tool_models import CONFIG


def test_python_m_runs_the_command_line(tmp_path):
    completed = subprocess.run([sys.executable, "-m", "ort_rmsnorm", "--help"], capture_output=True, text=True,
                               cwd=tmp_path, timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.startswith("usage: ort-rmsnorm")
    for command in ("fuse", "verify", "demo", "bench", "info", "tool"):
        assert command in completed.stdout
    bad = subprocess.run([sys.executable, "-m", "ort_rmsnorm", "nonsense"], capture_output=True, text=True,
                         cwd=tmp_path, timeout=120)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


def test_dir_lists_the_names_loaded_on_first_use():
    names = dir(ort_rmsnorm)
    for name in ("fuse", "fuse_folder", "verify_folder", "everywhere", "infer_symbolic_shapes", "add_symbolic_handlers",
                 "register", "register_schemas", "session_options", "__version__"):
        assert name in names, name
    for name in ort_rmsnorm.__all__:
        assert callable(getattr(ort_rmsnorm, name)) or name.startswith("OP_"), name


def test_for_cli_names_the_flag():
    api = "RMSNormalization needs opset 23 (fuse with allow_opset_upgrade=True to convert the model)"
    assert command_line.for_cli(api) == "RMSNormalization needs opset 23 (fuse with --convert-opset to convert the model)"


def test_fuse_target_onnx_below_opset_23_tells_the_cli_flag(tmp_path):
    from ort_rmsnorm.builders.llama import build_llama_onnx

    source, output, report_path = tmp_path / "llama.onnx", tmp_path / "out.onnx", tmp_path / "report.json"
    save_model(build_llama_onnx(CONFIG), source)  # opset 18
    _, api_report = ort_rmsnorm.fuse(source, "onnx")
    assert any("allow_opset_upgrade=True" in entry.reason for entry in api_report.skipped)  # the API's words
    completed = subprocess.run([sys.executable, "-m", "ort_rmsnorm", "fuse", source, output, "--target", "onnx",
                                "--report", report_path, "--quiet"], capture_output=True, text=True, cwd=tmp_path,
                               timeout=300)
    assert completed.returncode == 0, completed.stderr
    assert "fuse with --convert-opset to convert the model" in completed.stdout
    assert "allow_opset_upgrade" not in completed.stdout + completed.stderr
    reasons = [entry["reason"] for entry in json.loads(report_path.read_text())["skipped"]]
    assert reasons and all("--convert-opset" in reason and "allow_opset_upgrade" not in reason for reason in reasons)
