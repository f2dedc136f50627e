"""Python API of the fusion pass: replace decomposed RMSNorm subgraphs with one fused operator.

>>> fused, report = ort_rmsnorm.fuse("model.onnx")                 # ModelProto out
>>> print(report.summary()); open("report.json", "w").write(report.to_json())

For large models (external data), work on an ``onnx_ir.Model`` in place, so that weights stay where they are::

    model = onnx_ir.load("big.onnx")                  # tensors load lazily
    report = ort_rmsnorm.fusion.fuse_model(model)     # only small constants are read
    onnx_ir.save(model, "fused.onnx", external_data="fused.onnx.data")

Targets: ``custom`` (default; ``ort_rmsnorm.RMSNorm`` / ``SkipRMSNorm``, needs this package's library at run time),
``onnx`` (standard ``RMSNormalization``, opset 23) and ``ort`` (onnxruntime's built-in
``SimplifiedLayerNormalization`` / ``com.microsoft.SkipSimplifiedLayerNormalization``). docs/fusion.md lists every
recognized spelling and every reason a candidate is skipped.
"""

from __future__ import annotations

import os
from typing import Union, overload

import onnx
import onnx_ir as ir

from . import model_io
from .rewrites import Fusion, FusionReport, Skipped, TypeTable, fuse_model, infer_types, rules

__all__ = ["Fusion", "FusionReport", "Skipped", "TypeTable", "fuse", "fuse_model", "infer_types", "rules"]

ModelLike = Union[onnx.ModelProto, ir.Model, str, os.PathLike]


@overload
def fuse(model: ir.Model, target: str = ..., *, allow_opset_upgrade: bool = ...) -> tuple[ir.Model, FusionReport]: ...
@overload
def fuse(
    model: onnx.ModelProto | str | os.PathLike, target: str = ..., *, allow_opset_upgrade: bool = ...
) -> tuple[onnx.ModelProto, FusionReport]: ...


def fuse(model: ModelLike, target: str = "custom", *, allow_opset_upgrade: bool = False):
    """Fuses every decomposed RMSNorm in ``model`` and returns ``(fused_model, report)``; the input is not modified.

    Args:
        model: an ``onnx.ModelProto`` (a ModelProto is returned), an ``onnx_ir.Model`` (an ``onnx_ir.Model`` is
            returned; the input is cloned first, use :func:`fuse_model` to work in place), or a path (checked and
            loaded as ``ort-rmsnorm fuse`` does, external data included; a ModelProto is returned). A missing,
            unreadable, corrupted or invalid file, or missing external data, raises
            :class:`ort_rmsnorm.model_io.ModelFileError` naming the file.
        target: ``"custom"``, ``"onnx"`` or ``"ort"``.
        allow_opset_upgrade: with ``target="onnx"``, convert a model below opset 23 with onnx's version converter
            (otherwise its norms are reported as skipped).

    Returns:
        The fused model and a :class:`FusionReport` (``fusions``, ``skipped`` near misses with reasons,
        ``summary()``, ``to_json()``).
    """
    if isinstance(model, ir.Model):
        copy = model.clone()
        return copy, fuse_model(copy, target, allow_opset_upgrade=allow_opset_upgrade)
    notes: list[str] = []
    if isinstance(model, (str, os.PathLike)):
        # As `ort-rmsnorm fuse` reads it: a bad file is a ModelFileError that names it.
        ir_model = ir.external_data.load_to_model(model_io.load_model(model, notes))
    elif isinstance(model, onnx.ModelProto):
        ir_model = ir.serde.deserialize_model(model)
    else:
        raise TypeError(f"fuse() takes an onnx.ModelProto, an onnx_ir.Model or a path, not {type(model).__name__}")
    report = fuse_model(ir_model, target, allow_opset_upgrade=allow_opset_upgrade)
    report.notes[:0] = notes
    return ir.serde.serialize_model(ir_model), report
