"""The command line's cheap paths: ``--version``, ``--help``, and checks of the arguments that fail before any model
is loaded."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

import ort_rmsnorm

_IMPORTED_BY = """
import sys
from ort_rmsnorm.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
heavy = sorted(name for name in ("numpy", "onnx", "onnxruntime", "onnx_ir", "onnxscript", "sympy", "ml_dtypes",
                                 "torch") if name in sys.modules)
print("imported:", *heavy)
"""


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["fuse", "--help"], ["verify", "--help"],
                                  ["info", "--help"]])
def test_help_and_version_import_no_heavy_module(args, tmp_path):
    """`--help` imported onnx_ir, sympy and ml_dtypes through verify (2.5 s of CPU on a loaded 2-core machine)."""
    completed = subprocess.run([sys.executable, "-c", _IMPORTED_BY, *args], capture_output=True, text=True,
                               cwd=tmp_path, timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.splitlines()[-1] == "imported:", completed.stdout


def test_importing_the_package_leaves_the_import_machinery_alone(tmp_path):
    """`import ort_rmsnorm` puts no finder on sys.meta_path (other packages' imports stay theirs) and imports neither
    onnx nor onnxruntime."""
    code = ("import sys; finders = list(sys.meta_path); import ort_rmsnorm; "
            "print(sys.meta_path == finders, 'onnx' in sys.modules, 'onnxruntime' in sys.modules)")
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.split() == ["True", "False", "False"]


def test_version(cli):
    result = cli("--version")
    assert result.returncode == 0, result
    assert result.stdout == f"ort-rmsnorm {ort_rmsnorm.__version__}\n"
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", ort_rmsnorm.__version__)


def test_help_lists_every_command(cli):
    result = cli("--help")
    assert result.returncode == 0, result
    for command in ("fuse", "verify", "demo", "bench", "info"):
        assert re.search(rf"^ +{command} +\S", result.stdout, re.M), result.stdout
    assert "--version" in result.stdout


def test_each_command_still_parses_its_own_options(cli):
    """Only the named subcommand gets its arguments: its options and their errors are all there."""
    result = cli("fuse", "in.onnx", "out.onnx", "--optimization", "none", "--verify")
    assert result.returncode == 2, result
    assert "argument --optimization: invalid choice: 'none'" in result.stderr
    result = cli("verify", "--help")
    assert "--optimization {disabled,basic,extended,all}" in result.stdout


def test_missing_output_directory_is_reported_before_loading(cli, small_llama, tmp_path):
    """Reported as the arguments are read: no progress line of loading the model comes first."""
    result = cli("fuse", small_llama, tmp_path / "absent" / "out.onnx")
    assert result.returncode == 2, result
    assert result.stderr.splitlines() == [
        f"ort-rmsnorm fuse: error: argument OUT: {tmp_path / 'absent' / 'out.onnx'}: the directory "
        f"{tmp_path / 'absent'} does not exist (see ort-rmsnorm fuse --help)"]
    result = cli("fuse", small_llama, tmp_path / "out.onnx", "--report", tmp_path / "absent" / "report.json")
    assert result.returncode == 2 and "argument --report:" in result.stderr and "loading" not in result.stderr


def test_missing_parent_of_an_output_folder_is_reported_before_reading(cli, small_llama, tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(small_llama.read_bytes())
    result = cli("fuse", folder, tmp_path / "absent" / "fused")
    assert result.returncode == 2, result
    assert len(result.stderr.splitlines()) == 1 and "the directory" in result.stderr


def test_folder_verification_keeps_the_command_clock(cli, small_llama, tmp_path):
    """`fuse FOLDER OUT --verify`: the verification's progress lines go on counting from the command's start."""
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(small_llama.read_bytes())
    result = cli("fuse", folder, tmp_path / "fused", "--verify")
    assert result.returncode == 0, result
    times = [float(match) for match in re.findall(r"^\[ *([\d.]+)s\]", result.stderr, re.M)]
    assert len(times) >= 4, result.stderr
    assert times == sorted(times) and times[-1] > 0, result.stderr
