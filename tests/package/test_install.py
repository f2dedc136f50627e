"""What installing the package leaves to the user, and what it says when the environment is not what it needs:
no onnxruntime distribution is required (the user's own, onnxruntime-gpu say, is kept; the `cpu` extra brings
onnxruntime into an environment that has none), a missing onnxruntime is named with both ways to install one, and a
source tree imported in place of the installed package is named as such."""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path


# onnxruntime's builds, each a distribution installing the same `onnxruntime` module.
_ONNXRUNTIME = re.compile(r"onnxruntime(-(gpu|directml|openvino|qnn|training|rocm|migraphx|cann))?", re.I)

# Makes `import onnxruntime` fail as it does where no distribution is installed (ModuleNotFoundError, name set).
_WITHOUT_ONNXRUNTIME = "import sys; sys.modules['onnxruntime'] = None; "


def _requirement_name(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9._-]+", requirement).group(0)


def test_no_onnxruntime_distribution_is_required():
    """The installed metadata (the wheel's Requires-Dist) names onnxruntime only under an extra: installing the
    package never installs onnxruntime beside (over) another build of it."""
    requirements = importlib.metadata.requires("ort-rmsnorm") or []
    unconditional = [requirement for requirement in requirements
                     if _ONNXRUNTIME.fullmatch(_requirement_name(requirement)) and "extra ==" not in requirement]
    assert not unconditional, requirements
    cpu = [requirement for requirement in requirements if re.search(r"""extra == ["']cpu["']""", requirement)]
    assert [_requirement_name(requirement) for requirement in cpu] == ["onnxruntime"], requirements
    assert ">=" in cpu[0], cpu  # the oldest release tested, which scripts/test-min-deps installs


def _run(code: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != "ORT_RMSNORM_LIBRARY"}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def _names_both_installs(line: str) -> None:
    assert "no onnxruntime is installed" in line, line
    assert "pip install 'ort-rmsnorm[cpu]'" in line and "onnxruntime-gpu" in line, line


def test_cli_without_onnxruntime_says_how_to_install_one(tmp_path):
    models = [tmp_path / "a.onnx", tmp_path / "b.onnx"]  # there: a missing input is said first, onnxruntime or not
    for model in models:
        model.write_bytes(b"")
    for command in (["info"], ["verify", *map(str, models)]):
        result = _run(_WITHOUT_ONNXRUNTIME + f"from ort_rmsnorm.cli import main; sys.exit(main({command!r}))")
        assert result.returncode == 2, result
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"ort-rmsnorm {command[0]}: error: "), result.stderr
        _names_both_installs(lines[0])


def test_api_without_onnxruntime_says_how_to_install_one():
    """The package imports without onnxruntime; what needs it raises ModuleNotFoundError with the message."""
    for use in ("ort_rmsnorm.session_options()", "ort_rmsnorm.everywhere", "ort_rmsnorm.fuse_folder"):
        result = _run(_WITHOUT_ONNXRUNTIME + "import ort_rmsnorm\ntry:\n    " + use +
                      "\nexcept ModuleNotFoundError as error:\n    assert error.name == 'onnxruntime'\n"
                      "    print(error)\nelse:\n    print('no error')")
        assert result.returncode == 0, result
        _names_both_installs(result.stdout.strip())


def _installed_package() -> Path:
    return Path(str(importlib.metadata.distribution("ort-rmsnorm").locate_file("ort_rmsnorm")))


def _source_tree_copy(tmp_path: Path) -> Path:
    """A checkout's layout around a copy of the installed package's modules, without the built library."""
    installed = _installed_package()
    checkout = tmp_path / "checkout"
    shutil.copytree(installed, checkout / "ort_rmsnorm",
                    ignore=shutil.ignore_patterns("*.so", "*.dylib", "*.dll", "build_info.json", "__pycache__"))
    (checkout / "custom_op_src").mkdir()
    (checkout / "pyproject.toml").write_text('[project]\nname = "ort-rmsnorm"\n')
    return checkout


def test_source_tree_in_the_way_is_named(tmp_path):
    """From a checkout's root, `python -m` imports the source tree (no library), not the install: the error says so
    and where the installed package is, on one line, not that the library should be built."""
    checkout = _source_tree_copy(tmp_path)
    env = {key: value for key, value in os.environ.items() if key != "ORT_RMSNORM_LIBRARY"}
    result = subprocess.run([sys.executable, "-m", "ort_rmsnorm", "info"], cwd=checkout, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    source = checkout / "ort_rmsnorm"
    assert f"imported from the source tree {source}, which has no built library" in lines[0], lines[0]
    assert f"hides the installed package, {_installed_package()}" in lines[0], lines[0]
    assert "run from another directory" in lines[0] and "pip install ." not in lines[0], lines[0]

    result = _run("import ort_rmsnorm\ntry:\n    ort_rmsnorm.get_library_path()\n"
                  "except FileNotFoundError as error:\n    print(error)", cwd=checkout)
    assert result.returncode == 0 and f"the source tree {source}" in result.stdout, result
