"""Fixtures for the command-line tests: running ``ort-rmsnorm`` in a subprocess, small models to work on."""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ort_rmsnorm.model.write import save_model
from ort_rmsnorm.builders.llama import LlamaConfig, build_llama_onnx

# Two decoder layers: 5 RMSNorms, 4 of them right after a residual add.
SMALL_LLAMA = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4)


@dataclasses.dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def run_cli(*args, cwd: Path | None = None, timeout: float = 300) -> CliResult:
    completed = subprocess.run(
        [sys.executable, "-m", "ort_rmsnorm.cli", *map(str, args)],
        capture_output=True, text=True, cwd=cwd, timeout=timeout,
    )
    return CliResult(completed.returncode, completed.stdout, completed.stderr)


@pytest.fixture(scope="session")
def cli():
    """``cli(*args)`` runs ``python -m ort_rmsnorm.cli *args`` and returns its exit status, stdout and stderr."""
    return run_cli


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@pytest.fixture(scope="session")
def digest():
    """``digest(path)``: sha256 of a file, to show that inputs are left untouched."""
    return sha256


@pytest.fixture(scope="session")
def small_llama_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("small_llama") / "llama.onnx"
    save_model(build_llama_onnx(SMALL_LLAMA), path)
    return path


@pytest.fixture
def small_llama(small_llama_file, tmp_path) -> Path:
    """A private copy of a 2-layer Llama-style model (``input_ids`` -> ``logits``) in the test's directory."""
    return Path(shutil.copy(small_llama_file, tmp_path / "model.onnx"))


@pytest.fixture(scope="session")
def small_llama_config() -> LlamaConfig:
    return SMALL_LLAMA


def one_line_error(result, *fragments: str) -> str:
    """The one line a refused command writes on stderr (exit 2, no traceback), holding every fragment."""
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]
