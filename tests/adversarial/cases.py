"""Hostile models using RMSNorm / SkipRMSNorm: a seeded generator of cases (plain JSON-able dicts), the model and
feeds each one describes, and the contract's judgement of a node (valid per docs/ops.md, or not).

A case is drawn by `generate(seed, index)` from numpy's generator seeded with (seed, index), so one case replays
alone from its two numbers. `build(case)` turns it into an ONNX model and its feeds; tensor values are drawn from
their own (seed, index, name) streams.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper

from op_models import make_model, tensor_proto
from reference import BFLOAT16, FLOAT_TYPES, SMALLEST_SUBNORMAL

DOMAIN = "ort_rmsnorm"
OPS = ("RMSNorm", "SkipRMSNorm")

# Element types by name: the three of the contract and some it does not support.
DTYPES = {
    "float32": np.dtype(np.float32), "float16": np.dtype(np.float16), "bfloat16": BFLOAT16,
    "float64": np.dtype(np.float64), "int32": np.dtype(np.int32), "int64": np.dtype(np.int64),
    "uint8": np.dtype(np.uint8),
}
ONNX_TYPES = {
    "float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16,
    "float64": TensorProto.DOUBLE, "int32": TensorProto.INT32, "int64": TensorProto.INT64, "uint8": TensorProto.UINT8,
}
FLOAT_NAMES = ("float32", "float16", "bfloat16")
UNSUPPORTED_NAMES = ("float64", "int32", "int64", "uint8")
# (X, scale) pairs of the contract.
SCALE_PAIRS = {("float32", "float32"), ("float16", "float16"), ("float16", "float32"), ("bfloat16", "bfloat16"),
               ("bfloat16", "float32")}

# Dims that make the element count of a declared or empty shape overflow 32 or 64 bits.
HUGE_DIMS = (2**31 - 1, 2**31, 2**32 + 1, 2**40, 2**62, 2**63 - 1)
AXES_FAR = (2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**62, 2**63 - 1, -(2**63), 100, -100)
EPSILONS_ODD = (float("nan"), float("inf"), float("-inf"), -1e-5, -0.0, 0.0, 2.0**-149, 1e-45, 1e-38, 3.4e38, 1e39,
                1.0, 1e10)
# Unknown attributes a node may carry (ignored by the op) and attribute kinds.
UNKNOWN_ATTRIBUTES = ("epsilon_", "Axis", "stash_type", "simplified", "x" * 300, "")
KINDS = ("int", "float", "ints", "floats", "string")


class _Draws:
    """numpy's generator, and `odd(p)`: whether to draw something the contract rejects, with probability p scaled
    by the case's hostility (0 for a benign case: every input valid, values anywhere in range)."""

    def __init__(self, rng: np.random.Generator, hostility: float):
        self.rng, self.hostility = rng, hostility

    def __getattr__(self, name):
        return getattr(self.rng, name)

    def odd(self, p: float) -> bool:
        return self.rng.random() < min(1.0, p * self.hostility)


def _pick(rng, options, p=None):
    return options[int(rng.choice(len(options), p=p))]


def _dims(rng, rank: int, budget: int = 6000) -> list[int]:
    """A realistic shape of `rank` dims (0, 1, odd, even, row sizes) with at most about `budget` elements."""
    dims = []
    for _ in range(rank):
        dim = _pick(rng, [0, 1, 1, 2, 3, 4, 5, 7, 8, 16, 31, 32, 33, 64, 100, 127, 129, 257, 1000])
        if dim == 0 and rng.random() < 0.7:
            dim = 1
        dims.append(dim)
    while math.prod(max(d, 1) for d in dims) > budget:  # also for an empty shape: its scale may have the rest
        biggest = int(np.argmax(dims))
        dims[biggest] = max(1, dims[biggest] // 3) | 1
    return dims


def _x_shape(rng, tags: list[str]) -> list[int]:
    rank = _pick(rng, [0, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 5, 6, 7, 8])
    tags.append(f"rank{rank}")
    if rank >= 1 and rng.random() < 0.06:
        # An empty tensor whose other dims are huge: its element count is 0, products of the other dims overflow.
        tags.append("huge-empty")
        dims = [_pick(rng, [1, 3, *HUGE_DIMS]) for _ in range(rank)]
        dims[int(rng.integers(rank))] = 0
        return dims
    if rank >= 2 and rng.random() < 0.02:
        # Large enough for the thread pool (over 128 KiB moved), rarely for streaming stores (outputs of 8 MiB).
        tags.append("large")
        cols = _pick(rng, [1024, 1031, 4096])
        rows = _pick(rng, [40, 64, 129]) if rng.random() < 0.8 else 2048 * 1024 // cols
        return [1] * (rank - 2) + [rows, cols]
    return _dims(rng, rank, budget=_pick(rng, [64, 600, 6000]))


def _declared(rng, shape, tags: list[str], what: str):
    """How the model declares a tensor of `shape`: exactly, with symbolic/unknown dims, unknown rank, or wrongly."""
    if rng.odd(0.25):
        mode = _pick(rng, ["wrong-dim", "wrong-rank", "huge"])
    else:
        mode = _pick(rng, ["exact", "symbolic", "unnamed", "rank-unknown"], p=[0.45, 0.25, 0.12, 0.18])
    tags.append(f"{what}-declared-{mode}")
    if mode == "exact":
        return list(shape)
    if mode == "symbolic":
        return [d if rng.random() < 0.4 else _pick(rng, ["B", "S", "H", f"{what}{i}"]) for i, d in enumerate(shape)]
    if mode == "unnamed":
        return [d if rng.random() < 0.5 else None for d in shape]
    if mode == "rank-unknown":
        return None
    if mode == "wrong-dim" and shape:
        declared = list(shape)
        i = int(rng.integers(len(shape)))
        declared[i] = declared[i] + int(rng.integers(1, 5)) if declared[i] < 2**62 else 1
        return declared
    if mode == "huge" and shape:
        return [_pick(rng, [d, *HUGE_DIMS]) for d in shape]
    # wrong rank (or a scalar declared with a dim)
    return list(shape) + [1] if rng.random() < 0.5 or not shape else list(shape)[1:]


def _column_shape(rng, x_shape, axis, tags: list[str], what: str):
    """A scale/bias shape for X: one the contract accepts (per element, broadcast, leading 1s), or not; huge dims
    (of an empty X) become 1, so that the tensor itself stays small."""
    shape = _column_shape_of(rng, x_shape, axis, tags, what)
    while math.prod(shape) > 100000:
        shape[int(np.argmax(shape))] = 1
    return shape


def _column_shape_of(rng, x_shape, axis, tags: list[str], what: str):
    rank = len(x_shape)
    normalized = list(x_shape[axis % rank:]) if rank and -rank <= axis < rank else list(x_shape[-1:])
    if rng.odd(0.3):
        mode = _pick(rng, ["zero", "wrong", "rank-above", "random"])
    else:
        mode = _pick(rng, ["per-element", "trailing", "broadcast", "leading-ones", "one", "scalar"],
                     p=[0.4, 0.15, 0.2, 0.1, 0.1, 0.05])
    tags.append(f"{what}-{mode}")
    if mode == "per-element":
        return normalized
    if mode == "trailing":
        return normalized[int(rng.integers(len(normalized) + 1)):] if normalized else []
    if mode == "broadcast":
        return [d if rng.random() < 0.5 else 1 for d in normalized]
    if mode == "leading-ones":
        return [1] * int(rng.integers(1, 3)) + normalized
    if mode == "one":
        return [1]
    if mode == "scalar":
        return []
    if mode == "zero":
        return [0] if rng.random() < 0.5 else normalized[:-1] + [0]
    if mode == "wrong":
        shape = list(normalized) or [1]
        i = int(rng.integers(len(shape)))
        shape[i] = shape[i] + int(rng.integers(1, 4)) if shape[i] < 2**62 else 1
        return shape
    if mode == "rank-above":
        return [2] + list(x_shape)
    return _dims(rng, int(rng.integers(0, 4)), budget=200)


def _attribute(rng, name: str, kind: str, tags: list[str]):
    """[name, kind, value] of an attribute of any kind."""
    if kind == "int":
        value = int(_pick(rng, [0, 1, 2, -1, 7, *AXES_FAR]))
    elif kind == "float":
        value = float(_pick(rng, list(EPSILONS_ODD)))
    elif kind == "ints":
        value = [int(v) for v in rng.integers(-3, 3, int(rng.integers(0, 3)))]
    elif kind == "floats":
        value = [float(v) for v in rng.standard_normal(int(rng.integers(0, 3)))]
    else:
        value = _pick(rng, ["", "1e-5", "-1", "\u00e9"])
    tags.append(f"attr-{name[:16] or 'empty-name'}-{kind}")
    return [name, kind, value]


def _attributes(rng, op: str, rank: int, tags: list[str]) -> list:
    attributes = []
    # axis: usually valid for the fed rank, else anywhere
    if rng.random() < 0.8:
        if rng.odd(0.3):
            axis = int(rng.integers(-10, 10)) if rng.random() < 0.6 else int(_pick(rng, list(AXES_FAR)))
        else:
            axis = int(rng.integers(-rank, rank)) if rank else -1
        kind = _pick(rng, KINDS) if rng.odd(0.07) else "int"
        attributes.append(["axis", "int", axis] if kind == "int" else _attribute(rng, "axis", kind, tags))
    if rng.random() < 0.6:
        if rng.random() < 0.2 or rng.odd(0.3):
            value = float(_pick(rng, list(EPSILONS_ODD)))
            tags.append("epsilon-odd")
        else:
            value = float(_pick(rng, [1e-5, 1e-6, 1e-12, 0.0, 0.1]))
        kind = _pick(rng, KINDS) if rng.odd(0.07) else "float"
        attributes.append(["epsilon", "float", value] if kind == "float" else _attribute(rng, "epsilon", kind, tags))
    for name, present in (("eps_outside_sqrt", 0.4), ("normalize_float32_sum", 0.4 if op == "SkipRMSNorm" else 0.0)):
        if rng.random() < present or rng.odd(0.05):
            value = int(_pick(rng, [2, -1, 2**31, -(2**63)])) if rng.odd(0.3) else int(rng.integers(0, 2))
            kind = _pick(rng, KINDS) if rng.odd(0.07) else "int"
            attributes.append([name, "int", value] if kind == "int" else _attribute(rng, name, kind, tags))
    if rng.random() < 0.08:
        names = list(UNKNOWN_ATTRIBUTES) if rng.odd(1.0) else list(UNKNOWN_ATTRIBUTES[:-1])  # "": invalid
        attributes.append(_attribute(rng, _pick(rng, names), _pick(rng, KINDS), tags))
        tags.append("attr-unknown")
    return attributes


def _x_dtype(rng, tags):
    name = _pick(rng, list(UNSUPPORTED_NAMES)) if rng.odd(0.06) else _pick(rng, list(FLOAT_NAMES))
    tags.append(f"x-{name}")
    return name


def _column_dtype(rng, x_dtype, tags, what):
    if what == "bias":
        name = _pick(rng, list(DTYPES)) if rng.odd(0.15) else x_dtype
    elif not rng.odd(0.15) and x_dtype in FLOAT_NAMES:
        name = _pick(rng, [s for x, s in sorted(SCALE_PAIRS) if x == x_dtype])
    else:
        name = _pick(rng, list(DTYPES))
    tags.append(f"{what}-{x_dtype}/{name}")
    return name


def _values_kind(rng, tags, what):
    kind = _pick(rng, ["normal", "normal", "normal", "limits", "huge", "tiny", "zeros", "mixed"])
    if kind != "normal":
        tags.append(f"{what}-values-{kind}")
    return kind


def generate(seed: int, index: int) -> dict:
    """Case `index` of the stream of `seed`."""
    rng = np.random.default_rng([seed, index])
    level = _pick(rng, ["benign", "mild", "hostile"], p=[0.4, 0.35, 0.25])
    rng = _Draws(rng, {"benign": 0.0, "mild": 0.5, "hostile": 2.0}[level])
    tags: list[str] = [level]
    op = _pick(rng, list(OPS))
    tags.append(op)
    x_dtype = _x_dtype(rng, tags)
    x_shape = _x_shape(rng, tags)
    rank = len(x_shape)
    attributes = _attributes(rng, op, rank, tags)
    axis = next((a[2] for a in attributes if a[0] == "axis" and a[1] == "int"), -1)

    inputs: list[dict] = []      # graph inputs: name, dtype, declared shape, fed shape (None: not fed), values
    initializers: list[dict] = []
    node_inputs = ["x"]
    inputs.append({"name": "x", "dtype": x_dtype, "declared": _declared(rng, x_shape, tags, "x"), "shape": x_shape,
                   "values": _values_kind(rng, tags, "x")})
    if op == "SkipRMSNorm":
        skip_shape = list(x_shape)
        if rng.odd(0.1):
            skip_shape = _column_shape(rng, x_shape, axis, tags, "skip")
            tags.append("skip-shape-other")
        skip_dtype = _pick(rng, list(DTYPES)) if rng.odd(0.07) else x_dtype
        inputs.append({"name": "skip", "dtype": skip_dtype, "declared": _declared(rng, skip_shape, tags, "skip"),
                       "shape": skip_shape, "values": _values_kind(rng, tags, "skip")})
        node_inputs.append("skip")

    for what, present in (("scale", 0.75), ("bias", 0.5 if op == "SkipRMSNorm" else 0.0)):
        if rng.random() >= present:
            tags.append(f"no-{what}")
            continue
        shape = _column_shape(rng, x_shape, axis, tags, what)
        dtype = _column_dtype(rng, x_dtype, tags, what)
        values = _values_kind(rng, tags, what) if rng.random() < 0.3 else "normal"
        if what == "bias" and len(node_inputs) < 3:
            node_inputs.append("")  # no scale
        node_inputs.append(what)
        if rng.random() < 0.5:
            initializers.append({"name": what, "dtype": dtype, "shape": shape, "values": values})
            tags.append(f"{what}-constant")
        else:
            inputs.append({"name": what, "dtype": dtype, "declared": _declared(rng, shape, tags, what),
                           "shape": shape, "values": values})
            tags.append(f"{what}-input")

    node_outputs = ["y"]
    if op == "SkipRMSNorm" and rng.random() < 0.5:
        node_outputs.append("sum")
        tags.append("sum-output")

    # Structural damage: missing, empty-named, extra, aliased or dangling inputs and outputs.
    if rng.odd(0.15):
        damage = _pick(rng, ["x-empty", "skip-empty", "extra-input", "undefined-input", "y-empty", "extra-output",
                             "y-is-x", "sum-is-skip", "y-is-sum", "sum-empty", "y-is-scale", "no-outputs"])
        tags.append(f"damage-{damage}")
        if damage == "x-empty":
            node_inputs[0] = ""
        elif damage == "skip-empty" and op == "SkipRMSNorm":
            node_inputs[1] = ""
        elif damage == "extra-input":
            while len(node_inputs) < (4 if op == "SkipRMSNorm" else 2):
                node_inputs.append("")
            inputs.append({"name": "extra", "dtype": x_dtype, "declared": list(x_shape), "shape": x_shape,
                           "values": "normal"})
            node_inputs.append("extra")
        elif damage == "undefined-input":
            node_inputs.append("nowhere")
        elif damage == "y-empty":
            node_outputs[0] = ""
        elif damage == "extra-output":
            while len(node_outputs) < (2 if op == "SkipRMSNorm" else 1):
                node_outputs.append("sum")
            node_outputs.append("extra_out")
        elif damage == "y-is-x":
            node_outputs[0] = "x"
        elif damage == "sum-is-skip" and op == "SkipRMSNorm":
            node_outputs[1:] = ["skip"]
        elif damage == "y-is-sum" and op == "SkipRMSNorm":
            node_outputs[1:] = ["y"]
        elif damage == "sum-empty" and op == "SkipRMSNorm":
            node_outputs[1:] = [""]
        elif damage == "y-is-scale" and "scale" in node_inputs:
            node_outputs[0] = "scale"
        elif damage == "no-outputs":
            node_outputs = []

    nodes = [{"op": op, "name": _pick(rng, ["norm0", "norm0", "", "n\u00e9\u00e9d", "a" * 200]),
              "inputs": node_inputs, "outputs": node_outputs, "attributes": attributes}]
    outputs = [name for name in node_outputs if name and name not in {i["name"] for i in inputs}]

    # A small graph: a second norm reads the first one's Y (and SkipRMSNorm's sum as its skip), the first one's
    # outputs exposed as graph outputs or not (then onnxruntime may let the second write into their buffers).
    if rng.random() < 0.25 and node_outputs and node_outputs[0] == "y":
        second_op = "SkipRMSNorm" if op == "SkipRMSNorm" and "sum" in node_outputs else "RMSNorm"
        second_inputs = ["y", "sum"] if second_op == "SkipRMSNorm" else ["y"]
        second_outputs = ["y2", "sum2"] if second_op == "SkipRMSNorm" and rng.random() < 0.5 else ["y2"]
        second_attributes = [["axis", "int", int(rng.integers(-rank, rank)) if rank else -1],
                             ["epsilon", "float", 1e-5]]
        if rng.random() < 0.5 and "scale" in node_inputs:
            second_inputs += ["scale"]  # shared with the first node
        nodes.append({"op": second_op, "name": "norm1", "inputs": second_inputs, "outputs": second_outputs,
                      "attributes": second_attributes})
        exposed = rng.random() < 0.5
        tags.append("chain-exposed" if exposed else "chain-hidden")
        outputs = (outputs if exposed else []) + second_outputs
    return {"id": f"{seed}:{index}", "seed": seed, "index": index, "tags": tags, "nodes": nodes, "inputs": inputs,
            "initializers": initializers, "outputs": outputs, "threads": 2 if "large" in tags else 1}


# ---------------------------------------------------------------------------------------------------------------
# Values and the model


def _limits(dtype: np.dtype) -> list[float]:
    info = ml_dtypes.finfo(dtype) if dtype == BFLOAT16 else np.finfo(dtype)
    tiny = SMALLEST_SUBNORMAL[dtype]
    return [float(info.max), -float(info.max), math.inf, -math.inf, math.nan, tiny, -tiny, float(info.tiny) - tiny,
            float(info.tiny), 0.0, -0.0, 1.0, -1.0]


def values(case: dict, spec: dict) -> np.ndarray:
    """The tensor `spec` (of case) describes: its own stream, seeded from the case and its name."""
    dtype = DTYPES[spec["dtype"]]
    shape = tuple(spec["shape"])
    if math.prod(shape) == 0:
        try:
            return np.zeros(shape, dtype)
        except ValueError:  # numpy refuses empty shapes whose other dims overflow; the worker makes an OrtValue
            return None
    rng = np.random.default_rng([case["seed"], case["index"], sum(map(ord, spec["name"]))])
    kind = spec["values"]
    if dtype not in FLOAT_TYPES:
        if dtype.kind in "iu":
            return np.asarray(rng.integers(0, 3, shape)).astype(dtype)
        return np.asarray(rng.standard_normal(shape) + 0.3).astype(dtype)
    normal = rng.standard_normal(shape) + 0.3
    if kind == "limits":
        pool = np.array(_limits(dtype))
        choice = rng.integers(0, len(pool), shape)
        array = np.where(rng.random(shape) < 0.5, pool[choice], normal)
    elif kind == "huge":
        info = ml_dtypes.finfo(dtype) if dtype == BFLOAT16 else np.finfo(dtype)
        array = np.sign(normal) * float(info.max) * rng.uniform(0.25, 1.0, shape)
    elif kind == "tiny":
        array = np.sign(normal) * SMALLEST_SUBNORMAL[dtype] * rng.integers(0, 8, shape)
    elif kind == "zeros":
        array = np.zeros(shape)
    elif kind == "mixed":
        # rows of different scales: normal, huge, tiny and zero
        magnitude = np.array([1.0, 1e30, 1e-30, 0.0, 1e4, 1e-4])[rng.integers(0, 6, shape[:-1] + (1,) if shape else ())]
        array = normal * magnitude
    else:
        array = normal
    with np.errstate(over="ignore"):
        return np.asarray(array).astype(np.float32).astype(dtype)


def _float32(value: float) -> float:
    """The value of a FLOAT attribute (float32: beyond its range, an infinity)."""
    with np.errstate(over="ignore"):
        return float(np.float32(value))


def _attribute_proto(name: str, kind: str, value) -> AttributeProto:
    attribute = AttributeProto()
    attribute.name = name
    if kind == "int":
        attribute.type, attribute.i = AttributeProto.INT, int(value)
    elif kind == "float":
        attribute.type, attribute.f = AttributeProto.FLOAT, _float32(value)
    elif kind == "ints":
        attribute.type = AttributeProto.INTS
        attribute.ints.extend(value)
    elif kind == "floats":
        attribute.type = AttributeProto.FLOATS
        attribute.floats.extend(value)
    else:
        attribute.type, attribute.s = AttributeProto.STRING, value.encode()
    return attribute


def _value_info(name: str, dtype: str, declared):
    if declared is None:
        return helper.make_tensor_value_info(name, ONNX_TYPES[dtype], None)
    dims = ["" if d is None else d for d in declared]
    info = helper.make_tensor_value_info(name, ONNX_TYPES[dtype], dims)
    for dim, d in zip(info.type.tensor_type.shape.dim, declared):
        if d is None:
            dim.Clear()  # neither value nor name: unknown
    return info


def build(case: dict) -> tuple[onnx.ModelProto, dict]:
    """The case's model and its feeds (numpy arrays, or None for an empty tensor too large for numpy: the worker
    makes an OrtValue of that shape)."""
    nodes = []
    for spec in case["nodes"]:
        node = helper.make_node(spec["op"], spec["inputs"], spec["outputs"], name=spec["name"], domain=DOMAIN)
        node.attribute.extend(_attribute_proto(*a) for a in spec["attributes"])
        nodes.append(node)
    graph_inputs = [_value_info(i["name"], i["dtype"], i["declared"]) for i in case["inputs"]]
    initializers = []
    for spec in case["initializers"]:
        array = values(case, spec)
        if array is None:
            initializers.append(helper.make_tensor(spec["name"], ONNX_TYPES[spec["dtype"]], spec["shape"], b"",
                                                   raw=True))
        else:
            initializers.append(tensor_proto(spec["name"], array))
    x_type = ONNX_TYPES.get(case["inputs"][0]["dtype"], TensorProto.FLOAT)
    graph_outputs = [helper.make_tensor_value_info(name, x_type, None) for name in case["outputs"]]
    graph = helper.make_graph(nodes, "adversarial", graph_inputs, graph_outputs, initializer=initializers)
    model = make_model(graph, [helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])
    feeds = {spec["name"]: values(case, spec) for spec in case["inputs"]}
    return model, feeds


# ---------------------------------------------------------------------------------------------------------------
# The contract (docs/ops.md), judged from the node and the tensors it actually gets


def broadcastable(shape, x_shape, axis: int) -> bool:
    """The scale/bias rule: right-aligned onto X.shape[axis:], each dim equal or 1, extra leading dims 1, rank at most
    X's."""
    normalized = list(x_shape[axis:])
    if len(shape) > len(x_shape):
        return False
    for k in range(1, len(shape) + 1):
        dim = shape[-k]
        if k > len(normalized):
            if dim != 1:
                return False
        elif dim not in (normalized[-k], 1):
            return False
    return True


def judge(node: dict, arrays: dict) -> tuple[str | None, dict]:
    """(None, parameters) when the contract accepts the node with these input tensors ({value name: array or a
    shape-only placeholder}), else (the reason, {}). Parameters: axis (non-negative), epsilon, eps_outside_sqrt,
    normalize_float32_sum, and the input names."""
    op = node["op"]
    skip = op == "SkipRMSNorm"
    names = list(node["inputs"]) + [""] * 4
    x_name = names[0]
    if not x_name or x_name not in arrays:
        return "X missing", {}
    x = arrays[x_name]
    if not node["outputs"] or not node["outputs"][0]:
        return "Y missing", {}
    if len(node["outputs"]) > (2 if skip else 1):
        return "extra output", {}
    if len(set(n for n in node["outputs"] if n)) != len([n for n in node["outputs"] if n]):
        return "outputs share a name", {}
    if any(n in arrays for n in node["outputs"] if n):
        return "an output is an input", {}
    if any(n and n not in arrays for n in node["inputs"]):
        return "input undefined", {}
    if len(node["inputs"]) > (4 if skip else 2):
        return "extra input", {}
    x_dtype = np.dtype(x.dtype)
    if x_dtype not in FLOAT_TYPES:
        return "X type", {}
    shape = tuple(x.shape)
    if not shape:
        return "X scalar", {}
    params = {"axis": -1, "epsilon": 1e-5, "eps_outside_sqrt": 0, "normalize_float32_sum": 0}
    seen = set()
    for name, kind, value in node["attributes"]:
        if not name:
            return "attribute without a name", {}
        if name in seen:
            return "duplicate attribute", {}
        seen.add(name)
        if name == "axis":
            if kind != "int":
                return "axis type", {}
            params["axis"] = value
        elif name == "epsilon":
            if kind != "float":
                return "epsilon type", {}
            params["epsilon"] = _float32(value)
        elif name in ("eps_outside_sqrt", "normalize_float32_sum"):
            if name == "normalize_float32_sum" and not skip:
                return "normalize_float32_sum on RMSNorm", {}
            if kind != "int" or value not in (0, 1):
                return f"{name} value", {}
            params[name] = value
    if not -len(shape) <= params["axis"] < len(shape):
        return "axis range", {}
    params["axis"] %= len(shape)
    epsilon = params["epsilon"]
    if not math.isfinite(epsilon) or epsilon < 0:
        return "epsilon value", {}
    scale_name, bias_name = (names[2], names[3]) if skip else (names[1], "")
    if skip:
        if not names[1]:
            return "skip missing", {}
        s = arrays[names[1]]
        if np.dtype(s.dtype) != x_dtype:
            return "skip type", {}
        if tuple(s.shape) != shape:
            return "skip shape", {}
    for what, name in (("scale", scale_name), ("bias", bias_name)):
        if not name:
            continue
        column = arrays[name]
        pair = (DTYPE_NAMES[x_dtype], DTYPE_NAMES.get(np.dtype(column.dtype), "other"))
        if (what == "scale" and pair not in SCALE_PAIRS) or (what == "bias" and pair[1] != pair[0]):
            return f"{what} type", {}
        if not broadcastable(tuple(column.shape), shape, params["axis"]):
            return f"{what} shape", {}
    params.update(x=x_name, skip=names[1] if skip else "", scale=scale_name, bias=bias_name)
    return None, params


DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}
