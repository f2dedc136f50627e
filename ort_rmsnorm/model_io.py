"""Reading and writing model files safely.

- :func:`load_model`: clear errors for a missing, unreadable, truncated, corrupted or invalid
  model, each naming the file and the problem. Weights stored as external data stay on disk: :func:`load_model`
  returns an ``onnx_ir.Model`` whose external tensors are memory-mapped lazily, so models over 2 GB (which must store
  their weights as external data) are handled without reading the weights.
- :func:`save_model`: atomic writes (:mod:`ort_rmsnorm.durable`). Everything is written into a temporary directory
  next to the destination, flushed to disk and renamed into place, so an interrupted or failed save leaves no partial
  output. External data goes next to the output under the output's own name (``OUT.onnx.data``); the input's data
  files are only read.
- :func:`check_output_path`, :func:`refuse_overwriting`: the checks made before any work, so that a run never ends in
  an output it may not write.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Callable, Iterable

import onnx
import onnx_ir as ir
from google.protobuf.message import DecodeError

from . import durable
from .contract import MS_DOMAIN, ONNX_DOMAINS, ORT_SIMPLIFIED_LAYER_NORM

# A serialized protobuf message cannot exceed 2 GiB; graphs beyond that keep their weights in external data files.
PROTOBUF_LIMIT_BYTES = 2**31 - 1
# protobuf's parsers (upb in Python, the C++ one in onnxruntime) refuse messages nested deeper than this.
PROTOBUF_NESTING_LIMIT = 100
_NESTING_MARKERS = ("MaxDepth", "recursion limit", "Recursion limit", "levels of nesting")  # upb, C++, Python
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
        if any(marker in str(error) for marker in _NESTING_MARKERS):
            raise ModelFileError(
                f"{path}: not a readable ONNX model: its messages nest deeper than protobuf's parser allows "
                f"({PROTOBUF_NESTING_LIMIT} levels; each If, Loop or Scan body inside another takes 3, so bodies "
                "nested about 32 deep reach it): neither onnx nor onnxruntime can read it"
            ) from None
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
    graphs = list(_within(proto.graph))
    defined = {value.name for graph in graphs for value in (*graph.input, *graph.initializer)}
    defined |= {output for graph in graphs for node in graph.node for output in node.output}
    return all(name in defined for graph in graphs for node in graph.node for name in node.input if name)


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


def _within(graph_like: onnx.GraphProto | onnx.FunctionProto) -> Iterable[onnx.GraphProto | onnx.FunctionProto]:
    """``graph_like`` and every subgraph in it, at any depth. (The proto form of a model, read before any onnx_ir
    model exists; :func:`ort_rmsnorm.model_types.walk` is the walk of an onnx_ir model.)"""
    yield graph_like
    for node in graph_like.node:
        for attribute in node.attribute:
            for subgraph in [attribute.g] if attribute.HasField("g") else attribute.graphs:
                yield from _within(subgraph)


def _nodes(proto: onnx.ModelProto) -> Iterable[onnx.NodeProto]:
    """Every node of the model: main graph, subgraphs, model-local functions."""
    for top in (proto.graph, *proto.functions):
        for graph_like in _within(top):
            yield from graph_like.node


def _without_external_initializers(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose initializers stored in external data are typed main-graph inputs instead (subgraphs read them
    from the outer scope, as they may any outer value). The checker resolves an in-memory model's external data
    against the current directory, not the model's; the files are checked by :func:`_check_external_data`."""
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    inputs = {value.name for value in copy.graph.input}
    for graph in _within(copy.graph):
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
    if not any(node.domain in ONNX_DOMAINS and node.op_type in ORT_OPS_IN_ONNX_DOMAIN for node in _nodes(proto)):
        # The path form reads the file in C++ and checks that external data files exist, without reading them.
        onnx.checker.check_model(str(path))
        return
    _check_in_memory(proto)


def _check_in_memory(proto: onnx.ModelProto) -> None:
    """The checker on a model not read from its file. onnxruntime's ops in the default domain are checked as ops of
    its contrib domain, whose ops the checker skips."""
    checked = _without_external_initializers(proto)
    for node in _nodes(checked):
        if node.domain in ONNX_DOMAINS and node.op_type in ORT_OPS_IN_ONNX_DOMAIN:
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
    except OSError as error:
        raise ModelFileError(f"{output}: cannot write the model: {error.strerror or error}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return output.with_name(data_name) if data_name else None


def write_atomically(path: str | os.PathLike, write: Callable[[Path], None], *,
                     protected: Iterable[Path] = ()) -> None:
    """Writes ``path`` with ``write(temporary)`` atomically (:func:`ort_rmsnorm.durable.write_file`), refusing to
    overwrite the ``protected`` files; :class:`ModelFileError` when it cannot."""
    path = Path(path)
    if not path.parent.is_dir():
        raise ModelFileError(f"{path}: the directory {path.parent} does not exist")
    refuse_overwriting(path, protected, "the input")
    try:
        durable.write_file(path, write)
    except OSError as error:
        raise ModelFileError(f"{path}: cannot write: {error.strerror or error}") from None


def write_text_atomically(path: str | os.PathLike, text: str, *, protected: Iterable[Path] = ()) -> None:
    """Writes ``text`` (UTF-8) to ``path`` with :func:`write_atomically`."""
    write_atomically(path, lambda temporary: temporary.write_text(text, encoding="utf-8"), protected=protected)
