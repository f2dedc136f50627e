"""ort-rmsnorm: fused RMSNorm for ONNX Runtime.

- :func:`session_options` / :func:`get_library_path`: load the ``ort_rmsnorm`` custom-op library
  (ops ``RMSNorm`` and ``SkipRMSNorm``, domain ``ort_rmsnorm``, version 1) into onnxruntime.
- :func:`fuse`: the graph pass that replaces decomposed RMSNorm subgraphs with the fused op; :func:`fuse_file`: the
  same from a model file to a fused model file, with every check ``ort-rmsnorm fuse`` makes.
- :func:`fuse_folder` / :func:`verify_folder`: the same for every model of an onnxruntime-genai folder or a folder
  of ``.onnx`` files, and the check of the result.
"""

from __future__ import annotations

from ._library import build_info, get_library_path, has_cuda, package_version, register, session_options
from .contract import OP_DOMAIN, OP_VERSION

__all__ = [
    "OP_DOMAIN",
    "OP_VERSION",
    "build_info",
    "fuse",
    "fuse_file",
    "fuse_folder",
    "get_library_path",
    "has_cuda",
    "register",
    "session_options",
    "verify_folder",
]


def __getattr__(name: str):
    # The fusion pass imports onnx, onnx_ir and onnxscript, and the metadata lookup scans sys.path: both on first
    # use, so `import ort_rmsnorm` stays cheap.
    if name == "__version__":
        version = globals()["__version__"] = package_version()
        return version
    if name in ("fuse", "fuse_file"):
        from . import fusion

        return getattr(fusion, name)
    if name in ("fuse_folder", "verify_folder"):
        from . import folders

        return getattr(folders, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
