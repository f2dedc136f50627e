"""Malformed models made from real ones, for ``test_malformed.py``: each case is drawn from ``random.Random`` seeded
with ``(seed, index)``, so that any case replays alone from those two numbers.

A case starts from one of the seed models (:func:`write_seed_models`) copied into a folder of its own, and applies one
mutation to its files:

- ``flip``: 1 to 8 bits flipped in the model file (mostly outside the weights, where a flip changes only a value);
- ``truncate``: the model file cut at any byte;
- ``insert``: 1 to 4 random bytes inserted anywhere;
- ``utf8``: a byte inside a name (node, value, tensor, function, attribute, doc string) replaced by one that makes
  it invalid UTF-8 (the length stays, so the protobuf stays well-formed);
- ``external``: one external data reference made hostile: a negative, huge, overflowing or non-decimal offset or
  length; a length that disagrees with the tensor's type and dims, or dims that disagree with the length; a
  location that is absolute, goes up with ``..``, is empty, holds a NUL, names a directory, a FIFO, a symbolic link
  (to a file outside, to ``/dev/zero``, to a file inside) or a file that is not there; a key given twice or one
  onnxruntime does not read; an inline tensor marked external;
- ``data``: the external data file truncated, emptied, replaced by a directory or a FIFO.

Every case must end in exit status 0 or 2 with one error line and no traceback, leave every input byte as it was,
and leave nothing in the output's folder but a complete output (status 0) or nothing at all (status 2).
"""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ort_rmsnorm.model.write import save_model
from ort_rmsnorm.builders.llama import LlamaConfig, build_llama_onnx

SMALL_LLAMA = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4)
KINDS = ("flip", "truncate", "insert", "utf8", "external", "data")
MODEL = "model.onnx"


@dataclasses.dataclass(frozen=True)
class Seed:
    """A seed model: its folder (the model as ``model.onnx``, its data files beside it)."""

    name: str
    folder: Path

    @property
    def external(self) -> bool:
        return any(path.name != MODEL for path in self.folder.iterdir())


def _external(tensor: TensorProto, data, location: str) -> TensorProto:
    """``tensor`` stored at the end of the open file ``data``."""
    offset = data.tell()
    data.write(tensor.raw_data)
    stored = TensorProto()
    stored.CopyFrom(tensor)
    stored.ClearField("raw_data")
    stored.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(len(tensor.raw_data)))):
        stored.external_data.add(key=key, value=value)
    return stored


def _genai_sln_model(folder: Path) -> None:
    """What onnxruntime-genai's builder writes, in small: a default-domain SimplifiedLayerNormalization (for which the
    checker runs on a copy in memory), a residual Add and a decomposed RMSNorm, the weights in external data."""
    rng = np.random.default_rng(0)
    hidden = 64
    weights = {
        "ln0.weight": (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32),
        "proj.weight": (rng.standard_normal((hidden, hidden)) / 8).astype(np.float32),
        "ln1.weight": (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32),
    }
    with open(folder / "model.onnx.data", "wb") as data:
        initializers = [_external(numpy_helper.from_array(array, name), data, "model.onnx.data")
                        for name, array in weights.items()]
    initializers += [numpy_helper.from_array(np.float32(2.0), "two"), numpy_helper.from_array(np.float32(1e-6), "eps"),
                     numpy_helper.from_array(np.array([-1], np.int64), "axes")]
    nodes = [
        helper.make_node("SimplifiedLayerNormalization", ["x", "ln0.weight"], ["ln0"], name="ln0", axis=-1,
                         epsilon=1e-6),
        helper.make_node("MatMul", ["ln0", "proj.weight"], ["proj"], name="proj"),
        helper.make_node("Add", ["x", "proj"], ["residual"], name="residual"),
        helper.make_node("Pow", ["residual", "two"], ["sq"], name="ln1.pow"),
        helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], name="ln1.mean"),
        helper.make_node("Add", ["ms", "eps"], ["shifted"], name="ln1.add"),
        helper.make_node("Sqrt", ["shifted"], ["rms"], name="ln1.sqrt"),
        helper.make_node("Div", ["residual", "rms"], ["normalized"], name="ln1.div"),
        helper.make_node("Mul", ["normalized", "ln1.weight"], ["y"], name="ln1"),
    ]
    graph = helper.make_graph(nodes, "genai",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", hidden])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", "S", hidden])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    (folder / MODEL).write_bytes(model.SerializeToString())


def _function_model(folder: Path) -> None:
    """A decomposed RMSNorm in a model-local function called twice, its scale a Constant node in the body."""
    hidden = 16
    body = [
        helper.make_node("Constant", [], ["two"], value=numpy_helper.from_array(np.float32(2.0), "two")),
        helper.make_node("Constant", [], ["eps"], value=numpy_helper.from_array(np.float32(1e-5), "eps")),
        helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(np.linspace(0.5, 1.5, hidden,
                                                                                              dtype=np.float32), "w")),
        helper.make_node("Pow", ["x", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1]),
        helper.make_node("Add", ["ms", "eps"], ["shifted"]),
        helper.make_node("Sqrt", ["shifted"], ["rms"]),
        helper.make_node("Div", ["x", "rms"], ["normalized"]),
        helper.make_node("Mul", ["normalized", "w"], ["y"]),
    ]
    function = helper.make_function("local", "Norm", ["x"], ["y"], body, [helper.make_opsetid("", 17)],
                                    doc_string="an RMSNorm")
    nodes = [helper.make_node("Norm", ["x"], ["h"], name="norm0", domain="local"),
             helper.make_node("Norm", ["h"], ["y"], name="norm1", domain="local")]
    graph = helper.make_graph(nodes, "calls", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, hidden])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, hidden])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)],
                              functions=[function], ir_version=8)
    (folder / MODEL).write_bytes(model.SerializeToString())


def write_seed_models(root: Path) -> list[Seed]:
    """The seed models, each in a folder of its own under ``root``: a 2-layer Llama-style model (inline weights, and
    again with external data), a genai-style model with a default-domain SimplifiedLayerNormalization and external
    weights, and a model-local function."""
    seeds = []
    llama = build_llama_onnx(SMALL_LLAMA)
    for name, write in [
        ("llama", lambda folder: save_model(llama, folder / MODEL, external_data=False)),
        ("llama_external", lambda folder: onnx.save_model(llama, folder / MODEL, save_as_external_data=True,
                                                          location="model.onnx.data", size_threshold=1024)),
        ("genai_sln", _genai_sln_model),
        ("function", _function_model),
    ]:
        folder = root / name
        folder.mkdir()
        write(folder)
        seeds.append(Seed(name, folder))
    return seeds


@dataclasses.dataclass
class Case:
    seed: int
    index: int
    model: str
    kind: str
    description: str

    @property
    def id(self) -> str:
        return f"{self.seed}:{self.index}"


def make_case(seeds: list[Seed], seed: int, index: int, folder: Path) -> Case:
    """Copies a seed model into ``folder`` (which must not exist) and mutates it; returns what was done."""
    rng = random.Random(f"{seed}:{index}")
    chosen = rng.choice(seeds)
    shutil.copytree(chosen.folder, folder)
    kinds = [kind for kind in KINDS if chosen.external or kind not in ("external", "data")]
    kind = rng.choice(kinds)
    model = folder / MODEL
    description = {"flip": _flip, "truncate": _truncate, "insert": _insert, "utf8": _invalid_utf8,
                   "external": _hostile_reference, "data": _damaged_data}[kind](rng, model)
    return Case(seed, index, chosen.name, kind, description)


def _weight_spans(data: bytes) -> list[tuple[int, int]]:
    """Where the large inline tensors' bytes lie in the file; the rest is the model's structure."""
    try:
        proto = onnx.load_from_string(data)
    except Exception:  # noqa: BLE001 - an earlier mutation of the same case broke it: any byte will do
        return []
    spans = []
    for tensor in proto.graph.initializer:
        if len(tensor.raw_data) > 64:
            start = data.find(tensor.raw_data)
            if start >= 0:
                spans.append((start, start + len(tensor.raw_data)))
    return spans


def _offsets(rng: random.Random, data: bytes, count: int) -> list[int]:
    """Byte offsets, nine in ten outside the large tensors' data."""
    spans, offsets = _weight_spans(data), []
    while len(offsets) < count:
        offset = rng.randrange(len(data))
        if rng.random() < 0.1 or not any(start <= offset < end for start, end in spans):
            offsets.append(offset)
    return offsets


def _flip(rng: random.Random, model: Path) -> str:
    data = bytearray(model.read_bytes())
    flips = []
    for offset in _offsets(rng, bytes(data), rng.randint(1, 8)):
        bit = rng.randrange(8)
        data[offset] ^= 1 << bit
        flips.append(f"{offset}.{bit}")
    model.write_bytes(bytes(data))
    return "bits flipped at " + ", ".join(flips)


def _truncate(rng: random.Random, model: Path) -> str:
    data = model.read_bytes()
    [length] = _offsets(rng, data, 1)
    model.write_bytes(data[:length])
    return f"cut to {length} of {len(data)} bytes"


def _insert(rng: random.Random, model: Path) -> str:
    data = model.read_bytes()
    [offset] = _offsets(rng, data, 1)
    inserted = bytes(rng.randrange(256) for _ in range(rng.randint(1, 4)))
    model.write_bytes(data[:offset] + inserted + data[offset:])
    return f"{inserted.hex()} inserted at {offset}"


def _names(proto: onnx.ModelProto) -> list[str]:
    """Strings the model holds: names of nodes, values, tensors, attributes, functions, doc strings, the producer."""
    names = [proto.producer_name, proto.graph.name]
    for graph in [proto.graph, *proto.functions]:
        for node in graph.node:
            names += [node.name, node.op_type, node.domain, *node.input, *node.output]
            names += [attribute.name for attribute in node.attribute]
            names += [attribute.t.name for attribute in node.attribute if attribute.HasField("t")]
    names += [tensor.name for tensor in proto.graph.initializer]
    names += [value.name for value in (*proto.graph.input, *proto.graph.output, *proto.graph.value_info)]
    names += [function.name for function in proto.functions] + [function.doc_string for function in proto.functions]
    names += [entry.value for tensor in proto.graph.initializer for entry in tensor.external_data]
    return sorted({name for name in names if len(name) >= 1})


def _invalid_utf8(rng: random.Random, model: Path) -> str:
    data = bytearray(model.read_bytes())
    proto = onnx.load_from_string(bytes(data))
    name = rng.choice(_names(proto)).encode()
    starts = [index for index in range(len(data)) if data.startswith(name, index)]
    start = rng.choice(starts)
    position = start + rng.randrange(len(name))
    byte = rng.choice([0x80, 0xBF, 0xC0, 0xC3, 0xE2, 0xED, 0xF5, 0xFF])
    data[position] = byte
    model.write_bytes(bytes(data))
    return f"byte {byte:#04x} at {position}, inside {name!r}"


_BAD_COUNTS = ["-16", "-4", "-1", "abc", "", " 12", "12 ", "1e3", "0x10", "+8", "\u0663", "9223372036854775807",
               "9223372036854775808", "18446744073709551616", "99999999999999999999999"]


def _hostile_reference(rng: random.Random, model: Path) -> str:
    proto = onnx.load(model, load_external_data=False)
    tensors = [tensor for tensor in proto.graph.initializer if tensor.data_location == TensorProto.EXTERNAL]
    inline = [tensor for tensor in proto.graph.initializer if tensor.data_location != TensorProto.EXTERNAL]
    tensor = rng.choice(tensors)
    entries = {entry.key: entry for entry in tensor.external_data}
    folder = model.parent
    choice = rng.randrange(8)
    if choice == 0:
        key = rng.choice(["offset", "length"])
        value = rng.choice(_BAD_COUNTS)
        entries[key].value = value
        what = f"{key} {value!r}"
    elif choice == 1:
        length = int(entries["length"].value)
        value = rng.choice([0, 1, 8, length - 1, length + 1, length * 2, length // 2, 2**40])
        entries["length"].value = str(value)
        what = f"length {value} for {length} bytes of data"
    elif choice == 2:
        dims = rng.choice([[2**32, 2**32], [-1, len(tensor.dims) or 1], [0], [2**62], list(tensor.dims) + [3],
                           [2**31 - 1, 2**31 - 1, 7]])
        del tensor.dims[:]
        tensor.dims.extend(dims)
        what = f"dims {dims} with length {entries['length'].value}"
    elif choice == 3:
        # Offsets past the file, or an offset and a length that overflow together.
        offset = rng.choice([2**31, 2**32, 2**63 - 8, 2**63 - 1, 10**12])
        entries["offset"].value = str(offset)
        what = f"offset {offset}"
    elif choice == 4:
        outside = folder.parent / f"{folder.name}.outside.bin"
        outside.write_bytes(bytes(4096))
        link_kind = rng.randrange(4)
        if link_kind == 0:
            (folder / "out.link").symlink_to(outside)
        elif link_kind == 1:
            (folder / "out.link").symlink_to("/dev/zero")
        elif link_kind == 2:
            (folder / "out.link").symlink_to(entries["location"].value)  # a link inside the folder
        else:
            (folder / "out.link").symlink_to(folder.parent)
        entries["location"].value = "out.link"
        what = f"location: a symbolic link to {os.readlink(folder / 'out.link')}"
    elif choice == 5:
        (folder / "sub").mkdir()
        os.mkfifo(folder / "fifo")
        value = rng.choice(["/etc/passwd", "/dev/zero", "../" + folder.name + "/" + entries["location"].value,
                            "../../x", "a/../../x", "sub/../" + entries["location"].value, "", "model.onnx.data\0x",
                            "sub", "fifo", "absent.bin", "C:\\data.bin", "\\\\server\\share\\w", "./" +
                            entries["location"].value, "sub/"])
        entries["location"].value = value
        what = f"location {value!r}"
    elif choice == 6:
        if rng.random() < 0.5:
            key = rng.choice(["location", "offset", "length"])
            tensor.external_data.add(key=key, value=entries[key].value if rng.random() < 0.5 else "0")
            what = f"{key} given twice"
        else:
            key = rng.choice(["basepath", "hength", "Location", "", "location\0"])
            tensor.external_data.add(key=key, value="0")
            what = f"unknown key {key!r}"
    else:
        if inline and rng.random() < 0.5:
            target = rng.choice(inline)
            target.data_location = TensorProto.EXTERNAL
            if rng.random() < 0.5:
                target.external_data.add(key="location", value=entries["location"].value)
            what = f"inline tensor {target.name!r} marked external"
        else:
            del tensor.external_data[:]
            what = f"external tensor {tensor.name!r} with no location"
    model.write_bytes(proto.SerializeToString())
    return f"tensor {tensor.name!r}: {what}"


def _damaged_data(rng: random.Random, model: Path) -> str:
    data_files = sorted(path for path in model.parent.iterdir() if path.name != MODEL)
    path = rng.choice(data_files)
    content = path.read_bytes()
    choice = rng.randrange(5)
    if choice == 0:
        length = rng.randrange(len(content))
        path.write_bytes(content[:length])
        return f"{path.name} cut to {length} of {len(content)} bytes"
    if choice == 1:
        path.write_bytes(content + bytes(rng.randint(1, 4096)))
        return f"{path.name} extended"
    if choice == 2:
        path.unlink()
        path.mkdir()
        return f"{path.name} a directory"
    if choice == 3:
        path.unlink()
        os.mkfifo(path)
        return f"{path.name} a FIFO"
    path.unlink()
    return f"{path.name} removed"
