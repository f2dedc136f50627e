"""The feeds of a verification run: deterministic arrays for a session's inputs.

Float inputs are standard normal values from a fixed seed. Integer inputs get values that are valid for the
usual meanings of integer inputs: names containing ``mask`` get ones, names containing ``position`` get positions
``0..n-1`` along the last axis, other integers (token ids) are drawn from ``1..15``. Bool inputs named like masks are
all true, other bools random. Symbolic dims get small sizes (``batch``: 2, names containing ``past``: 0, others: 4),
dims spelled as sums or products of other dims (``past_sequence_length + sequence_length``) are computed from
them, and ``dims`` or given input arrays override the defaults.
"""

from __future__ import annotations

import ast
import math
import operator
import os
from typing import Mapping, Sequence

import numpy as np
import onnxruntime as ort

from .runtime import BFLOAT16

DEFAULT_DIM = 4
DEFAULT_BATCH = 2
DEFAULT_SEED = 0
TOKEN_ID_RANGE = (1, 16)  # [low, high): valid for any vocabulary of at least 16 entries
MAX_DIM_SIZE = int(np.iinfo(np.intp).max)
"""The largest size numpy gives a dim (2**63 - 1 on 64-bit machines): a size from a given option, a config or a dim
expression is checked against it before any array is made (a larger one is numpy's "maximum allowed dimension
exceeded"); the memory inputs would take is checked after (:func:`make_inputs`)."""

_ORT_TYPES = {
    "tensor(float)": np.dtype(np.float32),
    "tensor(float16)": np.dtype(np.float16),
    "tensor(bfloat16)": BFLOAT16,
    "tensor(double)": np.dtype(np.float64),
    "tensor(int8)": np.dtype(np.int8),
    "tensor(int16)": np.dtype(np.int16),
    "tensor(int32)": np.dtype(np.int32),
    "tensor(int64)": np.dtype(np.int64),
    "tensor(uint8)": np.dtype(np.uint8),
    "tensor(uint16)": np.dtype(np.uint16),
    "tensor(uint32)": np.dtype(np.uint32),
    "tensor(uint64)": np.dtype(np.uint64),
    "tensor(bool)": np.dtype(np.bool_),
}


class VerifyInputError(Exception):
    """The inputs for verification cannot be made: bad ``dims``/given inputs, or the original model does not run."""


# --- dims ---------------------------------------------------------------------------------------------------------

_DIM_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}


def _dim_expression(name: str, known: Mapping[str, int]) -> int | None:
    """Evaluates a dim spelled as integer arithmetic of other dims (``a + b``, ``2*s0``), or None."""

    def evaluate(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            value = node.value
        elif isinstance(node, ast.Name) and node.id in known:
            value = known[node.id]
        elif isinstance(node, ast.BinOp) and type(node.op) in _DIM_OPERATORS:
            value = _DIM_OPERATORS[type(node.op)](evaluate(node.left), evaluate(node.right))
        else:
            raise ValueError(name)
        if abs(value) > MAX_DIM_SIZE:  # every step bounded: no huge products
            raise ValueError(name)
        return value

    try:
        tree = ast.parse(name, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):  # ValueError: a literal past int's digit limit
        return None
    if isinstance(tree.body, ast.Name):
        return None
    try:
        return evaluate(tree.body)
    except (ValueError, ZeroDivisionError, RecursionError):
        return None


def _default_dim(name: str) -> int:
    lowered = name.lower()
    if "batch" in lowered:
        return DEFAULT_BATCH
    if "past" in lowered:
        return 0
    return DEFAULT_DIM


def _bind_given_dims(inputs: Sequence[ort.NodeArg], given: Mapping[str, np.ndarray], dims: dict[str, int]) -> None:
    """Reads symbolic dim sizes off given input arrays, checking them against the model and against ``dims``."""
    for node_arg in inputs:
        if node_arg.name not in given:
            continue
        array = given[node_arg.name]
        if len(array.shape) != len(node_arg.shape):
            raise VerifyInputError(
                f"input '{node_arg.name}': the given array has shape {list(array.shape)}, the model expects "
                f"rank {len(node_arg.shape)} ({_shape_text(node_arg.shape)})"
            )
        for axis, (dim, size) in enumerate(zip(node_arg.shape, array.shape)):
            if isinstance(dim, int):
                if dim != size:
                    raise VerifyInputError(
                        f"input '{node_arg.name}': the given array has shape {list(array.shape)}, the model expects "
                        f"{_shape_text(node_arg.shape)} (dim {axis} must be {dim})"
                    )
            elif dim:
                if dims.setdefault(dim, size) != size:
                    raise VerifyInputError(
                        f"input '{node_arg.name}': dim {axis} ('{dim}') is {size} in the given array but "
                        f"{dims[dim]} elsewhere"
                    )


def _shape_text(shape: Sequence) -> str:
    return "[" + ", ".join(str(dim) if dim not in (None, "") else "?" for dim in shape) + "]"


def _checked_size(what: str, size) -> int:
    """``size`` as a dim's size: an int from 0 to :data:`MAX_DIM_SIZE`, else :class:`VerifyInputError`."""
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)):
        raise VerifyInputError(f"{what}: the size {size!r} is not an integer")
    size = int(size)
    if not 0 <= size <= MAX_DIM_SIZE:
        shown = size if len(str(abs(size))) <= 30 else f"an integer of {len(str(abs(size)))} digits"
        raise VerifyInputError(f"{what}: the size {shown} is not from 0 to {MAX_DIM_SIZE}")
    return size


def symbolic_dims(inputs: Sequence[ort.NodeArg]) -> list[str]:
    names: list[str] = []
    for node_arg in inputs:
        for dim in node_arg.shape:
            if isinstance(dim, str) and dim and dim not in names:
                names.append(dim)
    return names


def resolve_shapes(
    inputs: Sequence[ort.NodeArg], dims: Mapping[str, int], given: Mapping[str, np.ndarray]
) -> dict[str, tuple[int, ...]]:
    """Concrete shapes for the inputs: static dims as they are, symbolic ones from ``dims``, given arrays, defaults."""
    known = {name: _checked_size(f"--dim {name}", size) for name, size in dims.items()}
    unknown = sorted(set(known) - set(symbolic_dims(inputs)))
    if unknown:
        raise VerifyInputError(
            f"--dim {', '.join(unknown)}: no input has such a dim; the model's symbolic dims are: "
            f"{', '.join(symbolic_dims(inputs)) or '(none)'}"
        )
    _bind_given_dims(inputs, given, known)
    names = symbolic_dims(inputs)
    for name in names:  # plain names first, so that expressions can use them
        if name not in known and name.isidentifier():
            known[name] = _default_dim(name)
    for name in names:
        if name not in known:
            value = _dim_expression(name, known)
            known[name] = value if value is not None and value >= 0 else _default_dim(name)
    shapes = {
        node_arg.name: tuple(
            dim if isinstance(dim, int) else known[dim] if dim else DEFAULT_DIM for dim in node_arg.shape
        )
        for node_arg in inputs
    }
    for node_arg in inputs:  # a model's own static dims too: -1 is how some exporters write a dynamic one
        for axis, size in enumerate(shapes[node_arg.name]):
            _checked_size(f"input '{node_arg.name}', dim {axis}", size)
    return shapes


# --- inputs -------------------------------------------------------------------------------------------------------


def _integer_values(name: str, shape: tuple[int, ...], dtype: np.dtype, rng: np.random.Generator) -> np.ndarray:
    lowered = name.lower()
    if "mask" in lowered:
        return np.ones(shape, dtype)
    if "position" in lowered and shape:
        return np.broadcast_to(np.arange(shape[-1], dtype=dtype), shape).copy()
    return rng.integers(*TOKEN_ID_RANGE, size=shape).astype(dtype)


def make_input(name: str, shape: tuple[int, ...], dtype: np.dtype, rng: np.random.Generator) -> np.ndarray:
    """A deterministic array for one input (see the module docstring)."""
    if dtype == np.bool_:
        return np.ones(shape, np.bool_) if "mask" in name.lower() else rng.integers(0, 2, size=shape).astype(np.bool_)
    if np.issubdtype(dtype, np.integer):
        return _integer_values(name, shape, dtype, rng)
    return rng.standard_normal(shape).astype(dtype)


def _input_dtype(node_arg: ort.NodeArg) -> np.dtype:
    try:
        return _ORT_TYPES[node_arg.type]
    except KeyError:
        raise VerifyInputError(
            f"input '{node_arg.name}' has type {node_arg.type}, for which no inputs can be generated"
        ) from None


def _coerce_given(name: str, array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if dtype == BFLOAT16 and array.dtype == np.dtype("V2"):
        return array.view(BFLOAT16)  # np.save writes ml_dtypes.bfloat16 arrays as raw 2-byte records
    if dtype == BFLOAT16 and array.dtype == np.float32:
        return array.astype(BFLOAT16)
    if array.dtype != dtype:
        raise VerifyInputError(f"input '{name}': the given array is {array.dtype}, the model expects {dtype}")
    return array


def _gib(size: int) -> str:
    gib = size / 2**30
    return f"{gib:,.0f} GiB" if gib >= 1000 else f"{gib:.3g} GiB"


def _check_generated_size(inputs: Sequence[ort.NodeArg], shapes: Mapping[str, tuple[int, ...]],
                          given: Mapping[str, np.ndarray]) -> None:
    """Refuses inputs that would take more than a quarter of the machine's memory (both models' activations need
    the rest), before numpy tries to allocate them."""
    sizes = {node_arg.name: math.prod(shapes[node_arg.name]) * _input_dtype(node_arg).itemsize
             for node_arg in inputs if node_arg.name not in given}
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows): no limit
        return
    if sum(sizes.values()) > memory // 4:
        largest = max(sizes, key=sizes.get)
        raise VerifyInputError(
            f"the generated inputs would take {_gib(sum(sizes.values()))} (input '{largest}' of shape "
            f"{list(shapes[largest])}: {_gib(sizes[largest])}), more than a quarter of this machine's "
            f"{_gib(memory)}; choose smaller sizes with --dim"
        )


def make_inputs(
    inputs: Sequence[ort.NodeArg],
    *,
    dims: Mapping[str, int] | None = None,
    given: Mapping[str, np.ndarray] | None = None,
    seed: int = DEFAULT_SEED,
) -> dict[str, np.ndarray]:
    """Deterministic feeds for a session's ``inputs``; ``given`` arrays are used as they are."""
    given = dict(given or {})
    unknown = sorted(set(given) - {node_arg.name for node_arg in inputs})
    if unknown:
        raise VerifyInputError(
            f"--input {', '.join(unknown)}: the model has no such input; its inputs are: "
            f"{', '.join(node_arg.name for node_arg in inputs) or '(none)'}"
        )
    given = {node_arg.name: _coerce_given(node_arg.name, given[node_arg.name], _input_dtype(node_arg))
             for node_arg in inputs if node_arg.name in given}
    shapes = resolve_shapes(inputs, dims or {}, given)
    _check_generated_size(inputs, shapes, given)
    rng = np.random.default_rng(seed)
    return {
        node_arg.name: given[node_arg.name]
        if node_arg.name in given
        else make_input(node_arg.name, shapes[node_arg.name], _input_dtype(node_arg), rng)
        for node_arg in inputs
    }


def load_npy_inputs(files: Mapping[str, str | os.PathLike]) -> dict[str, np.ndarray]:
    """Reads ``--input name=file.npy`` arrays, with clear errors."""
    arrays = {}
    for name, path in files.items():
        try:
            arrays[name] = np.load(path, allow_pickle=False)
        except FileNotFoundError:
            raise VerifyInputError(f"--input {name}={path}: no such file") from None
        except (OSError, ValueError) as error:
            raise VerifyInputError(f"--input {name}={path}: not a readable .npy array ({error})") from None
        if not isinstance(arrays[name], np.ndarray):
            raise VerifyInputError(f"--input {name}={path}: holds several arrays (.npz); give one .npy per input")
    return arrays
