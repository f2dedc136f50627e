"""ort-rmsnorm: fused RMSNorm for ONNX Runtime.

- :func:`session_options` / :func:`get_library_path`: load the ``ort_rmsnorm`` custom-op library
  (ops ``RMSNorm`` and ``SkipRMSNorm``, domain ``ort_rmsnorm``, version 1) into onnxruntime.
- :func:`fuse`: the graph pass that replaces decomposed RMSNorm subgraphs with the fused op.
- :func:`fuse_folder` / :func:`verify_folder`: the same for every model of an onnxruntime-genai folder or a folder
  of ``.onnx`` files, and the check of the result.
- :func:`register_schemas`: the ops' ONNX schemas, for onnx's shape inference and checker; registered by importing
  this package (when onnx is imported, see :mod:`ort_rmsnorm.schemas`).
"""

from __future__ import annotations

from ._library import build_info, get_library_path, has_cuda, package_version, register, session_options
from .contract import OP_DOMAIN, OP_VERSION
from .schemas import register_on_onnx_import as _register_on_onnx_import
from .schemas import register_schemas

__all__ = [
    "OP_DOMAIN",
    "OP_VERSION",
    "build_info",
    "fuse",
    "fuse_folder",
    "get_library_path",
    "has_cuda",
    "register",
    "register_schemas",
    "session_options",
    "verify_folder",
]

_register_on_onnx_import()


def __getattr__(name: str):
    # The fusion pass imports onnx, onnx_ir and onnxscript, and the metadata lookup scans sys.path: both on first
    # use, so `import ort_rmsnorm` stays cheap.
    if name == "__version__":
        version = globals()["__version__"] = package_version()
        return version
    if name == "fuse":
        from .fusion import fuse

        return fuse
    if name in ("fuse_folder", "verify_folder"):
        from . import folders

        return getattr(folders, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
