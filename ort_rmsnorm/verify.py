"""Checking that a fused model computes what the original computes.

Both models run in onnxruntime with our library registered and the same session options, on the same deterministic
inputs, and every output is compared with a tolerance that depends on its dtype.

Inputs: float inputs are standard normal values from a fixed seed. Integer inputs get values that are valid for the
usual meanings of integer inputs: names containing ``mask`` get ones, names containing ``position`` get positions
``0..n-1`` along the last axis, other integers (token ids) are drawn from ``1..15``. Bool inputs named like masks are
all true, other bools random. Symbolic dims get small sizes (``batch``: 2, names containing ``past``: 0, others: 4),
dims spelled as sums or products of other dims (``past_sequence_length + sequence_length``) are computed from
them, and ``dims`` or given input arrays override the defaults.

Tolerance: an output element passes when ``|fused - original| <= rtol_T * (|original| + rms(original))``, where
``rms`` is the root mean square of the original output's finite values. The fused op rounds once where an unfused
float16/bfloat16 graph rounds twice (README, "Numerics"), so the two differ by about one unit in the last place of
``T`` at the norm, and downstream layers carry that difference on in proportion to the typical size of their
outputs, hence the ``rms`` term; it grows slowly with depth. ``rtol_T`` is 8 units in the last place at 1 (ulp:
2^-10 for float16, 2^-7 for bfloat16), i.e. 2^-7 and 2^-4. Measured on Llama-style float16 models (hidden 256, 32
tokens), the largest difference is 1.2 ulp after 1 decoder layer and 3.1 ulp after 16. For float32, 2^-14 also
covers the float32 rounding of the unfused graph's several ops; measured: at most 4e-6 after 16 layers. NaN and
infinities must sit at the same places with the same signs. Integer and bool outputs must be equal.

``T`` is the least precise of the output's dtype and the float types the original model computes in
(:func:`ort_rmsnorm.model_types.computed_dtypes`): a float16 model whose logits are cast to float32 at the end carries
float16 differences into its float32 output, and a float64 output computed in float32 carries float32 ones.
"""

from __future__ import annotations

import ast
import dataclasses
import math
import operator
import os
from typing import Mapping, Sequence

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from . import runtime
from .contract import OPTIMIZATION_LEVEL_NAMES
from .model_io import load_model, one_line
from .model_types import computed_dtypes

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)

# Relative tolerance per output dtype (see the module docstring).
RELATIVE_TOLERANCE = {
    np.dtype(np.float64): 2.0**-40,
    np.dtype(np.float32): 2.0**-14,
    np.dtype(np.float16): 2.0**-7,
    BFLOAT16: 2.0**-4,
}

DEFAULT_DIM = 4
DEFAULT_BATCH = 2
DEFAULT_SEED = 0
TOKEN_ID_RANGE = (1, 16)  # [low, high): valid for any vocabulary of at least 16 entries

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

OPTIMIZATION_LEVELS = dict(zip(OPTIMIZATION_LEVEL_NAMES, (
    ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
), strict=True))


# onnxruntime's Python exceptions (Fail, InvalidArgument, InvalidGraph, ...) derive from Exception directly.
_ORT_ERRORS = (RuntimeError,) + tuple(
    error
    for error in vars(ort.capi.onnxruntime_pybind11_state).values()
    if isinstance(error, type) and issubclass(error, Exception)
)


class VerifyInputError(Exception):
    """The inputs for verification cannot be made: bad ``dims``/given inputs, or the original model does not run."""


class FusedModelError(Exception):
    """The fused model cannot be loaded or run where the original can: a verification failure."""


@dataclasses.dataclass
class OutputComparison:
    name: str
    dtype: str
    shape: tuple
    max_abs: float
    max_rel: float
    tolerance: float | None  # None: compared exactly
    problem: str | None = None  # why it failed beyond the numbers (shape, dtype, NaN placement)
    arithmetic: str | None = None  # the model's float type that set the tolerance, where it is not the output's

    @property
    def ok(self) -> bool:
        return self.problem is None and (self.tolerance is None or self.max_rel <= self.tolerance)

    def describe(self) -> str:
        verdict = "ok" if self.ok else "MISMATCH"
        head = f"output '{self.name}' {self.dtype} {list(self.shape)}"
        if self.problem is not None:
            return f"{head}: {verdict}: {self.problem}"
        if 0 in self.shape:
            return f"{head}: empty, nothing to compare: {verdict}"
        if self.tolerance is None:
            return f"{head}: equal: {verdict}"
        basis = f" for the model's {self.arithmetic} arithmetic" if self.arithmetic else ""
        return (f"{head}: max abs {self.max_abs:.3g}, max rel {self.max_rel:.3g} (tolerance {self.tolerance:.3g}"
                f"{basis}): {verdict}")


@dataclasses.dataclass
class VerifyResult:
    inputs: dict[str, tuple[str, tuple]]  # name -> (dtype, shape) of the inputs used
    outputs: list[OutputComparison]

    @property
    def ok(self) -> bool:
        return all(output.ok for output in self.outputs)

    def describe(self) -> str:
        feeds = ", ".join(f"{name} {dtype} {list(shape)}" for name, (dtype, shape) in self.inputs.items())
        lines = [f"inputs: {feeds or '(none)'}", *(output.describe() for output in self.outputs)]
        matched = sum(output.ok for output in self.outputs)
        lines.append(
            f"verify: {'all' if self.ok else matched} of {len(self.outputs)} outputs match"
            + ("" if self.ok else f"; {len(self.outputs) - matched} MISMATCH")
        )
        return "\n".join(lines)


# --- dims ---------------------------------------------------------------------------------------------------------

_DIM_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}


def _dim_expression(name: str, known: Mapping[str, int]) -> int | None:
    """Evaluates a dim spelled as integer arithmetic of other dims (``a + b``, ``2*s0``), or None."""

    def evaluate(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name) and node.id in known:
            return known[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _DIM_OPERATORS:
            return _DIM_OPERATORS[type(node.op)](evaluate(node.left), evaluate(node.right))
        raise ValueError(name)

    try:
        tree = ast.parse(name, mode="eval")
    except SyntaxError:
        return None
    if isinstance(tree.body, ast.Name):
        return None
    try:
        return evaluate(tree.body)
    except (ValueError, ZeroDivisionError):
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
    known = {name: int(size) for name, size in dims.items()}
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
    return {
        node_arg.name: tuple(
            dim if isinstance(dim, int) else known[dim] if dim else DEFAULT_DIM for dim in node_arg.shape
        )
        for node_arg in inputs
    }


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


# --- comparison ---------------------------------------------------------------------------------------------------


def arithmetic_dtype(model: ir.Model) -> np.dtype | None:
    """The least precise float type among those the model computes in, or None when it computes in none of
    :data:`RELATIVE_TOLERANCE`'s types."""
    floats = [dtype for dtype in map(_numpy_dtype, computed_dtypes(model)) if dtype in RELATIVE_TOLERANCE]
    return max(floats, key=RELATIVE_TOLERANCE.__getitem__, default=None)


def _numpy_dtype(dtype: ir.DataType) -> np.dtype | None:
    try:
        return np.dtype(dtype.numpy())
    except TypeError:  # no numpy equivalent (UNDEFINED; types older onnx_ir releases cannot map)
        return None


def compare(name: str, original: np.ndarray, fused: np.ndarray, arithmetic: np.dtype | None = None) -> OutputComparison:
    """Compares one output of the fused model with the original's (see the module docstring for the criterion).

    ``arithmetic``: the least precise float type the original model computes in (:func:`arithmetic_dtype`); a float
    output's tolerance is that type's where it is looser than the output's own.
    """
    dtype = original.dtype
    comparison = OutputComparison(name, str(dtype), original.shape, 0.0, 0.0, RELATIVE_TOLERANCE.get(dtype))
    looser = RELATIVE_TOLERANCE.get(arithmetic, 0.0)
    if comparison.tolerance is not None and looser > comparison.tolerance:
        comparison.tolerance, comparison.arithmetic = looser, str(arithmetic)
    if fused.dtype != dtype:
        comparison.problem = f"dtype changed: original {dtype}, fused {fused.dtype}"
        return comparison
    if fused.shape != original.shape:
        comparison.problem = f"shape changed: original {list(original.shape)}, fused {list(fused.shape)}"
        return comparison
    if original.size == 0:
        return comparison
    if comparison.tolerance is None:  # integers, bools, strings
        differing = int(np.count_nonzero(original != fused))
        if differing:
            comparison.problem = f"{differing} of {original.size} elements differ (compared exactly)"
        return comparison
    reference = original.astype(np.float64)
    candidate = fused.astype(np.float64)
    finite = np.isfinite(reference)
    same_special = (np.isnan(reference) == np.isnan(candidate)).all() and (
        reference[~finite & ~np.isnan(reference)] == candidate[~finite & ~np.isnan(reference)]
    ).all()
    if not same_special or not np.isfinite(candidate[finite]).all():
        comparison.problem = "NaN or infinity at different places"
        return comparison
    if not finite.any():
        return comparison
    error = np.abs(candidate[finite] - reference[finite])
    magnitude = np.abs(reference[finite])
    rms = float(np.sqrt(np.mean(magnitude**2)))
    floor = max(rms, float(ml_dtypes.finfo(dtype).smallest_subnormal))
    comparison.max_abs = float(error.max())
    comparison.max_rel = float(np.max(error / (magnitude + floor)))
    return comparison


# --- running ------------------------------------------------------------------------------------------------------


def _session(model: str | os.PathLike | onnx.ModelProto, optimization: str, threads: int | None):
    options = ort.SessionOptions()
    options.log_severity_level = 3  # errors only: no shape-annotation warnings in the verdict's output
    return runtime.make_session(
        model if isinstance(model, onnx.ModelProto) else str(model),
        optimization=OPTIMIZATION_LEVELS[optimization],
        threads=threads,
        options=options,
    )


def _interface(session: ort.InferenceSession) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    return (
        [(node_arg.name, node_arg.type) for node_arg in session.get_inputs()],
        [(node_arg.name, node_arg.type) for node_arg in session.get_outputs()],
    )


def _model_name(model) -> str:
    return str(model) if not isinstance(model, onnx.ModelProto) else "the model"


def _load(model: str | os.PathLike | onnx.ModelProto) -> ir.Model:
    """The model's graph (external data stays on disk); clear errors for missing, corrupted or invalid files."""
    return ir.serde.deserialize_model(model) if isinstance(model, onnx.ModelProto) else load_model(model)


def verify(
    original: str | os.PathLike | onnx.ModelProto,
    fused: str | os.PathLike | onnx.ModelProto,
    *,
    dims: Mapping[str, int] | None = None,
    inputs: Mapping[str, np.ndarray] | None = None,
    seed: int = DEFAULT_SEED,
    optimization: str = "all",
    threads: int | None = None,
) -> VerifyResult:
    """Runs ``original`` and ``fused`` on the same deterministic inputs and compares every output.

    Raises :class:`~ort_rmsnorm.model_io.ModelFileError` for unreadable files, :class:`VerifyInputError` when no
    valid inputs can be made or the original does not run, and :class:`FusedModelError` when the fused model does not
    load or run while the original does.
    """
    arithmetic = arithmetic_dtype(_load(original))
    if not isinstance(fused, onnx.ModelProto):
        load_model(fused)  # clear errors for a missing, corrupted or invalid file
    try:
        original_session = _session(original, optimization, threads)
    except _ORT_ERRORS as error:
        raise VerifyInputError(f"{_model_name(original)}: onnxruntime cannot load it: {one_line(error)}") from None
    try:
        fused_session = _session(fused, optimization, threads)
    except _ORT_ERRORS as error:
        raise FusedModelError(f"{_model_name(fused)}: onnxruntime cannot load it: {one_line(error)}") from None
    if _interface(original_session) != _interface(fused_session):
        raise FusedModelError(
            f"the fused model's inputs/outputs {_interface(fused_session)} differ from the original's "
            f"{_interface(original_session)}"
        )
    feeds = make_inputs(original_session.get_inputs(), dims=dims, given=inputs, seed=seed)
    try:
        expected = runtime.run(original_session, feeds)
    except _ORT_ERRORS as error:
        raise VerifyInputError(
            f"{_model_name(original)}: onnxruntime failed on the generated inputs ({_feeds_text(feeds)}): "
            f"{one_line(error)}. Set symbolic dims with --dim NAME=SIZE or give arrays with --input NAME=FILE.npy"
        ) from None
    try:
        actual = runtime.run(fused_session, feeds)
    except _ORT_ERRORS as error:
        raise FusedModelError(
            f"{_model_name(fused)}: onnxruntime failed where the original ran ({_feeds_text(feeds)}): "
            f"{one_line(error)}"
        ) from None
    names = [node_arg.name for node_arg in original_session.get_outputs()]
    return VerifyResult(
        inputs={name: (str(array.dtype), array.shape) for name, array in feeds.items()},
        outputs=[compare(name, want, got, arithmetic) for name, want, got in zip(names, expected, actual)],
    )


def _feeds_text(feeds: Mapping[str, np.ndarray]) -> str:
    return ", ".join(f"{name}: {array.dtype} {list(array.shape)}" for name, array in feeds.items())
