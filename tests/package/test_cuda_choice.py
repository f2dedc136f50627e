"""ORT_RMSNORM_CUDA=AUTO's look at the Python environment a package build installs into (cmake/onnxruntime_cuda.py):
the CUDA kernels are built only when that environment's onnxruntime can run them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = Path(__file__).resolve().parents[2] / "cmake" / "onnxruntime_cuda.py"


def _probe(tmp_path: Path, provider_files: list[str] | None) -> str:
    """The probe's answer with a stand-in onnxruntime package (None: no package) first on the path."""
    if not PROBE.is_file():
        pytest.skip(f"no source tree next to the tests ({PROBE} is absent)")
    site = tmp_path / "site"
    if provider_files is not None:
        capi = site / "onnxruntime" / "capi"
        capi.mkdir(parents=True)
        (site / "onnxruntime" / "__init__.py").write_text("raise ImportError('the probe must not import me')\n")
        for name in provider_files:
            (capi / name).write_bytes(b"")
    site.mkdir(exist_ok=True)
    # Without -I (CMake passes it to see past pip's build isolation): here PYTHONPATH puts the stand-in first, and
    # -S keeps the real site-packages, with the real onnxruntime, out.
    env = {**os.environ, "PYTHONPATH": str(site)}
    completed = subprocess.run([sys.executable, "-S", str(PROBE)], capture_output=True, text=True, env=env,
                               timeout=60)
    assert completed.returncode == 0, completed.stderr
    return completed.stdout.strip()


def test_onnxruntime_gpu(tmp_path):
    answer = _probe(tmp_path, ["onnxruntime_pybind11_state.so", "libonnxruntime_providers_cuda.so",
                               "libonnxruntime_providers_shared.so"])
    assert answer == f"cuda {tmp_path / 'site' / 'onnxruntime'}"


def test_onnxruntime_without_the_cuda_provider(tmp_path):
    answer = _probe(tmp_path, ["onnxruntime_pybind11_state.so", "libonnxruntime_providers_shared.so"])
    assert answer == f"cpu {tmp_path / 'site' / 'onnxruntime'}"


def test_no_onnxruntime(tmp_path):
    assert _probe(tmp_path, None) == "none"
