"""Writing model files and other outputs durably, and the guards before.

- :func:`save_model`: atomic writes (:mod:`ort_rmsnorm.durable`). Everything is written into a temporary directory
  next to the destination, flushed to disk and renamed into place, so an interrupted or failed save leaves no partial
  output. External data goes next to the output under the output's own name (``OUT.onnx.data``); the input's data
  files are only read.
- :class:`OutputsPlan`: what a run writes (a model, its data file, a report) and what it must not overwrite, built
  and checked once before any work, so that a run never ends in an output it may not write; :func:`write_outputs`
  writes what it names without checking again.
- :func:`check_output_path`, :func:`refuse_overwriting`: the checks a plan is made of, for outputs of other kinds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import stat
from pathlib import Path
from typing import Callable, Iterable, Iterator

import onnx
import onnx_ir as ir

from .. import durable
from .read import PROTOBUF_LIMIT_BYTES, ModelFileError, external_data_files, one_line, root_cause

# Tensors at or above this size go to the external data file when the output uses external data (onnx's default).
EXTERNAL_DATA_THRESHOLD_BYTES = 1024
# Leave room for the graph itself when deciding whether inline weights still fit one protobuf message.
_GRAPH_HEADROOM_BYTES = 64 * 2**20


def _inline_weight_bytes(model: ir.Model) -> int:
    return sum(
        value.const_value.nbytes
        for graph in model.graphs()
        for value in graph.initializers.values()
        if value.const_value is not None and not isinstance(value.const_value, ir.ExternalTensor)
    )


def needs_external_data(model: ir.Model) -> bool:
    """True when the model keeps weights in external data, or its weights would not fit one protobuf message."""
    return bool(external_data_files(model)) or (
        _inline_weight_bytes(model) > PROTOBUF_LIMIT_BYTES - _GRAPH_HEADROOM_BYTES
    )


def data_file_name(output: Path) -> str:
    """Name of the external data file written next to ``output``."""
    return output.name + ".data"


def _same_file(a: Path, b: Path) -> bool:
    """Same file through any spelling, symlink or hard link; for paths that do not exist, the same resolved path."""
    with contextlib.suppress(OSError):
        return os.path.samefile(a, b)
    return a.resolve() == b.resolve()


def refuse_overwriting(output: str | os.PathLike, protected: Iterable[str | os.PathLike], what: str) -> None:
    """Raises :class:`ModelFileError` when ``output`` is one of the ``protected`` files (the input and its data)."""
    output = Path(output)
    for path in map(Path, protected):
        if _same_file(output, path):
            raise ModelFileError(f"{output}: refusing to overwrite {what} {path}; choose another output path")


def check_output_path(output: str | os.PathLike, protected: Iterable[str | os.PathLike], *,
                      external_data: bool) -> None:
    """Raises :class:`ModelFileError` when ``output`` (or its data file) cannot be written or would overwrite one
    of the ``protected`` files."""
    output = Path(output)
    if not output.parent.is_dir():
        raise ModelFileError(f"{output}: the output directory {output.parent} does not exist")
    protected = list(protected)
    for path in output_files(output, external_data=external_data):
        check_output_kind(path)
        refuse_overwriting(path, protected, "the input")


def check_output_kind(output: str | os.PathLike) -> None:
    """Raises :class:`ModelFileError` when ``output`` names something no file may be renamed over: a device
    (``/dev/null``), a FIFO, a socket, a directory, or a link to one (``/dev/stdout``)
    (:func:`ort_rmsnorm.durable.output_problem`)."""
    problem = durable.output_problem(Path(output))
    if problem is not None:
        raise ModelFileError(f"{output}: {problem}; an output is written as a new file renamed into place, which "
                             "would replace it: name a regular file or a new path")


def output_files(output: str | os.PathLike, *, external_data: bool) -> list[Path]:
    """The files saving a model to ``output`` writes: the model, and its data file with external data."""
    output = Path(output)
    return [output, output.with_name(data_file_name(output))] if external_data else [output]


def _load_external_tensors(model: ir.Model, max_bytes: int | None) -> None:
    """Replaces the external tensors of at most ``max_bytes`` (all: None) with in-memory copies.

    onnx_ir's save loads the small ones itself but then closes each tensor's memory map, which fails while any numpy
    view of it is alive (e.g. a constant read by the pass); copying here leaves the maps alone.
    """
    for graph in model.graphs():
        for value in graph.initializers.values():
            tensor = value.const_value
            if isinstance(tensor, ir.ExternalTensor) and (max_bytes is None or tensor.nbytes <= max_bytes):
                value.const_value = ir.Tensor(tensor.numpy().copy(), dtype=tensor.dtype, name=tensor.name)


@dataclasses.dataclass(frozen=True)
class OutputsPlan:
    """The files one run writes and those it must not overwrite; :meth:`check` before any work, then
    :func:`write_outputs`. A folder route plans its report alone (``destination`` None): the folder has rules of its
    own (:func:`ort_rmsnorm.folders.fuse.check_destination`)."""

    destination: Path | None
    """The model file, or None."""
    data_file: Path | None
    """The model's external data file, when its weights go to one."""
    report: Path | None
    """The report's JSON file, or None."""
    protected: tuple[Path, ...] = ()
    """The input model and its data files."""

    @classmethod
    def for_model(cls, destination: str | os.PathLike, *, external_data: bool,
                  report: str | os.PathLike | None = None, protected: Iterable[str | os.PathLike] = ()
                  ) -> OutputsPlan:
        destination = Path(destination)
        data_file = destination.with_name(data_file_name(destination)) if external_data else None
        return cls(destination, data_file, None if report is None else Path(report), tuple(map(Path, protected)))

    @property
    def model_files(self) -> list[Path]:
        """The model and its data file: what saving the model writes."""
        return [path for path in (self.destination, self.data_file) if path is not None]

    def check(self) -> None:
        """:class:`ModelFileError` when an output cannot be written (its directory is missing, it names a device, a
        directory...: :func:`check_output_kind`) or would overwrite a protected file, or the report one of the
        model's files."""
        if self.destination is not None:
            check_output_path(self.destination, self.protected, external_data=self.data_file is not None)
        if self.report is not None:
            check_output_path(self.report, [], external_data=False)
            refuse_overwriting(self.report, [*self.protected, *self.model_files], "the input or output")


def save_model(
    model: ir.Model | onnx.ModelProto,
    path: str | os.PathLike,
    *,
    external_data: bool | None = None,
    protected: Iterable[str | os.PathLike] = (),
    on_tensor_written: Callable[[int, int], None] | None = None,
) -> Path | None:
    """Writes ``model`` to ``path`` atomically and returns the external data file written, if any.

    ``external_data``: store weights in ``<path>.data`` next to the output; ``None`` decides with
    :func:`needs_external_data`; ``False`` reads external weights into the output file. ``protected``: files that
    must not be overwritten (the input model and its data); the output and its data file are checked against them
    through symlinks and hard links.
    ``on_tensor_written(index, total)`` reports progress while external data is written.
    """
    if isinstance(model, onnx.ModelProto):
        model = ir.serde.deserialize_model(model)
    if external_data is None:
        external_data = needs_external_data(model)
    plan = OutputsPlan.for_model(path, external_data=external_data, protected=protected)
    plan.check()
    return write_outputs(plan, model, on_tensor_written=on_tensor_written)


def write_outputs(plan: OutputsPlan, model: ir.Model, *, report_text: str | None = None,
                  on_tensor_written: Callable[[int, int], None] | None = None) -> Path | None:
    """Writes what ``plan`` names (checked: :meth:`OutputsPlan.check`) atomically and returns the external data file
    written, if any. The report is written first and renamed into place last: a report that finds no room leaves no
    model either (a model already renamed into place is removed)."""
    if plan.report is None:
        return _save(model, plan, on_tensor_written)
    with _staged(plan.report, report_text or "") as commit:
        _save(model, plan, on_tensor_written)
        try:
            commit()
        except BaseException:
            remove_written(plan.model_files)
            raise
    return plan.data_file


def _save(model: ir.Model, plan: OutputsPlan, on_tensor_written: Callable[[int, int], None] | None) -> Path | None:
    output, data_name = plan.destination, plan.data_file.name if plan.data_file is not None else None
    # Small tensors go inline; without external data, all of them (an explicit external_data=False).
    _load_external_tensors(model, EXTERNAL_DATA_THRESHOLD_BYTES if data_name else None)

    callback = None
    if on_tensor_written is not None:
        def callback(_tensor, info: ir.external_data.CallbackInfo) -> None:
            on_tensor_written(info.index + 1, info.total)

    try:
        staging = durable.staging_folder(output)
    except OSError as error:
        raise ModelFileError(f"{output}: cannot write in {output.parent}: {error.strerror or error}") from None
    try:
        staged_model = staging / output.name
        ir.save(
            model,
            staged_model,
            external_data=data_name,
            size_threshold_bytes=EXTERNAL_DATA_THRESHOLD_BYTES,
            callback=callback,
        )
        durable.move_into_place([*([staging / data_name] if data_name else []), staged_model], output.parent)
    except ValueError as error:
        # onnx.save's 2 GiB protobuf limit, onnx_ir's checks on external data paths.
        raise ModelFileError(f"{output}: cannot write the model: {one_line(error)}") from None
    except ir.serde.SerdeError as error:
        # What load_model lets through is serializable; this is the last guard, named rather than a traceback.
        raise ModelFileError(
            f"{output}: cannot write the model: onnx_ir cannot serialize it: {one_line(root_cause(error))}"
        ) from None
    except OSError as error:
        raise ModelFileError(f"{output}: cannot write the model: {error.strerror or error}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return output.with_name(data_name) if data_name else None


def _writable_output(path: str | os.PathLike, protected: Iterable[Path]) -> Path:
    """``path``, once its directory exists, it may be written (:func:`check_output_kind`) and it is none of the
    ``protected`` files; :class:`ModelFileError` otherwise."""
    path = Path(path)
    if not path.parent.is_dir():
        raise ModelFileError(f"{path}: the directory {path.parent} does not exist")
    check_output_kind(path)
    refuse_overwriting(path, protected, "the input")
    return path


def write_atomically(path: str | os.PathLike, write: Callable[[Path], None], *,
                     protected: Iterable[Path] = ()) -> None:
    """Writes ``path`` with ``write(temporary)`` atomically (:func:`ort_rmsnorm.durable.write_file`), refusing to
    overwrite the ``protected`` files; :class:`ModelFileError` when it cannot."""
    path = _writable_output(path, protected)
    try:
        durable.write_file(path, write)
    except OSError as error:
        raise ModelFileError(f"{path}: cannot write: {error.strerror or error}") from None


def write_text_atomically(path: str | os.PathLike, text: str, *, protected: Iterable[Path] = ()) -> None:
    """Writes ``text`` (UTF-8) to ``path`` with :func:`write_atomically`."""
    write_atomically(path, lambda temporary: temporary.write_text(text, encoding="utf-8"), protected=protected)


@contextlib.contextmanager
def staged_text(path: str | os.PathLike, text: str, *, protected: Iterable[Path] = ()) -> Iterator[Callable[[], None]]:
    """Writes ``text`` (UTF-8) to a flushed temporary next to ``path`` and yields the function that renames it into
    place; the temporary is removed when the block ends without it. So a second output is written (a report, which
    may find no room) before the first is published, and published only with it. :class:`ModelFileError` when it
    cannot be written or renamed."""
    with _staged(_writable_output(path, protected), text) as commit:
        yield commit


@contextlib.contextmanager
def staged_report(plan: OutputsPlan, text: str) -> Iterator[Callable[[], None]]:
    """:func:`staged_text` for the report of a checked ``plan`` (:meth:`OutputsPlan.check`), not checked again."""
    with _staged(plan.report, text) as commit:
        yield commit


@contextlib.contextmanager
def _staged(path: Path, text: str) -> Iterator[Callable[[], None]]:
    try:
        temporary = durable.stage_file(path, lambda staged: staged.write_text(text, encoding="utf-8"))
    except OSError as error:
        raise ModelFileError(f"{path}: cannot write: {error.strerror or error}") from None

    def commit() -> None:
        try:
            durable.commit_file(temporary, path)
        except OSError as error:
            raise ModelFileError(f"{path}: cannot write: {error.strerror or error}") from None

    try:
        yield commit
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()


def remove_written(paths: Iterable[str | os.PathLike]) -> None:
    """Removes the regular files a failed run had already renamed into place (a model, its data): nothing else."""
    for path in paths:
        with contextlib.suppress(OSError):
            if stat.S_ISREG(os.lstat(path).st_mode):
                os.unlink(path)
