"""Fixtures for the deployment tests: model folders, built once per test session."""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ort_rmsnorm.builders import genai

from deploy import genai_folders


@dataclasses.dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def run_cli(*args, cwd: Path | None = None, timeout: float = 600) -> CliResult:
    """``python -m ort_rmsnorm.cli *args`` in a subprocess (from the session's empty working directory)."""
    completed = subprocess.run([sys.executable, "-m", "ort_rmsnorm.cli", *map(str, args)], capture_output=True,
                               text=True, cwd=cwd, timeout=timeout)
    return CliResult(completed.returncode, completed.stdout, completed.stderr)


def tree_digest(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` by relative path: shows that a folder was left untouched."""
    return {path.relative_to(root).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(root.rglob("*")) if path.is_file()}


@pytest.fixture(scope="session")
def _onnx_genai_folder(tmp_path_factory) -> Path:
    return genai_folders.write_onnx_genai_folder(tmp_path_factory.mktemp("onnx_genai") / "model")


@pytest.fixture
def onnx_genai_folder(_onnx_genai_folder, tmp_path) -> Path:
    """A private copy of a genai-layout folder made with onnx.helper (see genai_folders.write_onnx_genai_folder)."""
    return Path(shutil.copytree(_onnx_genai_folder, tmp_path / "in"))


@pytest.fixture(scope="session")
def _onnx_folder(tmp_path_factory) -> Path:
    return genai_folders.write_onnx_folder(tmp_path_factory.mktemp("onnx_folder") / "model")


@pytest.fixture
def onnx_folder(_onnx_folder, tmp_path) -> Path:
    """A private copy of an optimum-style folder of .onnx models."""
    return Path(shutil.copytree(_onnx_folder, tmp_path / "in"))


class GenaiBuilds:
    """Hugging Face folders and the genai folders built from them, each made once per session on first use."""

    def __init__(self, root: Path):
        self.root = root
        self._hf: dict[str, Path] = {}
        self._built: dict[tuple[str, str], Path] = {}

    def hf(self, architecture: str) -> Path:
        if architecture not in self._hf:
            self._hf[architecture] = genai.make_hf_folder(architecture, self.root / f"hf-{architecture}")
        return self._hf[architecture]

    def folder(self, architecture: str, precision: str) -> Path:
        key = (architecture, precision)
        if key not in self._built:
            self._built[key] = genai.build_genai_folder(self.hf(architecture),
                                                          self.root / f"{architecture}-{precision}", precision,
                                                          self.root / "builder-cache")
        return self._built[key]


@pytest.fixture(scope="session")
def genai_builds(tmp_path_factory) -> GenaiBuilds:
    """Skips without onnxruntime-genai (or the torch/transformers its builder needs), saying which is missing."""
    missing = genai.missing_requirements()
    if missing:
        pytest.skip(f"the onnxruntime-genai round trip needs it: {missing}")
    return GenaiBuilds(tmp_path_factory.mktemp("genai"))
