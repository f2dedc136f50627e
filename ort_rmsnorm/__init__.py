"""ort-rmsnorm: fused RMSNorm for ONNX Runtime.

- :func:`session_options` / :func:`get_library_path`: load the ``ort_rmsnorm`` custom-op library
  (ops ``RMSNorm`` and ``SkipRMSNorm``, domain ``ort_rmsnorm``, version 1) into onnxruntime.
- :func:`fuse`: the graph pass that replaces decomposed RMSNorm subgraphs with the fused op; :func:`fuse_file`: the
  same from a model file to a fused model file, with every check ``ort-rmsnorm fuse`` makes.
- :func:`fuse_folder` / :func:`verify_folder`: the same for every model of an onnxruntime-genai folder or a folder
  of ``.onnx`` files, and the check of the result.
- :func:`everywhere`: onnxruntime's own tools (quantizers, transformer optimizer, ...) on fused models;
  :func:`infer_symbolic_shapes`: onnxruntime's symbolic shape inference knowing our ops.
- :func:`register_schemas`: the ops' ONNX schemas, for onnx's shape inference and checker (imports onnx; idempotent).
  The functions above and the command line register them; ``import ort_rmsnorm`` does not, nor does it import onnx
  or change how other packages are imported: call it before running onnx's checker or inference on a fused model
  yourself (see :mod:`ort_rmsnorm.schemas`).
"""

from __future__ import annotations

from ._library import build_info, get_library_path, has_cuda, package_version, register, session_options
from .contract import OP_DOMAIN, OP_VERSION
from .schemas import register_schemas

__all__ = [
    "OP_DOMAIN",
    "OP_VERSION",
    "add_symbolic_handlers",
    "build_info",
    "everywhere",
    "fuse",
    "fuse_file",
    "fuse_folder",
    "get_library_path",
    "has_cuda",
    "infer_symbolic_shapes",
    "register",
    "register_schemas",
    "session_options",
    "verify_folder",
]

# Names loaded on first use (module, attribute): the fusion pass imports onnx, onnx_ir and onnxscript, the tools
# onnxruntime's Python tools, and the metadata lookup scans sys.path, so `import ort_rmsnorm` stays cheap.
_LAZY = {
    "fuse": ("fusion", "fuse"),
    "fuse_file": ("fusion", "fuse_file"),
    "fuse_folder": ("folders", "fuse_folder"),
    "verify_folder": ("folders", "verify_folder"),
    "everywhere": ("tooling", "everywhere"),
    "infer_symbolic_shapes": ("tooling", "infer_symbolic_shapes"),
    "add_symbolic_handlers": ("tooling", "add_symbolic_handlers"),
}


def __getattr__(name: str):
    if name == "__version__":
        version = globals()["__version__"] = package_version()
        return version
    if name in _LAZY:
        import importlib

        module, attribute = _LAZY[name]
        try:
            loaded = importlib.import_module(f"{__name__}.{module}")
        except ModuleNotFoundError as error:
            if error.name != "onnxruntime":
                raise
            from ._library import ONNXRUNTIME_MISSING

            raise ModuleNotFoundError(ONNXRUNTIME_MISSING, name="onnxruntime") from None
        return getattr(loaded, attribute)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY, "__version__"})  # the default listing and the names loaded on first use
