"""Fusing and verifying whole model folders: an onnxruntime-genai folder, or any folder of ``.onnx`` files.

- :mod:`~ort_rmsnorm.folders.layout`: the layouts known, and the models of a folder to fuse;
- :mod:`~ort_rmsnorm.folders.fuse`: :func:`fuse_folder`, every model fused into a new folder written atomically,
  the library and the genai config where the fused models need them; :class:`FolderReport`;
- :mod:`~ort_rmsnorm.folders.verify`: :func:`verify_folder`, each fused model run against the original's.

>>> report = ort_rmsnorm.fuse_folder("llama-int4", "llama-int4-fused")
>>> print(report.summary())
>>> print(ort_rmsnorm.verify_folder("llama-int4", "llama-int4-fused").describe())
"""

from .fuse import FolderReport, ModelResult, check_destination, fuse_folder, inside
from .layout import GENAI_CONFIG, KIND_GENAI, KIND_ONNX, Component, FolderError, Layout, read_layout
from .verify import FolderVerification, ModelVerification, verify_folder

__all__ = [
    "GENAI_CONFIG",
    "KIND_GENAI",
    "KIND_ONNX",
    "Component",
    "FolderError",
    "FolderReport",
    "FolderVerification",
    "Layout",
    "ModelResult",
    "ModelVerification",
    "check_destination",
    "fuse_folder",
    "inside",
    "read_layout",
    "verify_folder",
]
