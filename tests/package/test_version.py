"""One version number: pyproject.toml's [project] version, seen the same by the installed package's metadata, the
library's build_info.json (written by CMake), `ort-rmsnorm info`, and CMake's own reading of pyproject.toml."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import ort_rmsnorm

# The checkout these tests come from, when they run from one (scripts/test-wheel runs a copy of them elsewhere).
SOURCE_ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = SOURCE_ROOT / "pyproject.toml"


def _info(library: Path | None = None) -> str:
    """stdout of `ort-rmsnorm info`, with the package's own library or with $ORT_RMSNORM_LIBRARY=library."""
    env = {key: value for key, value in os.environ.items() if key != "ORT_RMSNORM_LIBRARY"}
    if library is not None:
        env["ORT_RMSNORM_LIBRARY"] = str(library)
    result = subprocess.run([sys.executable, "-m", "ort_rmsnorm.cli", "info"], env=env, capture_output=True,
                            text=True)
    assert result.returncode == 0, result
    return result.stdout


def _pyproject_version() -> str:
    if not PYPROJECT.is_file():
        pytest.skip(f"no source tree next to the tests ({PYPROJECT} is absent)")
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        tomllib = pytest.importorskip("tomli")
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    assert project["name"] == "ort-rmsnorm"
    return project["version"]


def test_package_version_is_the_distribution_metadata():
    assert ort_rmsnorm.__version__ == importlib.metadata.version("ort-rmsnorm")
    assert ort_rmsnorm.__version__[0].isdigit()


def test_library_was_built_as_the_package_version(monkeypatch):
    monkeypatch.delenv("ORT_RMSNORM_LIBRARY", raising=False)
    ort_rmsnorm.build_info.cache_clear()
    try:
        assert ort_rmsnorm.build_info()["version"] == ort_rmsnorm.__version__
    finally:
        ort_rmsnorm.build_info.cache_clear()


def test_info_reports_the_one_version():
    lines = _info().splitlines()
    assert lines[0] == f"ort-rmsnorm {ort_rmsnorm.__version__}"
    assert f"  version: {ort_rmsnorm.__version__}" in lines
    assert not any("built as version" in line for line in lines)


def test_info_names_a_library_of_another_version(tmp_path):
    library = tmp_path / Path(ort_rmsnorm.get_library_path()).name
    shutil.copyfile(ort_rmsnorm.get_library_path(), library)
    (tmp_path / "build_info.json").write_text(json.dumps({"version": "0.0.1", "cuda": False}))
    stdout = _info(library)
    assert f"(this library was built as version 0.0.1, not the package's {ort_rmsnorm.__version__})" in stdout


def test_installed_version_is_pyproject_version():
    assert ort_rmsnorm.__version__ == _pyproject_version()


def _cmake_script() -> list[str]:
    """The command that runs cmake/version.cmake as a script; skips without cmake or the source tree."""
    cmake, script = shutil.which("cmake"), SOURCE_ROOT / "cmake" / "version.cmake"
    if cmake is None or not script.is_file():
        pytest.skip("needs cmake on PATH and the source tree's cmake/version.cmake")
    return [cmake, "-P", str(script)]


def test_cmake_reads_pyproject_version():
    """The standalone CMake build (no scikit-build) reads the version from pyproject.toml by itself."""
    expected = _pyproject_version()
    command = _cmake_script()
    result = subprocess.run(command[:1] + [f"-DPYPROJECT={PYPROJECT}"] + command[1:], capture_output=True, text=True)
    assert result.returncode == 0, result
    assert result.stdout.strip() == expected


def test_cmake_names_a_pyproject_without_version(tmp_path):
    command = _cmake_script()
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[tool.other]\nversion = "9.9"\n\n[project]\nname = "ort-rmsnorm"\n')
    result = subprocess.run(command[:1] + [f"-DPYPROJECT={pyproject}"] + command[1:], capture_output=True, text=True)
    assert result.returncode != 0
    message = " ".join(result.stderr.split())  # CMake wraps its messages
    assert f"no `version = \"...\"` in the [project] table of {pyproject}" in message
