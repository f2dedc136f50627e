"""Fusing and verifying whole model folders.

Two layouts are known:

- an **onnxruntime-genai folder** (it has ``genai_config.json``, as onnxruntime-genai's model builder writes it):
  every ONNX file the config names (``model.decoder.filename``, and the ``filename`` of the embedding, vision,
  speech, encoder and pipeline sections where present) is fused; any other file is copied as it is;
- any other **folder of ``.onnx`` files** (an optimum-onnx export: ``model.onnx``, ``decoder_model_merged.onnx``,
  ...): every ``.onnx`` file in the folder or below it is fused, everything else copied.

A fused model keeps its external data (written next to it as ``<model>.onnx.data``, which is what the builder
names it too). When a fused model uses this package's ops, the library is copied into the output folder, and in a
genai folder each session's options that now need it get ``custom_ops_library`` naming it relative to the folder:
onnxruntime-genai loads a custom-op library only from inside the model folder (relative names resolve there first),
the current directory or an execution provider's library folder, and rejects any path with ``..``. A section with
its own ``session_options`` gets the key there; one without uses the decoder's options in onnxruntime-genai, so
the decoder's get it.

The output folder is written atomically: everything goes into a temporary folder next to it, flushed to disk, then
renamed into place (an existing empty folder is replaced by the rename; a non-empty one only with ``replace=True``,
swapped in one step where the system can, :func:`_exchange`). The input folder is only read.

>>> report = ort_rmsnorm.fuse_folder("llama-int4", "llama-int4-fused")
>>> print(report.summary())
>>> print(ort_rmsnorm.verify_folder("llama-int4", "llama-int4-fused").describe())
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import dataclasses
import errno
import json
import os
import re
import shutil
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import onnx_ir as ir

from . import model_io, verify
from .contract import OP_DOMAIN
from ._library import get_library_path
from .fusion import FusionReport, fuse_model
from .model_io import ModelFileError

GENAI_CONFIG = "genai_config.json"
LIBRARY_KEY = "custom_ops_library"
SESSION_OPTIONS = "session_options"
DECODER_KEY = "model.decoder"
KIND_GENAI = "onnxruntime-genai"
KIND_ONNX = "onnx"
ONNX_SUFFIX = ".onnx"


class FolderError(ModelFileError):
    """A folder cannot be fused or verified as asked; the message names the folder or file and the problem."""


# --- layouts ------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Component:
    """One ONNX file of a folder that is fused."""

    path: str
    """Relative to the folder, with ``/`` separators."""
    config_keys: list[str] = dataclasses.field(default_factory=list)
    """Genai folders: the config sections naming the file (``model.decoder``, ``model.vision``,
    ``model.decoder.pipeline[0]``)."""


@dataclasses.dataclass
class Layout:
    kind: str
    """:data:`KIND_GENAI` or :data:`KIND_ONNX`."""
    root: Path
    components: list[Component]
    config: dict | None = None
    """The parsed ``genai_config.json`` of a genai folder."""

    def session_options_key(self, config_key: str) -> str:
        """Where the session options of the section ``config_key`` are: its own, or the decoder's that
        onnxruntime-genai uses for a section without its own."""
        section = _section(self.config, config_key)
        if config_key == DECODER_KEY or isinstance(section.get(SESSION_OPTIONS), dict):
            return f"{config_key}.{SESSION_OPTIONS}"
        return f"{DECODER_KEY}.{SESSION_OPTIONS}"


def _section(config: dict, key: str) -> dict:
    """The object at a key such as ``model.decoder.pipeline[0]``."""
    node: Any = config
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", key):
        node = node[int(part[1:-1])] if part.startswith("[") else node[part]
    return node


def _relative_name(root: Path, name: str, where: str) -> str:
    """A file name from a config, checked to stay inside the folder."""
    path = PurePosixPath(name.replace("\\", "/"))
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise FolderError(f"{root / GENAI_CONFIG}: {where} is {name!r}, not a file name inside the folder")
    return str(path)


def _genai_components(root: Path, config: Any) -> list[Component]:
    config_path = root / GENAI_CONFIG
    if not isinstance(config, dict) or not isinstance(config.get("model"), dict):
        raise FolderError(f"{config_path}: no \"model\" object: not an onnxruntime-genai config")
    by_path: dict[str, Component] = {}

    def visit(node: Any, key: str) -> None:
        if isinstance(node, dict):
            filename = node.get("filename")
            if isinstance(filename, str) and filename.lower().endswith(ONNX_SUFFIX):
                name = _relative_name(root, filename, f"{key}.filename")
                by_path.setdefault(name, Component(name)).config_keys.append(key)
            for name, value in node.items():
                if name != SESSION_OPTIONS:
                    visit(value, f"{key}.{name}")
        elif isinstance(node, list):
            for index, value in enumerate(node):
                visit(value, f"{key}[{index}]")

    visit(config["model"], "model")
    if not by_path:
        raise FolderError(f"{config_path}: names no .onnx file (model.decoder.filename and the like)")
    for component in by_path.values():
        path = root / component.path
        if not path.is_file():
            raise FolderError(f"{config_path}: {component.config_keys[0]}.filename is {component.path!r}, but "
                              f"{path} {'is not a regular file' if path.exists() else 'does not exist'}")
    return list(by_path.values())


def read_layout(directory: str | os.PathLike) -> Layout:
    """The layout of a model folder and the ONNX files to fuse; :class:`FolderError` for a layout not known."""
    root = Path(directory)
    if not root.is_dir():
        raise FolderError(f"{root}: {'not a directory' if root.exists() else 'no such directory'}")
    config_path = root / GENAI_CONFIG
    if config_path.exists():
        try:
            config = json.loads(config_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as error:
            raise FolderError(f"{config_path}: cannot read it: {error}") from None
        except json.JSONDecodeError as error:
            raise FolderError(f"{config_path}: not valid JSON: {error}") from None
        return Layout(KIND_GENAI, root, _genai_components(root, config), config)
    models = sorted(path for path in _files(root) if path.lower().endswith(ONNX_SUFFIX))
    if not models:
        raise FolderError(f"{root}: neither an onnxruntime-genai folder (no {GENAI_CONFIG}) nor a folder of .onnx "
                          "models (no .onnx file in it or below it): no layout this command knows")
    return Layout(KIND_ONNX, root, [Component(path) for path in models])


def _files(root: Path) -> Iterator[str]:
    """Relative paths of the regular files under ``root`` (symbolic links followed, each directory once)."""
    seen: set[Path] = set()
    for directory, subdirectories, names in os.walk(root, followlinks=True):
        real = Path(directory).resolve()
        if real in seen:
            subdirectories[:] = []
            continue
        seen.add(real)
        subdirectories.sort()
        for name in sorted(names):
            path = Path(directory, name)
            if path.is_file():
                yield path.relative_to(root).as_posix()


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


def _uses_domain(model: ir.Model, domain: str) -> bool:
    """Whether a node of ``domain`` is anywhere in the model: main graph, subgraphs, model-local functions."""
    return any(node.domain == domain for graph in (model.graph, *model.functions.values())
               for node in ir.traversal.RecursiveGraphIterator(graph))


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
    target: str = "custom",
    *,
    replace: bool = False,
    allow_opset_upgrade: bool = False,
    progress: Callable[[str], None] | None = None,
    on_tensor_written: Callable[[int, int], None] | None = None,
) -> FolderReport:
    """Fuses every model of the folder ``source`` (see the module docstring) into a new folder ``destination``.

    Args:
        source: an onnxruntime-genai folder or a folder of ``.onnx`` files; never modified.
        destination: the output folder, written atomically. It must not exist, or be empty; with ``replace=True`` an
            existing folder is replaced as a whole.
        target: ``"custom"``, ``"onnx"`` or ``"ort"`` (as :func:`ort_rmsnorm.fuse`).
        allow_opset_upgrade: as :func:`ort_rmsnorm.fuse`.
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
    staging = _staging_folder(destination)
    try:
        _fill_and_publish(layout, source, staging, destination, report, replace=replace,
                          allow_opset_upgrade=allow_opset_upgrade, say=say, on_tensor_written=on_tensor_written)
    except OSError as error:  # the output's file system: full, read-only, the folder removed meanwhile
        raise FolderError(f"{destination}: cannot write the output folder: {error.strerror or error}"
                          + (f" ({error.filename})" if error.filename else "")) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    say("done")
    return report


def _fill_and_publish(layout: Layout, source: Path, staging: Path, destination: Path, report: FolderReport, *,
                      replace: bool, allow_opset_upgrade: bool, say: Callable[[str], None],
                      on_tensor_written: Callable[[int, int], None] | None) -> None:
    """Writes the fused folder into ``staging`` and renames it to ``destination`` once complete."""
    target = report.target
    models: dict[str, ir.Model] = {}
    data_files: dict[str, set[Path]] = {}
    notes: dict[str, list[str]] = {}
    for index, component in enumerate(layout.components, 1):
        say(f"[{index}/{len(layout.components)}] loading {component.path}")
        model = model_io.load_model(source / component.path, notes.setdefault(component.path, []))
        models[component.path], data_files[component.path] = model, model_io.external_data_files(model)
    for relative in _copied_files(layout, data_files):
        _copy(source / relative, staging, relative)
        report.copied.append(relative)
    for index, component in enumerate(layout.components, 1):
        model = models.pop(component.path)
        say(f"[{index}/{len(layout.components)}] fusing {component.path} (target {target})")
        try:
            fusion_report = fuse_model(model, target, allow_opset_upgrade=allow_opset_upgrade)
        except ValueError as error:  # onnx's version converter refusing the model
            raise FolderError(f"{source / component.path}: {model_io.one_line(error)}") from None
        fusion_report.notes[:0] = notes[component.path]
        say(f"[{index}/{len(layout.components)}] writing {component.path}: {len(fusion_report.fusions)} fused, "
            f"{len(fusion_report.skipped)} skipped")
        output = _make_parents(staging, component.path) / PurePosixPath(component.path).name
        data = model_io.save_model(model, output, protected=[source / component.path, *data_files[component.path]],
                                   on_tensor_written=on_tensor_written)
        data_relative = data.relative_to(staging).as_posix() if data else None
        report.models.append(ModelResult(component.path, fusion_report, _uses_domain(model, OP_DOMAIN),
                                         data_relative))
    if any(result.uses_library for result in report.models):
        library = Path(get_library_path())
        _copy(library, staging, library.name)
        report.library = library.name
    if layout.kind == KIND_GENAI:
        _write_genai_config(layout, report, staging)
    say(f"writing {destination}")
    _sync_tree(staging)
    _check_complete(staging, report, layout)
    _publish(staging, destination, replace=replace)


def _staging_folder(destination: Path) -> Path:
    try:
        staging = Path(tempfile.mkdtemp(dir=destination.parent, prefix=model_io.temporary_prefix(destination)))
    except OSError as error:
        raise FolderError(f"{destination}: cannot write in {destination.parent}: {error.strerror or error}") from None
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(staging, 0o777 & ~umask)  # mkdtemp's 0700 would otherwise become the output folder's
    return staging


def _copied_files(layout: Layout, data_files: Mapping[str, set[Path]]) -> list[str]:
    """Every file but the fused models and the external data only they read (each fused model writes its own);
    a data file that another file names (a genai config's shared initializers) is copied too."""
    fused = {component.path for component in layout.components}
    config_text = json.dumps(layout.config) if layout.config is not None else ""
    files = list(_files(layout.root))
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
            section = _section(config, section_key)
        except (KeyError, IndexError, TypeError):
            raise FolderError(f"{layout.root / GENAI_CONFIG}: has no {section_key} section, whose session options "
                              "onnxruntime-genai would use for the fused models") from None
        options = section.get(SESSION_OPTIONS)
        if not isinstance(options, dict):  # absent (or null): genai then uses defaults, which this extends
            options = section[SESSION_OPTIONS] = {}
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


# --- writing the folder atomically --------------------------------------------------------------------------------


def _fsync(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if path.is_dir() else 0))
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _sync_tree(root: Path) -> None:
    for directory, _subdirectories, names in os.walk(root):
        for name in names:
            _fsync(Path(directory, name))
        _fsync(Path(directory))


_NOT_EMPTY_NOW = ("{destination}: the output folder was written by another process while this one ran; "
                  "nothing was replaced (--replace replaces it as a whole)")
_RENAME_EXCHANGE = 2  # renameat2(2)'s flag: swap two paths atomically (Linux 3.15, glibc 2.28)
_AT_FDCWD = -100


def _exchange(first: Path, second: Path) -> bool:
    """Swaps two existing paths in one step; False where the system cannot (then nothing changed)."""
    renameat2 = getattr(ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE) == 0:
        return True
    error = ctypes.get_errno()
    if error in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # the kernel or the file system cannot swap
        return False
    raise OSError(error, os.strerror(error), str(second))


def _publish(staging: Path, destination: Path, *, replace: bool) -> None:
    """Moves the complete staging folder to ``destination``; an existing folder is swapped out and removed (only
    with ``replace``: one that another run filled since :func:`check_destination` is refused)."""
    try:
        if not destination.exists() or not any(destination.iterdir()):
            try:
                os.replace(staging, destination)  # rename(2) replaces an empty directory
            except OSError as error:
                if error.errno not in (errno.ENOTEMPTY, errno.EEXIST) or replace:
                    raise
                raise FolderError(_NOT_EMPTY_NOW.format(destination=destination)) from None
        elif not replace:
            raise FolderError(_NOT_EMPTY_NOW.format(destination=destination))
        elif _exchange(staging, destination):
            shutil.rmtree(staging)  # now the previous folder
        else:
            prefix = model_io.temporary_prefix(destination, model_io.PREVIOUS)
            previous = Path(tempfile.mkdtemp(dir=destination.parent, prefix=prefix))
            os.replace(destination, previous / "folder")
            try:
                os.replace(staging, destination)
            except BaseException:
                os.replace(previous / "folder", destination)
                raise
            finally:
                shutil.rmtree(previous, ignore_errors=True)
        _fsync(destination.parent)
    except OSError as error:
        raise FolderError(f"{destination}: cannot write the output folder: {error.strerror or error}") from None


# --- verifying ----------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class ModelVerification:
    path: str
    result: verify.VerifyResult | None = None
    problem: str | None = None
    """Why the pair was not compared or failed beyond the numbers (a missing or unloadable fused model)."""

    @property
    def ok(self) -> bool:
        return self.problem is None and self.result is not None and self.result.ok


@dataclasses.dataclass
class FolderVerification:
    models: list[ModelVerification]
    problems: list[str] = dataclasses.field(default_factory=list)
    """Problems of the folder itself: a fused model using this package's ops without the library it needs."""

    @property
    def ok(self) -> bool:
        return not self.problems and all(model.ok for model in self.models)

    def describe(self) -> str:
        lines = []
        for model in self.models:
            lines.append(f"{model.path}:")
            if model.result is not None:
                lines += [f"  {line}" for line in model.result.describe().splitlines()]
            if model.problem is not None:
                lines.append(f"  verify: MISMATCH: {model.problem}")
        lines += [f"folder: MISMATCH: {problem}" for problem in self.problems]
        matched = sum(model.ok for model in self.models)
        lines.append(f"verify: {'all' if matched == len(self.models) else matched} of {len(self.models)} models match"
                     + ("" if not self.problems else f"; {len(self.problems)} folder problems"))
        return "\n".join(lines)


def _symbolic_dims(model: ir.Model) -> dict[str, list[str]]:
    """Input name -> its dims' names (empty strings for static or unnamed dims)."""
    return {value.name: [dim.value if isinstance(dim, ir.SymbolicDim) and dim.value else ""
                         for dim in (value.shape or [])] for value in model.graph.inputs}


def _genai_default_dims(layout: Layout, component: Component, inputs: Mapping[str, list[str]]) -> dict[str, int]:
    """Sizes a genai decoder needs that verify's generic defaults cannot guess, from the config: the past key/value
    inputs' head dim (``head_size``) and, for the layers of a sliding window, their past length (``window_size``:
    the cache of such a layer is a ring of that many positions, and onnxruntime refuses a shorter one)."""
    if layout.config is None or DECODER_KEY not in component.config_keys:
        return {}
    decoder = layout.config["model"]["decoder"]
    names = decoder.get("inputs", {})
    patterns = [re.escape(names.get(key, default)).replace("%d", r"(\d+)")
                for key, default in (("past_key_names", "past_key_values.%d.key"),
                                     ("past_value_names", "past_key_values.%d.value"))]
    window = decoder.get("sliding_window") or {}
    sliding = window.get("layers")
    dims = {}
    for name, shape in inputs.items():
        match = next(filter(None, (re.fullmatch(pattern, name) for pattern in patterns)), None)
        if match is None or len(shape) != 4:
            continue
        if shape[3] and isinstance(decoder.get("head_size"), int):
            dims[shape[3]] = decoder["head_size"]
        if (shape[2] and isinstance(window.get("window_size"), int)
                and (sliding is None or int(match.group(1)) in sliding)):
            dims[shape[2]] = window["window_size"]
    return dims


def verify_folder(
    original: str | os.PathLike,
    fused: str | os.PathLike,
    *,
    dims: Mapping[str, int] | None = None,
    inputs: Mapping[str, np.ndarray] | None = None,
    seed: int = verify.DEFAULT_SEED,
    optimization: str = "all",
    progress: Callable[[str], None] | None = None,
) -> FolderVerification:
    """Runs each model :func:`fuse_folder` fuses in ``original`` against the model of the same name in ``fused``
    (:func:`ort_rmsnorm.verify.verify`), and checks that a genai folder's models that use this package's ops can
    load its library.

    ``dims`` and ``inputs`` apply to the models that have such dims and inputs; a name no model has is a
    :class:`~ort_rmsnorm.verify.VerifyInputError`. In a genai folder, the decoder's past key/value head dim defaults
    to the config's ``head_size``.
    """
    say = progress or (lambda _line: None)
    layout = read_layout(original)
    fused = Path(fused)
    if not fused.is_dir():
        raise FolderError(f"{fused}: {'not a directory' if fused.exists() else 'no such directory'}")
    dims, inputs = dict(dims or {}), dict(inputs or {})
    shapes = {component.path: _symbolic_dims(model_io.load_model(layout.root / component.path))
              for component in layout.components}
    dim_names = {name for model in shapes.values() for dims_of_input in model.values() for name in dims_of_input}
    input_names = {name for model in shapes.values() for name in model}
    for option, unknown, what in (("--dim", set(dims) - dim_names, "a dim"),
                                  ("--input", set(inputs) - input_names, "an input")):
        if unknown:
            raise verify.VerifyInputError(f"{option} {', '.join(sorted(unknown))}: no model of {layout.root} has such "
                                          f"{what}")
    results = []
    for index, component in enumerate(layout.components, 1):
        say(f"[{index}/{len(layout.components)}] verifying {component.path}")
        entry = ModelVerification(component.path)
        results.append(entry)
        model_inputs = shapes[component.path]
        names = {name for shape in model_inputs.values() for name in shape if name}
        model_dims = {**_genai_default_dims(layout, component, model_inputs),
                      **{name: size for name, size in dims.items() if name in names}}
        given = {name: array for name, array in inputs.items() if name in model_inputs}
        if not (fused / component.path).is_file():
            entry.problem = f"{fused / component.path}: no such file in the fused folder"
            continue
        try:
            entry.result = verify.verify(layout.root / component.path, fused / component.path, dims=model_dims,
                                         inputs=given, seed=seed, optimization=optimization)
        except verify.FusedModelError as error:
            entry.problem = str(error)
    problems = _library_problems(layout, fused) if layout.kind == KIND_GENAI else []
    return FolderVerification(results, problems)


def _library_problems(layout: Layout, fused: Path) -> list[str]:
    """A fused genai folder whose models use this package's ops must name a library inside it where their sessions
    take their options from."""
    config_path = fused / GENAI_CONFIG
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        return [f"{config_path}: cannot read it: {error}"]
    fused_layout = Layout(KIND_GENAI, fused, layout.components, config)
    problems = []
    for component in layout.components:
        path = fused / component.path
        if not path.is_file() or not _uses_domain(model_io.load_model(path), OP_DOMAIN):
            continue  # a missing model is the pair's problem
        for key in component.config_keys:
            try:
                options_key = fused_layout.session_options_key(key)
                library = _section(config, options_key).get(LIBRARY_KEY)
            except (KeyError, IndexError, TypeError):
                library, options_key = None, f"{key}.{SESSION_OPTIONS}"
            if not isinstance(library, str):
                problems.append(f"{component.path} uses {OP_DOMAIN} ops, but {options_key} in {config_path} names no "
                                f"{LIBRARY_KEY}: onnxruntime-genai could not load the model")
            elif not (fused / library).is_file():
                problems.append(f"{options_key}.{LIBRARY_KEY} is {library!r}, which is not a file in {fused}: "
                                "onnxruntime-genai loads a library only from inside the model folder, the current "
                                "directory or an execution provider's folder")
    return problems
