"""Python API of the fusion pass: replace decomposed RMSNorm subgraphs with one fused operator.

>>> ort_rmsnorm.fusion.fuse_file("model.onnx", "fused.onnx", report_path="report.json")   # file to file
>>> fused, report = ort_rmsnorm.fuse("model.onnx")                                      # ModelProto out
>>> print(report.summary())

:func:`fuse_file` is the route ``ort-rmsnorm fuse`` takes: every check before any work (the output may not overwrite
the input or its data, its folder must exist), the model read with its weights left on disk (external data), fused
and written atomically, its weights next to it as ``OUT.onnx.data`` when they do not fit one file. To work on an
``onnx_ir.Model`` in place::

    model = onnx_ir.load("big.onnx")                  # tensors load lazily
    report = ort_rmsnorm.fusion.fuse_model(model)     # only small constants are read
    onnx_ir.save(model, "fused.onnx", external_data="fused.onnx.data")

Targets: the names in :data:`ort_rmsnorm.contract.TARGETS`, which says what each writes; the default, ``custom``,
writes ``ort_rmsnorm.RMSNorm`` / ``SkipRMSNorm``, which need this package's library at run time. docs/fusion.md lists
every recognized spelling and every reason a candidate is skipped.

The pass (``ort_rmsnorm.rewrites``, which imports onnxscript) is imported on first use, after a file's checks: a bad
input fails fast.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Union, overload

import onnx
import onnx_ir as ir

from .contract import DEFAULT_TARGET
from .model.read import LinkedFiles, ModelFileError, external_data_files, load_model, one_line
from .model.write import OutputsPlan, needs_external_data, refuse_overwriting, save_model, write_outputs
from .schemas import register_schemas

if TYPE_CHECKING:
    from .rewrites import FusionReport

__all__ = ["Fusion", "FusionReport", "FusedFile", "ModelFile", "Skipped", "TypeTable", "fuse", "fuse_file",
           "fuse_model", "infer_types", "rules"]
_FROM_THE_PASS = ("Fusion", "FusionReport", "Skipped", "TypeTable", "fuse_model", "infer_types", "rules")

ModelLike = Union[onnx.ModelProto, ir.Model, str, os.PathLike]


def __getattr__(name: str):
    if name in _FROM_THE_PASS:
        from .rewrites import Fusion, FusionReport, Skipped, TypeTable, fuse_model, infer_types, rules

        return {"Fusion": Fusion, "FusionReport": FusionReport, "Skipped": Skipped, "TypeTable": TypeTable,
                "fuse_model": fuse_model, "infer_types": infer_types, "rules": rules}[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclasses.dataclass
class ModelFile:
    """A model file read for fusing: the model (weights left on disk), the notes reading it made (a model sorted
    into topological order), and the files an output must not overwrite."""

    path: Path
    model: ir.Model
    notes: list[str]
    data_files: set[Path]
    """The files its external tensors are stored in."""

    @classmethod
    def load(cls, path: str | os.PathLike, linked: LinkedFiles | None = None) -> ModelFile:
        """Reads and checks ``path`` (:func:`ort_rmsnorm.model.read.load_model`: a bad file is a ModelFileError naming
        it; ``linked`` as there)."""
        notes: list[str] = []
        model = load_model(path, notes, linked)
        return cls(Path(path), model, notes, external_data_files(model))

    @property
    def protected(self) -> list[Path]:
        """The file and its data files."""
        return [self.path, *self.data_files]

    def fuse(self, target: str = DEFAULT_TARGET, *, allow_opset_upgrade: bool = False,
             through_qdq: bool = False) -> FusionReport:
        """Fuses the model in place; the report starts with the notes of reading it. onnx's version converter
        refusing the model (``allow_opset_upgrade``) is a ModelFileError naming the file."""
        from .rewrites import fuse_model  # imports onnxscript

        try:
            return fuse_model(self.model, target, allow_opset_upgrade=allow_opset_upgrade, through_qdq=through_qdq,
                              notes=self.notes)
        except ValueError as error:
            raise ModelFileError(f"{self.path}: {one_line(error)}") from None

    def save(self, destination: str | os.PathLike, *,
             on_tensor_written: Callable[[int, int], None] | None = None) -> Path | None:
        """Writes the model to ``destination`` atomically (:func:`ort_rmsnorm.model.write.save_model`), never over the
        file it was read from or its data; returns the external data file written, if any."""
        return save_model(self.model, destination, protected=self.protected,
                          on_tensor_written=on_tensor_written)


@dataclasses.dataclass
class FusedFile:
    """What :func:`fuse_file` wrote."""

    report: FusionReport
    data_file: Path | None
    """The fused model's external data file, when its weights went to one."""


def fuse_file(
    source: str | os.PathLike,
    destination: str | os.PathLike,
    target: str = DEFAULT_TARGET,
    *,
    report_path: str | os.PathLike | None = None,
    allow_opset_upgrade: bool = False,
    through_qdq: bool = False,
    progress: Callable[[str], None] | None = None,
    on_tensor_written: Callable[[int, int], None] | None = None,
    wording: Callable[[str], str] | None = None,
) -> FusedFile:
    """Fuses the model file ``source`` into ``destination``, as ``ort-rmsnorm fuse`` does.

    Args:
        source: the model (``.onnx``, external data beside it); never modified.
        destination: the fused model, written atomically; external data goes to ``<destination>.data`` when the
            model has some or its weights would not fit one file. It may not be ``source`` or one of its data files
            (through any link either), and its folder must exist.
        target: one of :data:`ort_rmsnorm.contract.TARGETS`.
        report_path: where to write the report as JSON too (atomically; not over the input or the output). It is
            written before the model and renamed into place after it: when it cannot be written, neither is the model
            (a model already renamed into place is removed).
        allow_opset_upgrade: with ``target="onnx"``, convert a model below opset 23 with onnx's version converter
            (otherwise its norms are reported as skipped).
        through_qdq: fuse norms across the QuantizeLinear/DequantizeLinear pairs inside them (an int8 QDQ model's),
            dropping those roundings (listed in each fusion's ``roundings``); the pairs at the norm's boundaries stay.
        progress: called with one line per stage (loading, fusing, writing).
        on_tensor_written: ``(index, total)`` while external data is written.
        wording: the report's JSON passes through it before it is written (the command line names its own flags).

    Every check is made before the work. Raises :class:`ort_rmsnorm.model.read.ModelFileError` naming the file and the
    problem: a missing, unreadable, corrupted or invalid model, missing external data, an output that may not be
    written.
    """
    register_schemas()
    source, destination = Path(source), Path(destination)
    say = progress or (lambda _line: None)
    refuse_overwriting(destination, [source], "the input")  # said before the input is read, whatever it holds
    say(f"loading {source}")
    loaded = ModelFile.load(source)
    # Every output is planned and checked once, before the work; the writer does not check again.
    plan = OutputsPlan.for_model(destination, external_data=needs_external_data(loaded.model), report=report_path,
                                 protected=loaded.protected)
    plan.check()
    say(f"fusing (target {target})")
    report = loaded.fuse(target, allow_opset_upgrade=allow_opset_upgrade, through_qdq=through_qdq)
    say(f"writing {destination}")
    text = None if plan.report is None else (wording or str)(report.to_json())
    return FusedFile(report, write_outputs(plan, loaded.model, report_text=text, on_tensor_written=on_tensor_written))


@overload
def fuse(
    model: ir.Model, target: str = ..., *, allow_opset_upgrade: bool = ..., through_qdq: bool = ...
) -> tuple[ir.Model, FusionReport]: ...
@overload
def fuse(
    model: onnx.ModelProto | str | os.PathLike, target: str = ..., *, allow_opset_upgrade: bool = ...,
    through_qdq: bool = ...
) -> tuple[onnx.ModelProto, FusionReport]: ...


def fuse(model: ModelLike, target: str = DEFAULT_TARGET, *, allow_opset_upgrade: bool = False,
         through_qdq: bool = False):
    """Fuses every decomposed RMSNorm in ``model`` and returns ``(fused_model, report)``; the input is not modified.

    Args:
        model: an ``onnx.ModelProto`` (a ModelProto is returned), an ``onnx_ir.Model`` (an ``onnx_ir.Model`` is
            returned; the input is cloned first, use :func:`fuse_model` to work in place), or a path (checked and
            loaded as :func:`fuse_file` does, external data included; a ModelProto is returned). A missing,
            unreadable, corrupted or invalid file, or missing external data, raises
            :class:`ort_rmsnorm.model.read.ModelFileError` naming the file.
        target: one of :data:`ort_rmsnorm.contract.TARGETS`.
        allow_opset_upgrade: with ``target="onnx"``, convert a model below opset 23 with onnx's version converter
            (otherwise its norms are reported as skipped).
        through_qdq: fuse norms across the QuantizeLinear/DequantizeLinear pairs inside them, as :func:`fuse_file`.

    Returns:
        The fused model and a :class:`FusionReport` (``fusions``, ``skipped`` near misses with reasons,
        ``summary()``, ``to_json()``).
    """
    register_schemas()
    if isinstance(model, ir.Model):
        from .rewrites import fuse_model

        copy = model.clone()
        return copy, fuse_model(copy, target, allow_opset_upgrade=allow_opset_upgrade, through_qdq=through_qdq)
    notes: list[str] = []
    if isinstance(model, (str, os.PathLike)):
        loaded = ModelFile.load(model)
        ir_model, notes = ir.external_data.load_to_model(loaded.model), loaded.notes
    elif isinstance(model, onnx.ModelProto):
        ir_model = ir.serde.deserialize_model(model)
    else:
        raise TypeError(f"fuse() takes an onnx.ModelProto, an onnx_ir.Model or a path, not {type(model).__name__}")
    from .rewrites import fuse_model

    report = fuse_model(ir_model, target, allow_opset_upgrade=allow_opset_upgrade, through_qdq=through_qdq,
                        notes=notes)
    return ir.serde.serialize_model(ir_model), report
