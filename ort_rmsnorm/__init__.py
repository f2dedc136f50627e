"""ort-rmsnorm: fused RMSNorm for ONNX Runtime.

- :func:`session_options` / :func:`get_library_path`: load the ``ort_rmsnorm`` custom-op library
  (ops ``RMSNorm`` and ``SkipRMSNorm``, domain ``ort_rmsnorm``, version 1) into onnxruntime.
- :func:`fuse`: the graph pass that replaces decomposed RMSNorm subgraphs with the fused op.
"""

from __future__ import annotations

from ._library import build_info, get_library_path, has_cuda, register, session_options

OP_DOMAIN = "ort_rmsnorm"
OP_VERSION = 1

__all__ = [
    "OP_DOMAIN",
    "OP_VERSION",
    "build_info",
    "fuse",
    "get_library_path",
    "has_cuda",
    "register",
    "session_options",
]


def _distribution_version() -> str:
    # The version is pyproject.toml's, read from the installed distribution's metadata: every kind of install (wheel,
    # `pip install .`, editable) writes it there. build_info()["version"] is the loaded library's, which
    # $ORT_RMSNORM_LIBRARY may point at another build, so it describes the library, not this package.
    import importlib.metadata

    try:
        return importlib.metadata.version("ort-rmsnorm")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"  # a source tree that was never installed (it has no library either)


def __getattr__(name: str):
    # The fusion pass imports onnx, onnx_ir and onnxscript, and the metadata lookup scans sys.path: both on first
    # use, so `import ort_rmsnorm` stays cheap.
    if name == "__version__":
        version = globals()["__version__"] = _distribution_version()
        return version
    if name == "fuse":
        from .fusion import fuse

        return fuse
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
