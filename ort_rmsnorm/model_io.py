"""Reading and writing model files safely.

- :func:`load_model`: clear errors for a missing, unreadable, truncated, corrupted or invalid
  model, each naming the file and the problem. Weights stored as external data stay on disk: :func:`load_model`
  returns an ``onnx_ir.Model`` whose external tensors are memory-mapped lazily, so models over 2 GB (which must store
  their weights as external data) are handled without reading the weights.
- :func:`save_model`: atomic writes. Everything is written into a temporary directory next to the destination,
  flushed to disk and renamed into place, so an interrupted or failed save leaves no partial output. External data
  goes next to the output under the output's own name (``OUT.onnx.data``); the input's data files are only read.
  Temporaries are named ``.NAME.tmp-*`` (:func:`leftover_temporaries`); one left by a killed process stays until
  removed by hand, as a later run cannot tell it from the temporary of a run still writing.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterable

import onnx
import onnx_ir as ir
from google.protobuf.message import DecodeError

from .contract import MS_DOMAIN, ORT_SIMPLIFIED_LAYER_NORM

# A serialized protobuf message cannot exceed 2 GiB; graphs beyond that keep their weights in external data files.
PROTOBUF_LIMIT_BYTES = 2**31 - 1
# Tensors at or above this size go to the external data file when the output uses external data (onnx's default).
EXTERNAL_DATA_THRESHOLD_BYTES = 1024
# onnxruntime registers these ops (the `--target ort` output) in the default ONNX domain, where onnx.checker does not
# know them.
ORT_OPS_IN_ONNX_DOMAIN = frozenset({ORT_SIMPLIFIED_LAYER_NORM})
# Leave room for the graph itself when deciding whether inline weights still fit one protobuf message.
_GRAPH_HEADROOM_BYTES = 64 * 2**20


class ModelFileError(Exception):
    """A model file cannot be read or written; the message names the file and the problem."""


def one_line(message: object) -> str:
    """A message on one line (checker and onnxruntime messages span several)."""
    return " ".join(str(message).split())


def _check_regular_file(path: Path, what: str) -> None:
    if not path.exists():
        raise ModelFileError(f"{path}: no such file")
    if not path.is_file():
        raise ModelFileError(f"{path}: {what} is not a regular file")
    if not os.access(path, os.R_OK):
        raise ModelFileError(f"{path}: {what} is not readable (permission denied)")


def _read_checked_proto(path: Path, notes: list[str] | None = None) -> onnx.ModelProto:
    _check_regular_file(path, "the model")
    size = path.stat().st_size
    if size == 0:
        raise ModelFileError(f"{path}: empty file, not an ONNX model")
    if size > PROTOBUF_LIMIT_BYTES:
        raise ModelFileError(
            f"{path}: {size} bytes is over protobuf's 2 GiB limit for one .onnx file; models this large must keep "
            "their weights in external data files (onnx.save_model(..., save_as_external_data=True))"
        )
    try:
        proto = onnx.load_model(str(path), load_external_data=False)
    except (DecodeError, RuntimeError, ValueError) as error:
        raise ModelFileError(
            f"{path}: not a readable ONNX model (truncated or corrupted protobuf: {one_line(error)})"
        ) from None
    if not proto.HasField("graph") or not proto.opset_import:
        raise ModelFileError(f"{path}: not an ONNX model (no graph or no opset imports; truncated or another format?)")
    try:
        _run_checker(path, proto)
    except onnx.checker.ValidationError as error:
        if _UNSORTED not in str(error) or not _every_input_produced(proto):
            raise ModelFileError(f"{path}: invalid ONNX model: {one_line(error)}") from None
        proto = _sorted(path, proto, error)
        if notes is not None:
            notes.append(
                f"{path.name}: its nodes were not in topological order (onnxruntime sorts them as it loads a model): "
                "sorted before fusing"
            )
    return proto


_UNSORTED = "must be topologically sorted"


def _every_input_produced(proto: onnx.ModelProto) -> bool:
    """Whether every value a node of the main graph or its subgraphs reads is defined somewhere in them (so that an
    unsorted graph can be sorted; a value that nothing defines is another error)."""
    defined = {value.name for graph in _graphs(proto.graph) for value in (*graph.input, *graph.initializer)}
    defined |= {output for graph in _graphs(proto.graph) for node in graph.node for output in node.output}
    return all(name in defined for graph in _graphs(proto.graph) for node in graph.node for name in node.input if name)


def _sorted(path: Path, proto: onnx.ModelProto, error: Exception) -> onnx.ModelProto:
    """The model with the nodes of every graph and function in topological order, checked again; a graph that has
    no such order (a cycle, an input nothing produces) stays refused with the checker's reason."""
    try:
        model = ir.serde.deserialize_model(proto)
        for graph_like in (model.graph, *model.functions.values()):
            graph_like.sort()
        sorted_proto = ir.serde.serialize_model(model)
        _check_in_memory(sorted_proto)
    except Exception as sort_error:  # noqa: BLE001 - the first reason is the one to give
        raise ModelFileError(
            f"{path}: invalid ONNX model: {one_line(error)} (and sorting its nodes failed: {one_line(sort_error)})"
        ) from None
    return sorted_proto


def _graphs(graph: onnx.GraphProto) -> Iterable[onnx.GraphProto]:
    """``graph`` and every subgraph in it."""
    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            for subgraph in [attribute.g] if attribute.HasField("g") else attribute.graphs:
                yield from _graphs(subgraph)


def _nodes(proto: onnx.ModelProto) -> Iterable[onnx.NodeProto]:
    """Every node of the model: main graph, subgraphs, model-local functions."""
    for graph in _graphs(proto.graph):
        yield from graph.node
    for function in proto.functions:
        for node in function.node:
            yield node
            for attribute in node.attribute:
                for subgraph in [attribute.g] if attribute.HasField("g") else attribute.graphs:
                    for inner in _graphs(subgraph):
                        yield from inner.node


def _without_external_initializers(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose initializers stored in external data are typed main-graph inputs instead (subgraphs read them
    from the outer scope, as they may any outer value). The checker resolves an in-memory model's external data
    against the current directory, not the model's; the files are checked by :func:`_check_external_data`."""
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    inputs = {value.name for value in copy.graph.input}
    for graph in _graphs(copy.graph):
        kept = [tensor for tensor in graph.initializer if tensor.data_location != onnx.TensorProto.EXTERNAL]
        moved = [tensor for tensor in graph.initializer if tensor.data_location == onnx.TensorProto.EXTERNAL]
        if not moved:
            continue
        del graph.initializer[:]
        graph.initializer.extend(kept)
        for tensor in moved:
            if tensor.name not in inputs:
                copy.graph.input.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, tensor.dims))
                inputs.add(tensor.name)
    return copy


def _run_checker(path: Path, proto: onnx.ModelProto) -> None:
    if not any(node.domain in ("", "ai.onnx") and node.op_type in ORT_OPS_IN_ONNX_DOMAIN for node in _nodes(proto)):
        # The path form reads the file in C++ and checks that external data files exist, without reading them.
        onnx.checker.check_model(str(path))
        return
    _check_in_memory(proto)


def _check_in_memory(proto: onnx.ModelProto) -> None:
    """The checker on a model not read from its file. onnxruntime's ops in the default domain are checked as ops of
    its contrib domain, whose ops the checker skips."""
    checked = _without_external_initializers(proto)
    for node in _nodes(checked):
        if node.domain in ("", "ai.onnx") and node.op_type in ORT_OPS_IN_ONNX_DOMAIN:
            node.domain = MS_DOMAIN
    if not any(opset.domain == MS_DOMAIN for opset in checked.opset_import):
        checked.opset_import.add(domain=MS_DOMAIN, version=1)
    for function in checked.functions:
        if not any(opset.domain == MS_DOMAIN for opset in function.opset_import):
            function.opset_import.add(domain=MS_DOMAIN, version=1)
    onnx.checker.check_model(checked)


def _external_tensors(model: ir.Model) -> Iterable[ir.ExternalTensor]:
    return (
        value.const_value
        for graph in model.graphs()
        for value in graph.initializers.values()
        if isinstance(value.const_value, ir.ExternalTensor)
    )


def _check_external_data(model: ir.Model, model_path: Path) -> None:
    for tensor in _external_tensors(model):
        data_path = Path(tensor.path)
        _check_regular_file(data_path, f"external data of tensor '{tensor.name}' in {model_path.name}")
        end = (tensor.offset or 0) + (tensor.length if tensor.length is not None else tensor.nbytes)
        if data_path.stat().st_size < end:
            raise ModelFileError(
                f"{data_path}: external data file too short for tensor '{tensor.name}' of {model_path.name} "
                f"(needs bytes up to {end}, file has {data_path.stat().st_size}; truncated?)"
            )
        links = data_path.resolve().stat().st_nlink
        if links > 1:
            # onnx_ir refuses to read hard-linked data files (a guard against hard-link attacks).
            raise ModelFileError(
                f"{data_path}: external data file has {links} hard links; onnx_ir refuses to read hard-linked "
                "external data, so copy the file instead of linking it"
            )


def load_model(path: str | os.PathLike, notes: list[str] | None = None) -> ir.Model:
    """Loads and validates the model file at ``path``, keeping external data on disk (memory-mapped lazily).

    Raises :class:`ModelFileError` for a missing or unreadable file, a truncated or corrupted protobuf, a file that is
    not an ONNX model, a model ``onnx.checker`` rejects, and missing or too short external data files. A model whose
    nodes are not in topological order (onnxruntime loads such models) is sorted; ``notes`` gets a line saying so.
    """
    path = Path(path)
    model = ir.serde.deserialize_model(_read_checked_proto(path, notes))
    # External tensors resolve their locations against the model's directory.
    ir.external_data.set_base_dir(model.graph, str(path.parent.resolve()))
    _check_external_data(model, path)
    return model


def external_data_files(model: ir.Model) -> set[Path]:
    """The files the model's external tensors are stored in."""
    return {Path(tensor.path).resolve() for tensor in _external_tensors(model)}


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
    if output.is_dir():
        raise ModelFileError(f"{output}: is a directory")
    protected = list(protected)
    for path in output_files(output, external_data=external_data):
        refuse_overwriting(path, protected, "the input")


def output_files(output: str | os.PathLike, *, external_data: bool) -> list[Path]:
    """The files saving a model to ``output`` writes: the model, and its data file with external data."""
    output = Path(output)
    return [output, output.with_name(data_file_name(output))] if external_data else [output]


def _fsync(path: Path) -> None:
    flags = (os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)) if path.is_dir() else os.O_RDONLY
    descriptor = os.open(path, flags)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


STAGED, PREVIOUS = ".tmp-", ".old-"
"""A temporary of the output ``NAME`` is named ``.NAME`` + marker + random characters, in ``NAME``'s directory:
``STAGED`` while it is written, ``PREVIOUS`` for a replaced output folder on its way out."""


def temporary_prefix(output: Path, marker: str = STAGED) -> str:
    """The prefix of ``output``'s temporaries (for tempfile's ``prefix``)."""
    return f".{output.name}{marker}"


def leftover_temporaries(output: str | os.PathLike) -> list[Path]:
    """Temporaries of ``output`` in its directory: left by a run that was killed, or belonging to one still
    writing (nothing tells them apart)."""
    output = Path(output)
    with contextlib.suppress(OSError):
        return sorted(path for marker in (STAGED, PREVIOUS)
                      for path in output.parent.glob(f"{temporary_prefix(output, marker)}*"))
    return []


@contextlib.contextmanager
def _directory_lock(directory: Path):
    """An exclusive lock on ``directory`` (flock(2), released by the kernel when the process dies): two processes
    renaming their model and data files into the same directory do so one after the other, never interleaved into
    one's model next to the other's data. No lock where the platform or the file system has none."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    descriptor = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
        except OSError as error:  # a file system without locks (some network ones): rename unlocked
            if error.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                raise
        yield
    finally:
        os.close(descriptor)  # releases the lock


def _move_into_place(staged_files: list[Path], directory: Path) -> None:
    """Renames the staged files into ``directory`` in order (the model file last: whoever sees it finds its data
    complete); if a rename fails, the files already moved are removed again so that no partial output remains.

    A model and its data file cannot be renamed in one step, so with several files a previous model of that name is
    removed first: a process killed between the renames leaves no model rather than the previous model next to the
    new data, which it would read at the wrong offsets."""
    moved: list[Path] = []
    with _directory_lock(directory):
        try:
            if len(staged_files) > 1:
                with contextlib.suppress(FileNotFoundError):
                    (directory / staged_files[-1].name).unlink()
            for staged in staged_files:
                os.replace(staged, directory / staged.name)
                moved.append(directory / staged.name)
            _fsync(directory)
        except BaseException:
            for path in moved:
                with contextlib.suppress(OSError):
                    path.unlink()
            raise


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
    output = Path(path)
    if isinstance(model, onnx.ModelProto):
        model = ir.serde.deserialize_model(model)
    if external_data is None:
        external_data = needs_external_data(model)
    check_output_path(output, protected, external_data=external_data)
    data_name = data_file_name(output) if external_data else None
    # Small tensors go inline; without external data, all of them (an explicit external_data=False).
    _load_external_tensors(model, EXTERNAL_DATA_THRESHOLD_BYTES if external_data else None)

    callback = None
    if on_tensor_written is not None:
        def callback(_tensor, info: ir.external_data.CallbackInfo) -> None:
            on_tensor_written(info.index + 1, info.total)

    try:
        staging = Path(tempfile.mkdtemp(dir=output.parent, prefix=temporary_prefix(output)))
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
        staged_files = [*([staging / data_name] if data_name else []), staged_model]
        for staged in staged_files:
            _fsync(staged)
        _move_into_place(staged_files, output.parent)
    except ValueError as error:
        # onnx.save's 2 GiB protobuf limit, onnx_ir's checks on external data paths.
        raise ModelFileError(f"{output}: cannot write the model: {one_line(error)}") from None
    except OSError as error:
        raise ModelFileError(f"{output}: cannot write the model: {error.strerror or error}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return output.with_name(data_name) if data_name else None


def write_atomically(path: str | os.PathLike, write: Callable[[Path], None], *,
                     protected: Iterable[Path] = ()) -> None:
    """Writes ``path`` with ``write(temporary)``, a file in the same directory renamed to ``path`` once complete: a
    reader never sees a partial file, and a failure leaves an existing ``path`` as it was. The file gets the
    permissions a plain open() gives (mkstemp's are 0600)."""
    path = Path(path)
    if not path.parent.is_dir():
        raise ModelFileError(f"{path}: the directory {path.parent} does not exist")
    refuse_overwriting(path, protected, "the input")
    temporary = None
    try:
        descriptor, name = tempfile.mkstemp(dir=path.parent, prefix=temporary_prefix(path))
        os.close(descriptor)
        temporary = Path(name)
        write(temporary)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)
        _fsync(temporary)
        os.replace(temporary, path)
    except OSError as error:
        raise ModelFileError(f"{path}: cannot write: {error.strerror or error}") from None
    finally:
        if temporary is not None:
            with contextlib.suppress(FileNotFoundError):
                temporary.unlink()


def write_text_atomically(path: str | os.PathLike, text: str, *, protected: Iterable[Path] = ()) -> None:
    """Writes ``text`` (UTF-8) to ``path`` with :func:`write_atomically`."""
    write_atomically(path, lambda temporary: temporary.write_text(text, encoding="utf-8"), protected=protected)
