"""Locating the compiled custom-op library and registering it with onnxruntime."""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
import weakref
from pathlib import Path

import onnxruntime as ort

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
    raise FileNotFoundError(
        f"the ort_rmsnorm custom-op library {name} is missing from {[str(d) for d in package_dirs]}. "
        "Install the package with "
        f"'pip install .' (which builds it), or point {LIBRARY_ENV} at a libort_rmsnorm built with CMake."
    )


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
    return register(options if options is not None else ort.SessionOptions())


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
