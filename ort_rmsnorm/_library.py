"""Locating the compiled custom-op library and registering it with onnxruntime."""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # onnxruntime is imported where a session needs it: the command line's --help and --version do not
    import onnxruntime as ort

# The package requires no onnxruntime distribution (pyproject.toml's `cpu` extra): the one the user has is kept.
ONNXRUNTIME_MISSING = (
    "no onnxruntime is installed; ort-rmsnorm runs in the one you choose: pip install 'ort-rmsnorm[cpu]' "
    "(onnxruntime, CPU), or pip install onnxruntime-gpu (CUDA) or another onnxruntime build")


def import_onnxruntime():
    """The ``onnxruntime`` module; without one, :data:`ONNXRUNTIME_MISSING` as the ModuleNotFoundError's message."""
    try:
        import onnxruntime
    except ModuleNotFoundError as error:
        if error.name != "onnxruntime":
            raise
        raise ModuleNotFoundError(ONNXRUNTIME_MISSING, name="onnxruntime") from None
    return onnxruntime


_LIBRARY_NAMES = {"linux": "libort_rmsnorm.so", "darwin": "libort_rmsnorm.dylib", "win32": "ort_rmsnorm.dll"}
LIBRARY_ENV = "ORT_RMSNORM_LIBRARY"


def get_library_path() -> str:
    """Path of the custom-op library shipped in this package (or named by $ORT_RMSNORM_LIBRARY)."""
    override = os.environ.get(LIBRARY_ENV)
    if override:
        if not Path(override).is_file():
            raise FileNotFoundError(f"{LIBRARY_ENV}={override}: no such file")
        return override
    name = _LIBRARY_NAMES.get(sys.platform, "libort_rmsnorm.so")
    # All of the package's directories: an editable install splits sources and built files.
    package_dirs = [Path(entry) for entry in sys.modules[__package__].__path__]
    for path in (directory / name for directory in package_dirs):
        if path.is_file():
            return str(path)
    source = _source_tree(package_dirs)
    if source is not None:
        installed = _installed_library(name)
        raise FileNotFoundError(
            f"ort_rmsnorm was imported from the source tree {source}, which has no built library "
            f"(the current directory comes first on Python's path"
            f"{f' and hides the installed package, {Path(installed).parent}' if installed else ''}): run from another "
            "directory, or install in editable mode (pip install --no-build-isolation -e .; DEVELOPERS.md), "
            "which builds the library for the source tree")
    raise FileNotFoundError(
        f"the ort_rmsnorm custom-op library {name} is missing from {[str(d) for d in package_dirs]}. "
        "Install the package with "
        f"'pip install .' (which builds it), or point {LIBRARY_ENV} at a libort_rmsnorm built with CMake."
    )


def _source_tree(package_dirs: list[Path]) -> Path | None:
    """The checkout whose ``ort_rmsnorm/`` was imported (a package directory beside the project's pyproject.toml and
    C++ sources), or None for an installed package."""
    for directory in package_dirs:
        checkout = directory.resolve().parent
        if (checkout / "pyproject.toml").is_file() and (checkout / "custom_op_src").is_dir():
            return directory
    return None


def _installed_library(name: str) -> str | None:
    """The library of the installed distribution, wherever the imported package came from; None when there is none."""
    import importlib.metadata

    try:
        path = importlib.metadata.distribution("ort-rmsnorm").locate_file(f"ort_rmsnorm/{name}")
    except importlib.metadata.PackageNotFoundError:
        return None
    return str(path) if Path(str(path)).is_file() else None


_registered: weakref.WeakSet = weakref.WeakSet()  # options that hold the library: a second copy fails the session
_registered_lock = threading.Lock()


def register(options: ort.SessionOptions) -> ort.SessionOptions:
    """Registers the RMSNorm/SkipRMSNorm ops (domain ``ort_rmsnorm``) with ``options`` and returns it.

    Idempotent: options this function registered before are returned as they are (onnxruntime refuses a session
    whose options hold the library twice, "Domain already set in registry"). Options given the library by
    ``options.register_custom_ops_library`` directly are not known here: do not pass those."""
    with _registered_lock:
        if options not in _registered:
            options.register_custom_ops_library(get_library_path())
            _registered.add(options)
    return options


def session_options(options: ort.SessionOptions | None = None) -> ort.SessionOptions:
    """SessionOptions with the library registered: a new object, or ``options`` itself when given."""
    if options is None:
        options = import_onnxruntime().SessionOptions()
    return register(options)


@functools.lru_cache(maxsize=None)
def build_info() -> dict:
    """Facts recorded when the library was built: version, onnxruntime API version, CPU instruction sets, CUDA."""
    info_path = Path(get_library_path()).with_name("build_info.json")
    if not info_path.is_file():
        return {}
    return json.loads(info_path.read_text())


def package_version() -> str:
    """The package's version: pyproject.toml's, read from the installed distribution's metadata, which every kind of
    install (wheel, ``pip install .``, editable) writes. ``build_info()["version"]`` is the loaded library's, and
    ``$ORT_RMSNORM_LIBRARY`` may point at another build, so it describes the library, not this package."""
    import importlib.metadata

    try:
        return importlib.metadata.version("ort-rmsnorm")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"  # a source tree that was never installed (it has no library either)


def has_cuda() -> bool:
    """True when the library was built with the CUDA kernels (CUDAExecutionProvider overloads)."""
    return bool(build_info().get("cuda", False))


CPU_ISA_ENV = "ORT_RMSNORM_CPU_ISA"

# Registers the library (argv[1]) in a fresh onnxruntime; exits with onnxruntime's error message when it refuses.
_REGISTRATION = """
import sys
import onnxruntime
try:
    onnxruntime.SessionOptions().register_custom_ops_library(sys.argv[1])
except Exception as error:
    sys.exit(str(error))
"""
_UNSUPPORTED = "not supported by this CPU or build"  # custom_op_src/kernels/dispatch.cpp's refusal of a forced set


def cpu_kernel_set() -> tuple[str | None, str]:
    """The CPU kernel set the library runs with in this environment, and how it was chosen; ``(None, why)`` when the
    library refuses to register.

    The library chooses once, when onnxruntime first registers it in a process: the set ``$ORT_RMSNORM_CPU_ISA``
    names (registration fails when the CPU or the build lacks it), or else the most capable set of the build that
    the CPU runs. A forced set registers exactly when the CPU runs it, so the default is the most capable set of the
    build whose forced registration succeeds. That is asked of the library itself rather than read from cpuid here
    (which would have to repeat its checks of the OS's register state): one child process per set, as the library
    reads the variable once per process, from the most capable down (``build_info()["cpu_isas"]`` lists them in
    the dispatch's order, least capable first), so usually a single child."""
    library = get_library_path()
    forced = os.environ.get(CPU_ISA_ENV)
    if forced:
        problem = _registration_problem(library, forced)
        return (None, problem) if problem else (forced, f"forced by {CPU_ISA_ENV}={forced}")
    built = list(build_info().get("cpu_isas", []))
    for isa in reversed(built):
        problem = _registration_problem(library, isa)
        if problem is None:
            faster = built[built.index(isa) + 1:]
            return isa, ("the most capable set of this build" if not faster else
                         f"the most capable set of this build this CPU runs (not {', '.join(faster)})")
        if _UNSUPPORTED not in problem:
            return None, problem
    return None, f"none of this build's sets ({', '.join(built) or 'none listed'}) registers on this CPU"


def forced_cpu_isa_problem() -> str | None:
    """With ``$ORT_RMSNORM_CPU_ISA`` set, why the library refuses to register (a set it does not know, or one this CPU
    or build cannot run), as the library says it; None when it registers or the variable is unset. Asked of
    onnxruntime in this process, before any session, so that the refusal is not taken for a fault of a model."""
    forced = os.environ.get(CPU_ISA_ENV)
    if not forced:
        return None
    options = import_onnxruntime().SessionOptions()
    try:
        options.register_custom_ops_library(get_library_path())
    except Exception as error:  # onnxruntime's Fail, carrying the library's message
        text = str(error)
        if CPU_ISA_ENV not in text:
            raise
        return text[text.index(CPU_ISA_ENV):].strip().splitlines()[0]
    return None


def _registration_problem(library: str, isa: str) -> str | None:
    """None when the library registers with ``ORT_RMSNORM_CPU_ISA=isa`` in a fresh process, else the error."""
    import subprocess

    environment = {**os.environ, CPU_ISA_ENV: isa}
    try:
        completed = subprocess.run([sys.executable, "-c", _REGISTRATION, library], env=environment,
                                   capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return f"registering {library} with {CPU_ISA_ENV}={isa} did not finish in 120 s"
    if completed.returncode == 0:
        return None
    lines = completed.stderr.strip().splitlines()
    return lines[-1] if lines else f"registering {library} failed with exit status {completed.returncode}"
