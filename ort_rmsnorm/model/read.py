"""Reading and checking model files.

:func:`load_model`: clear errors for a missing, unreadable, truncated, corrupted or invalid model, each naming the
file and the problem. Before anything else reads more of the file, every string in it must be valid UTF-8 and every
tensor stored as external data must name a regular file inside the model's directory (:func:`check_external_data`).
Weights stored as external data stay on disk: :func:`load_model` returns an ``onnx_ir.Model`` whose external tensors
are memory-mapped lazily, so models over 2 GB (which must store their weights as external data) are handled without
reading the weights. Writing is :mod:`ort_rmsnorm.model.write`'s.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Callable, Iterable

import onnx
import onnx_ir as ir
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError

from ..contract import MS_DOMAIN, ONNX_DOMAINS, ORT_SIMPLIFIED_LAYER_NORM
from .graphs import nodes as all_nodes

# A serialized protobuf message cannot exceed 2 GiB; graphs beyond that keep their weights in external data files.
PROTOBUF_LIMIT_BYTES = 2**31 - 1
# protobuf's parsers (upb in Python, the C++ one in onnxruntime) refuse messages nested deeper than this.
PROTOBUF_NESTING_LIMIT = 100
_NESTING_MARKERS = ("MaxDepth", "recursion limit", "Recursion limit", "levels of nesting")  # upb, C++, Python
# onnxruntime registers these ops (the `--target ort` output) in the default ONNX domain, where onnx.checker does not
# know them.
ORT_OPS_IN_ONNX_DOMAIN = frozenset({ORT_SIMPLIFIED_LAYER_NORM})
# External data offsets and lengths are read into 64-bit signed integers (onnxruntime, onnx_ir's memory maps).
_MAX_FILE_BYTES = 2**63 - 1


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


def _read_checked_proto(path: Path, notes: list[str] | None = None, linked: LinkedFiles | None = None
                        ) -> onnx.ModelProto:
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
    through_links = check_external_data(path, _external_tensor_protos(path, proto), linked)
    try:
        _run_checker(path, proto, in_memory=through_links)
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
    model exists; :func:`ort_rmsnorm.model.graphs.walk` is the walk of an onnx_ir model.)"""
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
    against the current directory, not the model's; the files are checked by :func:`check_external_data`."""
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


def _run_checker(path: Path, proto: onnx.ModelProto, *, in_memory: bool = False) -> None:
    """onnx's checker, after :func:`check_external_data` (which every model passes first, whichever form runs
    here). ``in_memory``: external data is read through links the caller allowed, which the path form refuses."""
    if in_memory or any(node.domain in ONNX_DOMAINS and node.op_type in ORT_OPS_IN_ONNX_DOMAIN
                        for node in _nodes(proto)):
        _check_in_memory(proto)
        return
    # The path form reads the file in C++ (no second copy of a large model in Python) and checks the external data
    # files again, without reading them (it refuses a data file that is a symbolic link).
    onnx.checker.check_model(str(path))


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


# ---- what a model file holds, checked before anything reads more of it -------------------------------------------


def printable(text: str | bytes) -> str:
    """``text`` for an error line: control characters, quotes and bytes that are not UTF-8 escaped."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="backslashreplace")
    return repr(text)[1:-1]


def _external_tensor_protos(path: Path, proto: onnx.ModelProto) -> list[tuple[str, onnx.TensorProto]]:
    """Every tensor of the model stored as external data (initializers of every graph, Constant and other tensor
    attributes, sparse tensors, in functions too), each with where it lies. A string field anywhere in the model that
    is not valid UTF-8 (protobuf hands it over as bytes, which onnx and onnx_ir fail on much later, after fusing
    too) is a :class:`ModelFileError` naming the field. One walk over the message, without recursion."""
    found = []
    string, message, external = FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_MESSAGE, onnx.TensorProto.EXTERNAL
    stack: list[tuple[object, tuple | None]] = [(proto, None)]
    while stack:
        item, trail = stack.pop()
        for field, value in item.ListFields():
            if field.type == string:
                for index, text in enumerate(value) if field.is_repeated else ((None, value),):
                    if not isinstance(text, str):
                        raise ModelFileError(
                            f"{path}: invalid ONNX model: {_trail_text((trail, field.name, index))} is not valid "
                            f"UTF-8 ('{printable(text)}')"
                        )
            elif field.type == message:
                if field.is_repeated:
                    stack.extend((child, (trail, field.name, index)) for index, child in enumerate(value))
                else:
                    stack.append((value, (trail, field.name, None)))
        if type(item) is onnx.TensorProto and item.data_location == external:
            found.append((_trail_text(trail), item))
    return found


def _trail_text(trail: tuple | None) -> str:
    """``graph.node[3].attribute[0].t``, from the walk's linked trail."""
    parts = []
    while trail is not None:
        trail, name, index = trail
        parts.append(name if index is None else f"{name}[{index}]")
    return ".".join(reversed(parts)) or "the model"


_DECIMAL = re.compile(r"[0-9]{1,19}")
# The keys onnxruntime accepts (any other is "model format error!"; onnx_ir warns and ignores them).
_EXTERNAL_DATA_KEYS = ("location", "offset", "length", "checksum")


# The real path of a link the caller's own walk allowed (a folder fused with --follow-symlinks), or None.
LinkedFiles = Callable[[Path], "str | None"]


def check_external_data(path: Path, tensors: Iterable[tuple[str, onnx.TensorProto]],
                        linked: LinkedFiles | None = None) -> bool:
    """Refuses, with a :class:`ModelFileError` naming the tensor and the file, every external data reference of the
    model at ``path`` that onnxruntime would refuse or that reaches beyond the model's directory; nothing is opened
    or read, only ``lstat``-ed. ``tensors``: (where, tensor) pairs, as the walk of the model's message finds them.

    A reference must hold only the keys onnxruntime reads, and name a relative location without ``..`` inside the
    model's directory, reached through no symbolic link (onnx's checker and onnx_ir refuse links too), a regular file
    with one hard link (onnx_ir refuses others); its offset and length must be decimal byte counts; the length, when
    given, must be exactly the bytes its element type and dims take; and the file must hold offset + length bytes.
    A data file that is itself a link is accepted only where ``linked`` gives its real path (the file the caller's
    walk checked); that file is then the one checked. Returns whether any was.
    """
    through_links = False
    for where, tensor in tensors:
        name = f"tensor '{printable(tensor.name)}'" if tensor.name else where
        what = f"{path}: {name} stored as external data"
        entries: dict[str, str] = {}
        for entry in tensor.external_data:
            if entry.key not in _EXTERNAL_DATA_KEYS:
                raise ModelFileError(f"{what}: its key '{printable(entry.key)}' is not one onnxruntime reads "
                                     f"({', '.join(_EXTERNAL_DATA_KEYS)})")
            if entry.key in entries:
                raise ModelFileError(f"{what}: its '{printable(entry.key)}' is given twice")
            entries[entry.key] = entry.value
        location = entries.get("location", "")
        if not location:
            raise ModelFileError(f"{what}: names no location")
        offset = _byte_count(entries.get("offset", "0"), "offset", what)
        expected = _tensor_bytes(tensor, what)
        length = _byte_count(entries["length"], "length", what) if "length" in entries else expected
        if length != expected:
            dims = "[" + ", ".join(map(str, tensor.dims)) + "]"
            raise ModelFileError(
                f"{what}: its length is {length} bytes, but its type {ir.DataType(tensor.data_type).name} and dims "
                f"{dims} take {expected} bytes"
            )
        if offset + length > _MAX_FILE_BYTES:
            raise ModelFileError(f"{what}: offset {offset} + length {length} is past any file's end (2^63 - 1)")
        data_path, status, followed = _external_data_file(path, location, name, linked)
        through_links |= followed
        if status.st_size < offset + length:
            raise ModelFileError(
                f"{data_path}: external data file too short for {name} of {path.name} (needs bytes up to "
                f"{offset + length}, file has {status.st_size}; truncated?)"
            )
        if status.st_nlink > 1:
            # onnx_ir refuses to read hard-linked data files (a guard against hard-link attacks).
            raise ModelFileError(
                f"{data_path}: external data file has {status.st_nlink} hard links; onnx_ir refuses to read "
                "hard-linked external data, so copy the file instead of linking it"
            )
    return through_links


def _byte_count(text: str, key: str, what: str) -> int:
    if not _DECIMAL.fullmatch(text) or int(text) > _MAX_FILE_BYTES:
        raise ModelFileError(f"{what}: its {key} '{printable(text)}' is not a byte count (0 to 2^63 - 1)")
    return int(text)


def _tensor_bytes(tensor: onnx.TensorProto, what: str) -> int:
    """The bytes a tensor of its element type and dims takes (sub-byte types packed, as ONNX stores them)."""
    try:
        bits = ir.DataType(tensor.data_type).bitwidth
    except (ValueError, TypeError):  # an unknown number, UNDEFINED or STRING
        raise ModelFileError(
            f"{what}: element type {tensor.data_type} has no fixed size, so it cannot be stored as external data"
        ) from None
    count = 1
    for dim in tensor.dims:
        if dim < 0:
            raise ModelFileError(f"{what}: negative dim {dim}")
        count *= dim
    return (count * bits + 7) // 8


def _external_data_file(path: Path, location: str, name: str, linked: LinkedFiles | None
                        ) -> tuple[Path, os.stat_result, bool]:
    """The data file ``location`` names, relative to the directory of the model at ``path``, its status, and whether
    it is a link ``linked`` allowed (its target's status then). Every component below that directory is ``lstat``-ed
    (none may be a link, but for such a last one), so that nothing outside it is reached."""
    base, what, shown = path.parent, f"external data of {name} in {path.name}", f"'{printable(location)}'"
    where = f"{path}: {name} stored as external data: its location {shown}"
    if "\0" in location:
        raise ModelFileError(f"{where} holds a NUL character")
    if PurePosixPath(location).is_absolute() or PureWindowsPath(location).anchor:
        raise ModelFileError(f"{where} is an absolute path; external data must lie in the model's directory "
                             f"({base}), named relative to it")
    if ".." in PurePosixPath(location).parts:
        raise ModelFileError(f"{where} goes up a directory ('..'); external data must lie in the model's directory "
                             f"({base})")
    parts = PurePosixPath(location).parts
    current, status, followed = base, None, False
    for index, part in enumerate(parts):
        current = current / part
        try:
            status = os.lstat(current)
        except FileNotFoundError:
            raise ModelFileError(f"{current}: no such file ({what})") from None
        except OSError as error:
            raise ModelFileError(f"{current}: cannot read the {what}: {error.strerror or error}") from None
        if stat.S_ISLNK(status.st_mode):
            real = linked(current) if linked is not None and index == len(parts) - 1 else None
            if real is not None:
                try:
                    status, followed = os.stat(real), True
                except OSError as error:
                    raise ModelFileError(f"{current}: cannot read the {what}: {error.strerror or error}") from None
                continue
            raise ModelFileError(f"{current}: the {what} is reached through this symbolic link; external data must "
                                 "be a regular file in the model's directory")
    if status is None or not stat.S_ISREG(status.st_mode):
        raise ModelFileError(f"{current}: the {what} is not a regular file")
    if not os.access(current, os.R_OK):
        raise ModelFileError(f"{current}: the {what} is not readable (permission denied)")
    return current, status, followed


def _external_tensors(model: ir.Model) -> Iterable[ir.ExternalTensor]:
    """The model's external tensors: initializers of every graph, and tensor attributes in graphs and functions."""
    for graph in model.graphs():
        for value in graph.initializers.values():
            if isinstance(value.const_value, ir.ExternalTensor):
                yield value.const_value
    for node in all_nodes(model):
        for attr in node.attributes.values():
            if not isinstance(attr, ir.Attr):
                continue  # a reference to a function's attribute
            if attr.type == ir.AttributeType.TENSOR:
                tensors = [attr.value]
            elif attr.type == ir.AttributeType.TENSORS:
                tensors = list(attr.value)
            else:
                continue
            yield from (tensor for tensor in tensors if isinstance(tensor, ir.ExternalTensor))


def load_model(path: str | os.PathLike, notes: list[str] | None = None, linked: LinkedFiles | None = None
               ) -> ir.Model:
    """Loads and validates the model file at ``path``, keeping external data on disk (memory-mapped lazily).

    Raises :class:`ModelFileError` for a missing or unreadable file, a truncated or corrupted protobuf, a file that is
    not an ONNX model, a string in it that is not UTF-8, a model ``onnx.checker`` rejects, and external data that is
    missing, too short, outside the model's directory, reached through a symbolic link or declared inconsistently
    (:func:`check_external_data`, before any of it is read). A model whose nodes are not in topological order
    (onnxruntime loads such models) is sorted; ``notes`` gets a line saying so. ``linked``: see
    :func:`check_external_data` (the tensors still name the link: the caller points them at its target).
    """
    path = Path(path)
    proto = _read_checked_proto(path, notes, linked)
    try:
        model = ir.serde.deserialize_model(proto)
    except Exception as error:  # noqa: BLE001 - whatever onnx_ir trips over in a checked model is the file's
        raise ModelFileError(f"{path}: invalid ONNX model: onnx_ir cannot read it: {one_line(root_cause(error))}"
                             ) from None
    # External tensors resolve their locations against the model's directory (functions' too).
    base = str(path.parent.resolve())
    for tensor in _external_tensors(model):
        tensor.base_dir = base
    return model


def root_cause(error: BaseException) -> BaseException:
    """The first cause of a chain (onnx_ir wraps each level of a model it fails on in a SerdeError)."""
    while error.__cause__ is not None:
        error = error.__cause__
    return error


def external_data_files(model: ir.Model) -> set[Path]:
    """The files the model's external tensors are stored in."""
    return {Path(tensor.path).resolve() for tensor in _external_tensors(model)}
