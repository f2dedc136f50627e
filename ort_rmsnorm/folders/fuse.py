"""Fusing every model of a folder into a new folder, written atomically.

The input folder is read under its trust boundary (:mod:`~ort_rmsnorm.folders.contents`): only regular files inside
it; a link out of it only with ``follow_symlinks``. A fused model keeps its external data (written next to it as
``<model>.onnx.data``, which is what onnxruntime-genai's builder names it too). When a fused model uses this
package's ops, the library is copied into the output folder, and in a genai folder each session's options that now
need it get ``custom_ops_library`` naming it relative to the folder: onnxruntime-genai loads a custom-op library only
from inside the model folder (relative names resolve there first), the current directory or an execution provider's
library folder, and rejects any path with ``..``. A section with its own ``session_options`` gets the key there; one
without uses the decoder's options in onnxruntime-genai, so the decoder's get it. The config is edited in place in
its text (:func:`~ort_rmsnorm.folders.genai_config.insert_member`): every other byte stays the user's.

The output folder is written atomically: everything goes into a temporary folder next to it, flushed to disk, then
renamed into place (an existing empty folder is replaced by the rename; a non-empty one only with ``replace=True``
and only if this package wrote it, :mod:`~ort_rmsnorm.folders.manifest`, swapped in one step where the system can:
:func:`ort_rmsnorm.durable.publish_folder`). The input folder is only read.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Callable

import onnx_ir as ir

from .. import durable
from .._library import get_library_path
from ..contract import DEFAULT_TARGET, OP_DOMAIN
from ..fusion import ModelFile
from ..model.graphs import nodes
from ..model.read import ModelFileError, external_data_files
from ..model.write import OutputsPlan, needs_external_data, output_files, staged_report
from ..schemas import register_schemas
from . import genai_config, manifest
from .contents import Contents, copy_file
from .genai_config import path_text
from .layout import (
    GENAI_CONFIG,
    KIND_GENAI,
    LIBRARY_KEY,
    SESSION_OPTIONS,
    FolderError,
    Layout,
    read_layout,
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
    notes: list[str] = dataclasses.field(default_factory=list)
    """What else the run did that a user should know: an input file the library replaced, files kept of a folder
    replaced."""

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
            "notes": self.notes,
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
        lines += [f"note: {note}" for note in self.notes]
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


def _output_folder(destination: Path) -> Path:
    """``destination`` with a last component that names it: ``.`` or ``..`` (whose temporary would go inside or
    beside the wrong folder) resolved."""
    if destination.name in ("", ".", ".."):
        return Path(os.path.realpath(destination))
    return destination


def check_destination(source: Path, destination: Path, *, replace: bool) -> None:
    """Refuses, before any work, an output folder that is or holds the input, lies inside it, is the current
    directory, cannot be made, or is not empty (unless ``replace`` and this package wrote it:
    :func:`~ort_rmsnorm.folders.manifest.check_replaceable`)."""
    if os.path.realpath(destination) == os.path.realpath(os.getcwd()):
        raise FolderError(f"{destination}: the output folder is the current directory; fuse writes a new folder "
                          "beside the output and renames it into place, which would leave this directory's users "
                          "(this shell) in a removed folder: name a folder to create instead (e.g. fused)")
    destination = _output_folder(destination)
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
    if destination.is_dir() and any(destination.iterdir()):
        if not replace:
            raise FolderError(f"{destination}: the output folder exists and is not empty; choose another, or "
                              "replace a folder fuse wrote (--replace)")
        manifest.check_replaceable(destination)


def fuse_folder(
    source: str | os.PathLike,
    destination: str | os.PathLike,
    target: str = DEFAULT_TARGET,
    *,
    replace: bool = False,
    follow_symlinks: bool = False,
    allow_opset_upgrade: bool = False,
    through_qdq: bool = False,
    progress: Callable[[str], None] | None = None,
    on_tensor_written: Callable[[int, int], None] | None = None,
    report_path: str | os.PathLike | None = None,
    wording: Callable[[str], str] | None = None,
) -> FolderReport:
    """Fuses every model of the folder ``source`` (see the module docstring) into a new folder ``destination``.

    Args:
        source: an onnxruntime-genai folder or a folder of ``.onnx`` files; never modified. Only its regular files
            are read, and files reached through links that stay inside it.
        destination: the output folder, written atomically. It must not exist, or be empty; with ``replace=True`` a
            folder this function wrote (it carries ``ort-rmsnorm.json``, and nothing else was added) is replaced.
        target: one of :data:`ort_rmsnorm.contract.TARGETS` (as :func:`ort_rmsnorm.fuse`).
        follow_symlinks: also read through links that lead out of ``source`` to regular files or folders (a Hugging
            Face cache snapshot); device files, FIFOs, sockets and loops stay refused.
        allow_opset_upgrade, through_qdq: as :func:`ort_rmsnorm.fuse`.
        progress: called with one line per stage (each model loaded, fused, written).
        on_tensor_written: ``(index, total)`` while a model's external data is written.
        report_path: where to write the report as JSON too (not inside either folder), before the folder is
            published and renamed into place after it: when it cannot be written, the folder is not published (or
            removed again); ``wording`` as for :func:`ort_rmsnorm.fusion.fuse_file`.

    Raises :class:`FolderError` for a layout it does not know, a folder entry it may not read, or an output folder it
    may not write, and :class:`~ort_rmsnorm.model.read.ModelFileError` for a model file that cannot be read.
    """
    register_schemas()
    source, destination = Path(source), Path(destination)
    say = progress or (lambda _line: None)
    layout = read_layout(source, follow_symlinks=follow_symlinks)
    check_destination(source, destination, replace=replace)
    destination = _output_folder(destination)
    # The report is the one output planned as a file (the folder's rules are check_destination's): checked once.
    plan = OutputsPlan(destination=None, data_file=None, report=None if report_path is None else Path(report_path))
    plan.check()
    report = FolderReport(str(source), str(destination), layout.kind, target)
    try:
        staging = durable.staging_folder(destination)
    except OSError as error:
        raise FolderError(f"{destination}: cannot write in {destination.parent}: {error.strerror or error}") from None
    try:
        _fill(layout, staging, report, target, allow_opset_upgrade=allow_opset_upgrade, through_qdq=through_qdq,
              say=say, on_tensor_written=on_tensor_written)
        manifest.write(staging, target)
        say(f"writing {destination}")
        durable.fsync_tree(staging)
        _check_complete(staging, report, layout)
        if plan.report is None:
            _publish(staging, destination, report, replace=replace)
        else:
            text = report.to_json()
            # The report is written first and renamed last: a report that finds no room leaves no folder either.
            with staged_report(plan, wording(text) if wording else text) as commit:
                _publish(staging, destination, report, replace=replace)
                try:
                    commit()
                except BaseException:
                    manifest.discard(destination)
                    raise
    except OSError as error:  # the output's file system: full, read-only, the folder removed meanwhile
        raise FolderError(f"{destination}: cannot write the output folder: {error.strerror or error}"
                          + (f" ({error.filename})" if error.filename else "")) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone once published
    say("done")
    return report


def _load(layout: Layout, relative: str) -> ModelFile:
    """Reads a model of the folder by its path (onnx reads by name), checked to be the file the walk found before
    and after; external data that is a link the walk allowed is read from the link's target."""
    contents = layout.contents
    contents.check_unchanged(relative)
    loaded = ModelFile.load(contents.path(relative), contents.linked_file)
    contents.check_unchanged(relative)
    if _read_linked_data_in_place(loaded.model, contents):
        loaded.data_files = external_data_files(loaded.model)
    return loaded


def _read_linked_data_in_place(model: ir.Model, contents: Contents) -> bool:
    """Points each external tensor whose data file is a link of the folder (allowed by the walk) at the link's
    target, which onnx_ir reads only there (it refuses data reached through a link); True if any was."""
    changed = False
    for graph in model.graphs():
        for value in graph.initializers.values():
            tensor = value.const_value
            if not isinstance(tensor, ir.ExternalTensor):
                continue
            relative = contents.relative_of(Path(tensor.path))
            entry = contents.entry(relative) if relative is not None else None
            if entry is None or entry.real == os.path.join(os.path.realpath(os.path.dirname(tensor.path)),
                                                           os.path.basename(tensor.path)):
                continue
            value.const_value = ir.ExternalTensor(
                os.path.basename(entry.real), tensor.offset, tensor.length, tensor.dtype, shape=tensor.shape,
                name=tensor.name, doc_string=tensor.doc_string, metadata_props=tensor.metadata_props,
                base_dir=os.path.dirname(entry.real))
            changed = True
    return changed


def _fill(layout: Layout, staging: Path, report: FolderReport, target: str, *, allow_opset_upgrade: bool,
          through_qdq: bool, say: Callable[[str], None],
          on_tensor_written: Callable[[int, int], None] | None) -> None:
    """Writes the fused folder into ``staging``: the fused models (each model file read once, before anything is
    written), the files copied as they are, the library and the genai config where the models need them."""
    count = len(layout.components)
    loaded: dict[str, ModelFile] = {}
    for index, component in enumerate(layout.components, 1):
        say(f"[{index}/{count}] loading {component.path}")
        loaded[component.path] = _load(layout, component.path)
    copied = _copied_files(layout, loaded)
    _check_names(layout, loaded, copied)
    for relative in copied:
        _copy_entry(layout.contents, relative, staging)
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
        _copy_library(layout, staging, report)
    if layout.kind == KIND_GENAI:
        _write_genai_config(layout, report, staging)


_NOT_EMPTY_NOW = ("{destination}: the output folder was written by another process while this one ran; "
                  "nothing was replaced (--replace replaces a folder fuse wrote)")


def _publish(staging: Path, destination: Path, report: FolderReport, *, replace: bool) -> None:
    """Moves the complete staging folder to ``destination`` (:func:`ort_rmsnorm.durable.publish_folder`); a folder
    that another run filled since :func:`check_destination` is refused, and one to replace is checked again."""
    try:
        if replace and destination.is_dir() and any(destination.iterdir()):
            manifest.check_replaceable(destination)
        kept = durable.publish_folder(staging, destination, replace=replace, discard=manifest.discard)
    except durable.NotEmptyError:
        raise FolderError(_NOT_EMPTY_NOW.format(destination=destination)) from None
    except OSError as error:
        raise FolderError(f"{destination}: cannot write the output folder: {error.strerror or error}") from None
    if kept is not None:
        report.notes.append(f"{kept}: what the replaced {destination} held beyond the files fuse had written (added "
                            "while this run ran), kept here")


def _copied_files(layout: Layout, loaded: dict[str, ModelFile]) -> list[str]:
    """Every file but the fused models, the config of a genai folder, an input's manifest and the external data only
    the fused models read (each fused model writes its own); a data file the config names (shared initializers) is
    copied too."""
    fused = {component.path for component in layout.components}
    named = genai_config.strings(layout.config) if layout.config is not None else set()
    replaced = set()
    for model in loaded.values():
        for path in model.data_files:
            try:
                status = os.stat(path)
            except OSError:
                continue
            replaced.add((status.st_dev, status.st_ino))
    copied = []
    for relative, entry in layout.contents.files.items():
        if relative in fused or relative == manifest.MANIFEST or (relative == GENAI_CONFIG
                                                                  and layout.kind == KIND_GENAI):
            continue
        if entry.identity in replaced and relative not in named:
            continue
        copied.append(relative)
    return copied


def _parents(relative: str) -> list[str]:
    return [parent.as_posix() for parent in PurePosixPath(relative).parents][:-1]


def _check_names(layout: Layout, loaded: dict[str, ModelFile], copied: list[str]) -> None:
    """Refuses, before anything is written, an input file whose name the output needs for a file it writes (a fused
    model's data file, the manifest) or for a folder, and the reverse."""
    written = {manifest.MANIFEST: f"the manifest {manifest.MANIFEST}"}
    if layout.kind == KIND_GENAI:
        written[GENAI_CONFIG] = "the config"
    for relative, model in loaded.items():
        written[relative] = "a fused model"
        if needs_external_data(model.model):
            written[output_files(relative, external_data=True)[1].as_posix()] = (
                f"the external data of the fused {relative}")
    copied_set = set(copied)
    for relative, what in written.items():
        if relative in copied_set:
            raise FolderError(f"{layout.contents.path(relative)}: the output folder needs this name for {what}, so "
                              "this file of the input cannot be copied; rename or remove it")
        for parent in _parents(relative):
            if parent in copied_set:
                raise FolderError(f"{layout.contents.path(parent)}: a file of the input, where the output folder "
                                  f"needs a folder for {what} ({relative}); rename or remove it")
    for relative in copied:
        for parent in _parents(relative):
            if parent in written:
                raise FolderError(f"{layout.contents.path(parent)}: a folder of the input, where the output folder "
                                  f"needs a file, {written[parent]}; rename or remove it")


def _make_parents(staging: Path, relative: str) -> Path:
    """Makes the folders of ``relative`` inside ``staging`` (which must exist: a staging folder removed meanwhile is
    not made again, which would publish a folder missing what was written before) and returns the innermost."""
    directory = staging
    for part in PurePosixPath(relative).parent.parts:
        directory = directory / part
        try:
            directory.mkdir()
        except FileExistsError:
            if not directory.is_dir() or directory.is_symlink():
                raise FolderError(f"{directory}: not a folder in the temporary output folder (changed by another "
                                  "process?); nothing was published") from None
    if not staging.is_dir():
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(staging))
    return directory


def _copy_entry(contents: Contents, relative: str, staging: Path) -> None:
    destination = _make_parents(staging, relative) / PurePosixPath(relative).name
    try:
        contents.copy(relative, destination)
    except OSError as error:
        raise FolderError(f"{contents.path(relative)}: cannot copy it to {destination}: "
                          f"{error.strerror or error}") from None


def _copy_library(layout: Layout, staging: Path, report: FolderReport) -> None:
    """Copies the library into the folder; an input file of its name is replaced (noted), a folder is an error."""
    library = Path(get_library_path())
    name = library.name
    if any(name in _parents(relative) for relative in report.copied):
        raise FolderError(f"{layout.contents.path(name)}: a folder of the input has the library's name, where the "
                          f"fused models need the library {name}; rename or remove it")
    if name in report.copied:
        (staging / name).unlink()
        report.copied.remove(name)
        report.notes.append(f"{name}: the input's file of that name was replaced by this package's library, which "
                            "the fused models need")
    try:
        with open(library, "rb") as source:
            copy_file(source, staging / name)
    except OSError as error:
        raise FolderError(f"{library}: cannot copy the library to {staging / name}: "
                          f"{error.strerror or error}") from None
    report.library = name


def _written_files(report: FolderReport, layout: Layout) -> list[str]:
    """Every file the output folder holds, relative to it, as ``report`` records them."""
    files = [*report.copied, manifest.MANIFEST]
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
    """The config with ``custom_ops_library`` in each session's options that the fused models need, inserted into
    the input's text (every other byte as it was); the input's file as it is when nothing changes."""
    keys = {component.path: component.config_paths for component in layout.components}
    needing = {layout.session_options_path(path)
               for result in report.models if result.uses_library for path in keys[result.path]}
    edits = []
    for options_path in sorted(needing, key=path_text):
        options = genai_config.get(layout.config, options_path, None)  # an object, or absent: session_options_path
        present = options.get(LIBRARY_KEY) if options is not None else None
        if present == report.library:
            continue
        if present is not None:
            raise FolderError(
                f"{layout.root / GENAI_CONFIG}: {path_text(options_path)}.{LIBRARY_KEY} is already {present!r}; "
                "onnxruntime-genai loads one custom-op library per session, so the fused model could not also load "
                f"{report.library}")
        if options is None:
            edits.append((options_path[:-1], SESSION_OPTIONS, {LIBRARY_KEY: report.library}))
        else:
            edits.append((options_path, LIBRARY_KEY, report.library))
        report.config_changes.append(f"{path_text(options_path)}.{LIBRARY_KEY} = {json.dumps(report.library)}")
    text = genai_config.insert_members(layout.config_text, edits)  # one pass, however many sections
    if report.config_changes:
        (staging / GENAI_CONFIG).write_bytes(text.encode("utf-8"))
    else:
        _copy_entry(layout.contents, GENAI_CONFIG, staging)  # byte for byte
        report.copied.append(GENAI_CONFIG)
