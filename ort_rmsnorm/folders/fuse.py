"""Fusing every model of a folder into a new folder, written atomically.

A fused model keeps its external data (written next to it as ``<model>.onnx.data``, which is what onnxruntime-genai's
builder names it too). When a fused model uses this package's ops, the library is copied into the output folder, and
in a genai folder each session's options that now need it get ``custom_ops_library`` naming it relative to the
folder: onnxruntime-genai loads a custom-op library only from inside the model folder (relative names resolve there
first), the current directory or an execution provider's library folder, and rejects any path with ``..``. A section
with its own ``session_options`` gets the key there; one without uses the decoder's options in onnxruntime-genai, so
the decoder's get it.

The output folder is written atomically: everything goes into a temporary folder next to it, flushed to disk, then
renamed into place (an existing empty folder is replaced by the rename; a non-empty one only with ``replace=True``,
swapped in one step where the system can: :func:`ort_rmsnorm.durable.publish_folder`). The input folder is only read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import shutil
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Callable, Mapping

import onnx_ir as ir

from .. import durable
from .._library import get_library_path
from ..contract import DEFAULT_TARGET, OP_DOMAIN
from ..fusion import ModelFile
from ..model_graphs import nodes
from ..model_io import ModelFileError
from .layout import (
    GENAI_CONFIG,
    KIND_GENAI,
    LIBRARY_KEY,
    SESSION_OPTIONS,
    FolderError,
    Layout,
    files_under,
    read_layout,
    section,
)

if TYPE_CHECKING:
    from ..rewrites import FusionReport


# --- the report ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class ModelResult:
    path: str
    report: FusionReport
    uses_library: bool
    """The fused model has nodes of this package's domain (it needs the library at run time)."""
    external_data: str | None
    """The fused model's external data file, relative to the folder."""


@dataclasses.dataclass
class FolderReport:
    """What :func:`fuse_folder` did: per fused model its :class:`FusionReport`, the files copied, the library and the
    config keys set."""

    source: str
    destination: str
    kind: str
    target: str
    models: list[ModelResult] = dataclasses.field(default_factory=list)
    copied: list[str] = dataclasses.field(default_factory=list)
    library: str | None = None
    """The library's file name in the output folder, when copied."""
    config_changes: list[str] = dataclasses.field(default_factory=list)
    """``key = value`` for each genai_config.json entry set."""

    def to_dict(self) -> dict:
        return {
            "source": self.source,
            "destination": self.destination,
            "kind": self.kind,
            "target": self.target,
            "models": {result.path: {"uses_library": result.uses_library, "external_data": result.external_data,
                                     **result.report.to_dict()} for result in self.models},
            "copied": self.copied,
            "library": self.library,
            "config_changes": self.config_changes,
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def summary(self) -> str:
        fused = sum(len(result.report.fusions) for result in self.models)
        skipped = sum(len(result.report.skipped) for result in self.models)
        lines = [f"folder {self.source} ({self.kind}, target {self.target}): {_count(len(self.models), 'model')}, "
                 f"{fused} norms fused, {skipped} skipped; {_count(len(self.copied), 'other file')} copied"]
        for result in self.models:
            lines.append(f"{result.path}:")
            lines += [f"  {line}" for line in result.report.summary().splitlines()]
        if self.library:
            lines.append(f"library: {self.library} copied into the folder (the fused models use its ops)")
        lines += [f"{GENAI_CONFIG}: {change}" for change in self.config_changes]
        return "\n".join(lines)


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


# --- fusing -------------------------------------------------------------------------------------------------------


def uses_domain(model: ir.Model, domain: str) -> bool:
    """Whether a node of ``domain`` is anywhere in the model: main graph, subgraphs, model-local functions."""
    return any(node.domain == domain for node in nodes(model))


def inside(path: Path, folder: Path) -> bool:
    """Whether ``path`` is ``folder`` or lies in it (resolved paths)."""
    return path == folder or folder in path.parents


def check_destination(source: Path, destination: Path, *, replace: bool) -> None:
    """Refuses, before any work, an output folder that is or holds the input, lies inside it, cannot be made, or is
    not empty (unless ``replace``)."""
    real_source, real_destination = source.resolve(), destination.resolve()
    if inside(real_destination, real_source):
        raise FolderError(f"{destination}: the output folder may not be the input folder {source} or lie inside it")
    if inside(real_source, real_destination):
        raise FolderError(f"{destination}: the output folder holds the input folder {source}; choose another")
    if destination.is_symlink():
        raise FolderError(f"{destination}: is a symbolic link; give the folder itself")
    if destination.exists() and not destination.is_dir():
        raise FolderError(f"{destination}: exists and is not a folder")
    if not destination.parent.is_dir():
        raise FolderError(f"{destination}: the parent folder {destination.parent} does not exist")
    if destination.is_dir() and any(destination.iterdir()) and not replace:
        raise FolderError(f"{destination}: the output folder exists and is not empty; choose another, or replace "
                          "it as a whole (--replace)")


def fuse_folder(
    source: str | os.PathLike,
    destination: str | os.PathLike,
    target: str = DEFAULT_TARGET,
    *,
    replace: bool = False,
    allow_opset_upgrade: bool = False,
    through_qdq: bool = False,
    progress: Callable[[str], None] | None = None,
    on_tensor_written: Callable[[int, int], None] | None = None,
) -> FolderReport:
    """Fuses every model of the folder ``source`` (see the module docstring) into a new folder ``destination``.

    Args:
        source: an onnxruntime-genai folder or a folder of ``.onnx`` files; never modified.
        destination: the output folder, written atomically. It must not exist, or be empty; with ``replace=True`` an
            existing folder is replaced as a whole.
        target: ``"custom"``, ``"onnx"`` or ``"ort"`` (as :func:`ort_rmsnorm.fuse`).
        allow_opset_upgrade, through_qdq: as :func:`ort_rmsnorm.fuse`.
        progress: called with one line per stage (each model loaded, fused, written).
        on_tensor_written: ``(index, total)`` while a model's external data is written.

    Raises :class:`FolderError` for a layout it does not know or an output folder it may not write, and
    :class:`~ort_rmsnorm.model_io.ModelFileError` for a model file that cannot be read.
    """
    source, destination = Path(source), Path(destination)
    say = progress or (lambda _line: None)
    layout = read_layout(source)
    check_destination(source, destination, replace=replace)
    report = FolderReport(str(source), str(destination), layout.kind, target)
    try:
        staging = durable.staging_folder(destination)
    except OSError as error:
        raise FolderError(f"{destination}: cannot write in {destination.parent}: {error.strerror or error}") from None
    try:
        _fill(layout, staging, report, target, allow_opset_upgrade=allow_opset_upgrade, through_qdq=through_qdq,
              say=say, on_tensor_written=on_tensor_written)
        say(f"writing {destination}")
        durable.fsync_tree(staging)
        _check_complete(staging, report, layout)
        _publish(staging, destination, replace=replace)
    except OSError as error:  # the output's file system: full, read-only, the folder removed meanwhile
        raise FolderError(f"{destination}: cannot write the output folder: {error.strerror or error}"
                          + (f" ({error.filename})" if error.filename else "")) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    say("done")
    return report


def _fill(layout: Layout, staging: Path, report: FolderReport, target: str, *, allow_opset_upgrade: bool,
          through_qdq: bool, say: Callable[[str], None],
          on_tensor_written: Callable[[int, int], None] | None) -> None:
    """Writes the fused folder into ``staging``: the fused models (each model file read once, before anything is
    written), the files copied as they are, the library and the genai config where the models need them."""
    count = len(layout.components)
    loaded: dict[str, ModelFile] = {}
    for index, component in enumerate(layout.components, 1):
        say(f"[{index}/{count}] loading {component.path}")
        loaded[component.path] = ModelFile.load(layout.root / component.path)
    for relative in _copied_files(layout, {path: model.data_files for path, model in loaded.items()}):
        _copy(layout.root / relative, staging, relative)
        report.copied.append(relative)
    for index, component in enumerate(layout.components, 1):
        model = loaded.pop(component.path)
        say(f"[{index}/{count}] fusing {component.path} (target {target})")
        try:
            fusion_report = model.fuse(target, allow_opset_upgrade=allow_opset_upgrade, through_qdq=through_qdq)
        except ModelFileError as error:  # onnx's version converter refusing the model
            raise FolderError(str(error)) from None
        say(f"[{index}/{count}] writing {component.path}: {len(fusion_report.fusions)} fused, "
            f"{len(fusion_report.skipped)} skipped")
        output = _make_parents(staging, component.path) / PurePosixPath(component.path).name
        data = model.save(output, on_tensor_written=on_tensor_written)
        data_relative = data.relative_to(staging).as_posix() if data else None
        report.models.append(ModelResult(component.path, fusion_report, uses_domain(model.model, OP_DOMAIN),
                                         data_relative))
    if any(result.uses_library for result in report.models):
        library = Path(get_library_path())
        _copy(library, staging, library.name)
        report.library = library.name
    if layout.kind == KIND_GENAI:
        _write_genai_config(layout, report, staging)


_NOT_EMPTY_NOW = ("{destination}: the output folder was written by another process while this one ran; "
                  "nothing was replaced (--replace replaces it as a whole)")


def _publish(staging: Path, destination: Path, *, replace: bool) -> None:
    """Moves the complete staging folder to ``destination`` (:func:`ort_rmsnorm.durable.publish_folder`); a folder
    that another run filled since :func:`check_destination` is refused."""
    try:
        durable.publish_folder(staging, destination, replace=replace)
    except durable.NotEmptyError:
        raise FolderError(_NOT_EMPTY_NOW.format(destination=destination)) from None
    except OSError as error:
        raise FolderError(f"{destination}: cannot write the output folder: {error.strerror or error}") from None


def _copied_files(layout: Layout, data_files: Mapping[str, set[Path]]) -> list[str]:
    """Every file but the fused models and the external data only they read (each fused model writes its own);
    a data file that another file names (a genai config's shared initializers) is copied too."""
    fused = {component.path for component in layout.components}
    config_text = json.dumps(layout.config) if layout.config is not None else ""
    files = list(files_under(layout.root))
    replaced = {path.resolve() for paths in data_files.values() for path in paths}
    copied = []
    for relative in files:
        if relative in fused or (relative == GENAI_CONFIG and layout.kind == KIND_GENAI):
            continue
        if (layout.root / relative).resolve() in replaced and json.dumps(relative) not in config_text:
            continue
        copied.append(relative)
    return copied


def _make_parents(staging: Path, relative: str) -> Path:
    """Makes the folders of ``relative`` inside ``staging`` (which must exist: a staging folder removed meanwhile is
    not made again, which would publish a folder missing what was written before) and returns the innermost."""
    directory = staging
    for part in PurePosixPath(relative).parent.parts:
        directory = directory / part
        with contextlib.suppress(FileExistsError):
            directory.mkdir()
    if not staging.is_dir():
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(staging))
    return directory


def _copy(source: Path, staging: Path, relative: str) -> None:
    destination = _make_parents(staging, relative) / PurePosixPath(relative).name
    try:
        shutil.copy2(source, destination)  # follows symbolic links: the output holds the files themselves
    except OSError as error:
        raise FolderError(f"{source}: cannot copy it to {destination}: {error.strerror or error}") from None


def _written_files(report: FolderReport, layout: Layout) -> list[str]:
    """Every file the output folder holds, relative to it, as ``report`` records them."""
    files = list(report.copied)
    for result in report.models:
        files += [result.path, *([result.external_data] if result.external_data else [])]
    if report.library:
        files.append(report.library)
    if layout.kind == KIND_GENAI and GENAI_CONFIG not in files:
        files.append(GENAI_CONFIG)  # written with the config changes
    return files


def _check_complete(staging: Path, report: FolderReport, layout: Layout) -> None:
    """Refuses to publish a staging folder that lost a file it was given (removed by someone else meanwhile)."""
    missing = [relative for relative in _written_files(report, layout) if not (staging / relative).is_file()]
    if missing:
        raise FolderError(f"{staging}: the temporary output folder lost {', '.join(missing)} while it was written "
                          "(removed by another process?); nothing was published")


def _write_genai_config(layout: Layout, report: FolderReport, staging: Path) -> None:
    config = json.loads(json.dumps(layout.config))  # a copy: the layout keeps the input's
    keys = {component.path: component.config_keys for component in layout.components}
    needing = {layout.session_options_key(key)
               for result in report.models if result.uses_library for key in keys[result.path]}
    for options_key in sorted(needing):
        section_key = options_key.rsplit(".", 1)[0]
        try:
            options_section = section(config, section_key)
        except (KeyError, IndexError, TypeError):
            raise FolderError(f"{layout.root / GENAI_CONFIG}: has no {section_key} section, whose session options "
                              "onnxruntime-genai would use for the fused models") from None
        options = options_section.get(SESSION_OPTIONS)
        if not isinstance(options, dict):  # absent (or null): genai then uses defaults, which this extends
            options = options_section[SESSION_OPTIONS] = {}
        present = options.get(LIBRARY_KEY)
        if present == report.library:
            continue
        if present is not None:
            raise FolderError(
                f"{layout.root / GENAI_CONFIG}: {options_key}.{LIBRARY_KEY} is already {present!r}; onnxruntime-genai "
                f"loads one custom-op library per session, so the fused model could not also load {report.library}")
        options[LIBRARY_KEY] = report.library
        report.config_changes.append(f"{options_key}.{LIBRARY_KEY} = {json.dumps(report.library)}")
    if report.config_changes:
        (staging / GENAI_CONFIG).write_text(json.dumps(config, indent=4) + "\n", encoding="utf-8")
    else:
        _copy(layout.root / GENAI_CONFIG, staging, GENAI_CONFIG)  # byte for byte
        report.copied.append(GENAI_CONFIG)


