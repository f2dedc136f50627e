"""Fusing and verifying whole model folders: an onnxruntime-genai folder, or any folder of ``.onnx`` files.

- :mod:`~ort_rmsnorm.folders.contents`: what a folder holds that may be read (its trust boundary);
- :mod:`~ort_rmsnorm.folders.genai_config`: ``genai_config.json`` read with bounds and edited in its text;
- :mod:`~ort_rmsnorm.folders.layout`: the layouts known, and the models of a folder to fuse;
- :mod:`~ort_rmsnorm.folders.manifest`: the manifest every fused folder carries, which ``replace`` requires;
- :mod:`~ort_rmsnorm.folders.fuse`: :func:`fuse_folder`, every model fused into a new folder written atomically,
  the library and the genai config where the fused models need them; :class:`FolderReport`;
- :mod:`~ort_rmsnorm.folders.verify`: :func:`verify_folder`, each fused model run against the original's.

>>> report = ort_rmsnorm.fuse_folder("llama-int4", "llama-int4-fused")
>>> print(report.summary())
>>> print(ort_rmsnorm.verify_folder("llama-int4", "llama-int4-fused").describe())
"""

from .contents import FOLLOW_SYMLINKS_OPTION, Contents, read_contents
from .fuse import FolderReport, ModelResult, check_destination, fuse_folder, inside
from .layout import GENAI_CONFIG, KIND_GENAI, KIND_ONNX, Component, FolderError, Layout, read_layout
from .manifest import MANIFEST
from .verify import FolderVerification, ModelVerification, verify_folder

__all__ = [
    "FOLLOW_SYMLINKS_OPTION",
    "GENAI_CONFIG",
    "KIND_GENAI",
    "KIND_ONNX",
    "MANIFEST",
    "Component",
    "Contents",
    "FolderError",
    "FolderReport",
    "FolderVerification",
    "Layout",
    "ModelResult",
    "ModelVerification",
    "check_destination",
    "fuse_folder",
    "inside",
    "read_contents",
    "read_layout",
    "verify_folder",
]
