"""The per-norm check of ``verify``: each norm op of the fused model against a float64 evaluation of its definition.

The pass keeps names: a fused norm's outputs (``Y``, and a residual op's ``sum``) keep the names the original
subgraph's outputs had, and its inputs are values of the original too. So for each norm node of the fused model's main
graph (ours, onnxruntime's and ONNX's norm ops, and ``LayerNormalization``; not one the original holds unchanged)
both models get the node's inputs and outputs as extra graph outputs and run once more on the same feeds. For each
norm:

(a) the fused op's output against the definition evaluated in float64 from the fused node's own inputs: the kernel's
    accuracy, in units in the last place (ulps) of its type ``T``;
(b) the original's value of the same name against the same definition evaluated from the original's own values of
    the node's inputs (so that rounding upstream, amplified or not, does not count against this norm), within
    :data:`ORIGINAL_ULPS`: what a decomposed subgraph in ``T`` rounds. An input the pass made (the original has no
    such value) is taken from the fused model, and the norm then measured at each row's RMS within twice that.

Where (b) fails, the definition is evaluated again with one part of its meaning changed (epsilon refitted, in either
placement; other trailing axes; mean-centred; the scale dropped, ``1 + w``, another norm's, or any per-column scale;
the residual sum) and the verdict names the part the original matches.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Callable, Mapping, Sequence

import ml_dtypes
import numpy as np
import onnx
from onnx import numpy_helper

from .contract import (
    AXIS,
    DEFAULT_EPSILON,
    EPS_OUTSIDE_SQRT,
    EPSILON,
    MS_DOMAIN,
    NORMALIZE_FLOAT32_SUM,
    ONNX_DOMAINS,
    ONNX_RMSNORM,
    OP_DOMAIN,
    ORT_SIMPLIFIED_LAYER_NORM,
    ORT_SKIP_DEFAULT_EPSILON,
    ORT_SKIP_SIMPLIFIED_LAYER_NORM,
    RMSNORM,
    SKIP_RMSNORM,
    qualified,
)
from .model.read import one_line

LAYER_NORMALIZATION = "LayerNormalization"
SKIP_LAYER_NORMALIZATION = "SkipLayerNormalization"


@dataclasses.dataclass(frozen=True)
class _OpSignature:
    """Where a norm op keeps its inputs and outputs (indices; None: it has none) and how it computes."""

    x: int = 0
    skip: int | None = None
    scale: int | None = 1
    bias: int | None = None  # added to the residual sum
    offset: int | None = None  # LayerNorm's B, added after the scale
    sum: int | None = None
    centred: bool = False
    float32_sum: bool | None = None  # None: the node's normalize_float32_sum attribute says
    default_epsilon: float = DEFAULT_EPSILON
    has_placement: bool = False


NORM_SIGNATURES: dict[tuple[str, str], _OpSignature] = {
    (OP_DOMAIN, RMSNORM): _OpSignature(has_placement=True),
    (OP_DOMAIN, SKIP_RMSNORM): _OpSignature(skip=1, scale=2, bias=3, sum=1, float32_sum=None, has_placement=True),
    ("", ONNX_RMSNORM): _OpSignature(),
    ("", ORT_SIMPLIFIED_LAYER_NORM): _OpSignature(),
    (MS_DOMAIN, ORT_SKIP_SIMPLIFIED_LAYER_NORM): _OpSignature(skip=1, scale=2, bias=3, sum=3, float32_sum=True,
                                                              default_epsilon=ORT_SKIP_DEFAULT_EPSILON),
    ("", LAYER_NORMALIZATION): _OpSignature(offset=2, centred=True),
    (MS_DOMAIN, SKIP_LAYER_NORMALIZATION): _OpSignature(skip=1, scale=2, offset=3, bias=4, sum=3, centred=True,
                                                        float32_sum=True, default_epsilon=ORT_SKIP_DEFAULT_EPSILON),
}
"""The norm ops the check evaluates, by (domain, op type); ONNX's domain is spelled ``""``."""

ORIGINAL_ULPS = {
    np.dtype(np.float64): 16.0,
    np.dtype(np.float32): 16.0,
    np.dtype(np.float16): 4.0,
    np.dtype(ml_dtypes.bfloat16): 4.0,
}
"""How far (ulps of ``T``, per element) the original's value may be from the definition. A decomposed subgraph
rounds after each op (square, mean, epsilon, root, reciprocal, two products, the 16-bit graphs' casts) and its
ReduceMean sums a row in its own order; a residual ``Add`` in ``T`` is within an ulp of its largest term, not of the
sum (which may cancel), so a residual norm's elements are measured at the size of their terms. Measured on the
project's models with each kernel set (``docs/fusion.md``, "The per-norm check"): float32 at most 4.2 ulps (rows of
4096; 3.2 on Llama-style models), float16 and bfloat16 at most 2.1 (onnxruntime's float16 ``Add`` is not always
correctly rounded). A semantic change is far outside: epsilon 1e-6 -> 1e-5 moves a float32 output by about
4.5e-6 / ms relative (70 ulps in the test model), a scale of 1 + 1e-5 * N(0, 1) dropped by up to ~3e-5 (hundreds)."""

CONTRACT_RELATIVE = {
    np.dtype(np.float32): 2.0**-24 + 40 * 2.0**-24,
    np.dtype(np.float16): 2.0**-11 + 40 * 2.0**-24,
    np.dtype(ml_dtypes.bfloat16): 2.0**-8 + 40 * 2.0**-24,
}
"""Our op's bound against the float64 definition (docs/ops.md, "Numerics"): one rounding to ``T`` plus a few float32
roundings, relative; the absolute floor is the smallest subnormal of ``T`` plus ``2^-149 * |scale|``."""

AMPLIFYING_OPS = frozenset({
    "DynamicQuantizeLinear", "QuantizeLinear", "MatMulInteger", "ConvInteger", "QLinearMatMul", "QLinearConv",
    "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QAttention", "QGemm", "DynamicQuantizeLSTM",
    "ArgMax", "ArgMin", "TopK", "Round", "Floor", "Ceil", "Sign", "Greater", "Less", "GreaterOrEqual",
    "LessOrEqual", "Equal", "Mod",
})
"""Op types that are discontinuous in a float input or quantize it: a one-ulp change there may move their output by
a whole step (an int8 rounding, a quantization scale, another index). ``MatMulNBits`` with ``accuracy_level`` 4
(int8 activations) and a ``Cast`` to an integer type count too (:func:`amplifying_ops`)."""

_INTEGER_TYPES = {onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.INT16, onnx.TensorProto.UINT16,
                  onnx.TensorProto.INT32, onnx.TensorProto.UINT32, onnx.TensorProto.INT64, onnx.TensorProto.UINT64,
                  onnx.TensorProto.BOOL}


# --- the norm nodes of a fused model -------------------------------------------------------------------------------


@dataclasses.dataclass
class NormSite:
    """One norm node of the fused model and what its definition needs."""

    node: str  # the node's name (or its output's, when it has none)
    op: str  # as the fusion report names it
    signature: _OpSignature
    axis: int
    epsilon: float
    eps_outside: bool
    float32_sum: bool
    x: str
    skip: str | None
    scale: str | None
    bias: str | None
    offset: str | None
    y: str
    sum: str | None
    constants: dict[str, np.ndarray]  # the inputs that are initializers or Constant outputs
    key: tuple = ()  # the node as :func:`node_key` writes it


def node_key(node: onnx.NodeProto) -> tuple:
    """What a node computes from what: its op, inputs, outputs and attributes (not its name)."""
    return ("" if node.domain in ONNX_DOMAINS else node.domain, node.op_type, tuple(node.input), tuple(node.output),
            tuple(sorted(attribute.SerializeToString(deterministic=True) for attribute in node.attribute)))


def _attribute(node: onnx.NodeProto, name: str, default):
    for attribute in node.attribute:
        if attribute.name == name:
            return onnx.helper.get_attribute_value(attribute)
    return default


def _constants(graph: onnx.GraphProto) -> dict[str, onnx.TensorProto]:
    found = {tensor.name: tensor for tensor in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ONNX_DOMAINS and len(node.output) == 1:
            value = next((attribute.t for attribute in node.attribute if attribute.name == "value"), None)
            if value is not None:
                found[node.output[0]] = value
    return found


def find_norms(model: onnx.ModelProto, base_dir: str = "") -> list[NormSite]:
    """The norm nodes of ``model``'s main graph, in graph order."""
    constants = _constants(model.graph)
    sites = []
    for node in model.graph.node:
        domain = "" if node.domain in ONNX_DOMAINS else node.domain
        signature = NORM_SIGNATURES.get((domain, node.op_type))
        if signature is None or not node.output or not node.output[0]:
            continue

        def name(index: int | None, names: Sequence[str]) -> str | None:
            return names[index] if index is not None and index < len(names) and names[index] else None

        inputs = {what: name(getattr(signature, what), node.input) for what in ("x", "skip", "scale", "bias", "offset")}
        if inputs["x"] is None:
            continue
        float32_sum = signature.float32_sum
        if float32_sum is None:
            float32_sum = bool(_attribute(node, NORMALIZE_FLOAT32_SUM, 0))
        sites.append(NormSite(
            node=node.name or node.output[0],
            op=qualified(node.domain, node.op_type),
            signature=signature,
            axis=int(_attribute(node, AXIS, -1)),
            epsilon=float(_attribute(node, EPSILON, signature.default_epsilon)),
            eps_outside=bool(_attribute(node, EPS_OUTSIDE_SQRT, 0)) if signature.has_placement else False,
            float32_sum=float32_sum,
            **inputs,
            y=node.output[0],
            sum=name(signature.sum, node.output),
            constants={value: numpy_helper.to_array(constants[value], base_dir)
                       for value in inputs.values() if value is not None and value in constants},
            key=node_key(node),
        ))
    return sites


def amplifying_ops(model: onnx.ModelProto, starts: Sequence[str]) -> list[str]:
    """The op types of :data:`AMPLIFYING_OPS` (and int8 ``MatMulNBits``, integer ``Cast``) that the values
    ``starts`` reach in the main graph, in the order first reached."""
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for value in node.input:
            consumers.setdefault(value, []).append(node)
    seen_values, found = set(starts), []
    frontier = list(starts)
    while frontier:
        value = frontier.pop(0)
        for node in consumers.get(value, []):
            label = _amplifying_label(node)
            if label is not None and label not in found:
                found.append(label)
            for output in node.output:
                if output and output not in seen_values:
                    seen_values.add(output)
                    frontier.append(output)
    return found


def _amplifying_label(node: onnx.NodeProto) -> str | None:
    if node.op_type in AMPLIFYING_OPS:
        return node.op_type
    if node.op_type == "MatMulNBits" and int(_attribute(node, "accuracy_level", 0)) == 4:
        return "MatMulNBits (accuracy_level 4: int8 activations)"
    if node.op_type == "Cast" and node.domain in ONNX_DOMAINS and _attribute(node, "to", 0) in _INTEGER_TYPES:
        return "Cast to integer"
    return None


def exposed(model: onnx.ModelProto, names: Sequence[str]) -> tuple[onnx.ModelProto, list[str]]:
    """A copy of ``model`` with those of ``names`` that its main graph computes (node outputs) as extra outputs;
    returns the copy and the names it outputs now (graph outputs included)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    computed = {output for node in copy.graph.node for output in node.output if output}
    outputs = {output.name for output in copy.graph.output}
    added = []
    for name in dict.fromkeys(names):
        if name in computed and name not in outputs:
            copy.graph.output.append(onnx.ValueInfoProto(name=name))
            outputs.add(name)
            added.append(name)
    return copy, [name for name in dict.fromkeys(names) if name in outputs]


# --- the definition in float64 -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Definition:
    """The meaning of one norm: what the float64 evaluation computes."""

    axis: int
    epsilon: float
    eps_outside: bool
    centred: bool
    float32_sum: bool


def evaluate(definition: Definition, dtype: np.dtype, x: np.ndarray, skip: np.ndarray | None,
             scale: np.ndarray | None, bias: np.ndarray | None, offset: np.ndarray | None,
             normalized_input: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """``(Y, sum, size)`` of the definition in float64 (``sum`` rounded to ``dtype``, as the op stores it; None
    without a residual). ``normalized_input``: normalize this instead of the residual sum. ``size``: the magnitude
    each element of Y is rounded at, its terms' (:func:`term_size`)."""
    base, total = normalized(definition, dtype, x, skip, bias)
    if normalized_input is not None:
        base = normalized_input.astype(np.float64)
    rank = base.ndim
    axes = tuple(range(definition.axis % rank if rank else 0, rank))
    centre = np.mean(base, axis=axes, keepdims=True) if definition.centred else 0.0
    base = base - centre
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ms = np.mean(base**2, axis=axes, keepdims=True)
        factor = (1.0 / (np.sqrt(ms) + definition.epsilon) if definition.eps_outside
                  else 1.0 / np.sqrt(ms + definition.epsilon))
        y = base * factor
        if scale is not None:
            y = y * scale.astype(np.float64)
        # An input below T's normal range holds only its subnormal spacing (onnxruntime may drop a Cast pair and
        # hand the original's norm more than that): its elements are measured as if at T's smallest normal.
        size = np.maximum(np.abs(y), float(ml_dtypes.finfo(dtype).smallest_normal) * factor
                          * (1.0 if scale is None else np.abs(scale.astype(np.float64))))
        if definition.centred:  # x - mean rounds at the size of x, not of the difference
            size = np.maximum(size, np.abs((base + centre) * factor
                                           * (1.0 if scale is None else scale.astype(np.float64))))
        if skip is not None and normalized_input is None:
            size = np.maximum(size, np.abs(term_size(x, skip, bias) * factor
                                           * (1.0 if scale is None else scale.astype(np.float64))))
        if offset is not None:
            y = y + offset.astype(np.float64)
            size = np.maximum(np.abs(y), size)
    return y, total, size


def term_size(x: np.ndarray, skip: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """The largest of a residual sum's terms at each element: a sum rounded in ``T`` (an ``Add`` of the graph) is
    within an ulp of that, not of the sum, which may cancel."""
    size = np.maximum(np.abs(x.astype(np.float64)), np.abs(skip.astype(np.float64)))
    return size if bias is None else np.maximum(size, np.abs(bias.astype(np.float64)))


def normalized(definition: Definition, dtype: np.dtype, x: np.ndarray, skip: np.ndarray | None,
               bias: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
    """What the norm normalizes (float64) and the residual sum rounded to ``dtype`` (None without a residual): the
    sum ``(x + skip) + bias`` is formed in float32, each addition rounded (docs/ops.md)."""
    if skip is None:
        return x.astype(np.float64), None
    s = x.astype(np.float32) + skip.astype(np.float32)
    if bias is not None:
        s = s + bias.astype(np.float32)
    total = s.astype(dtype).astype(np.float64)
    return (s.astype(np.float64) if definition.float32_sum else total), total


def ulp(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The unit in the last place of ``dtype`` at each of ``values`` (float64), never below its smallest
    subnormal."""
    info = ml_dtypes.finfo(dtype)
    _, exponent = np.frexp(np.abs(values))
    units = np.ldexp(1.0, exponent - 1 - int(info.nmant))
    return np.maximum(units, float(info.smallest_subnormal))


def ulps(candidate: np.ndarray, reference: np.ndarray, dtype: np.dtype, size: np.ndarray | None = None) -> float:
    """The largest distance of ``candidate`` from ``reference`` in ulps of ``dtype`` at the reference (or at
    ``size`` where larger); inf where NaN/infinities differ in place."""
    candidate = np.asarray(candidate, dtype=np.float64)
    if candidate.shape != reference.shape:
        return float("inf")
    finite = np.isfinite(reference)
    if (np.isnan(reference) != np.isnan(candidate)).any() or (
            candidate[~finite & ~np.isnan(reference)] != reference[~finite & ~np.isnan(reference)]).any():
        return float("inf")
    if not finite.any():
        return 0.0
    if not np.isfinite(candidate[finite]).all():
        return float("inf")
    at = np.abs(reference) if size is None else np.maximum(np.abs(reference), np.broadcast_to(size, reference.shape))
    return float(np.max(np.abs(candidate[finite] - reference[finite]) / ulp(at[finite], dtype)))


# --- one norm's verdict --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class NormVerdict:
    node: str
    op: str
    dtype: str
    kernel_ulps: float | None  # (a): the fused output against the definition
    kernel_bound_ok: bool
    original_ulps: float | None  # (b): the original's value against the definition; None: not compared
    tolerance: float
    sum_ulps: float | None = None  # (b) for a residual op's sum output, where both models have it
    difference: str | None = None  # what part of the meaning differs, when (b) fails
    note: str | None = None  # why (b) was not compared, or what it was compared from

    @property
    def ok(self) -> bool:
        return self.kernel_bound_ok and self.difference is None

    def describe(self) -> str:
        head = f"norm '{self.node}' ({self.op}, {self.dtype})"
        kernel = ("" if self.kernel_ulps is None else
                  f"; kernel {ulps_text(self.kernel_ulps)} from the definition"
                  + ("" if self.kernel_bound_ok else " (MISMATCH: beyond the op's accuracy bound)"))
        note = f" ({self.note})" if self.note else ""
        if self.difference is not None:
            return f"{head}: MISMATCH: differs: {self.difference}{kernel}{note}"
        if self.original_ulps is None:
            return f"{head}: {'ok' if self.ok else 'MISMATCH'}: not compared with the original{kernel}{note}"
        return (f"{head}: {'ok' if self.ok else 'MISMATCH'}: exact definition kept "
                f"(original max {ulps_text(self.original_ulps)}, tolerance {self.tolerance:g}){kernel}{note}")


def ulps_text(value: float) -> str:
    return "inf ulp" if not np.isfinite(value) else f"{value:.3g} ulp"


@dataclasses.dataclass
class _Values:
    x: np.ndarray
    skip: np.ndarray | None
    scale: np.ndarray | None
    bias: np.ndarray | None
    offset: np.ndarray | None


def check_norm(site: NormSite, fused: Mapping[str, np.ndarray], original: Mapping[str, np.ndarray],
               other_scales: Mapping[str, np.ndarray]) -> NormVerdict:
    """The verdict on one norm from the values of the augmented runs (``fused``, ``original``: name -> array, graph
    inputs included). ``other_scales``: the other norms' constant scales, by node name (a swap's suspects)."""
    y = fused[site.y]
    dtype = np.dtype(y.dtype)
    definition = Definition(site.axis, site.epsilon, site.eps_outside, site.signature.centred, site.float32_sum)
    tolerance = ORIGINAL_ULPS.get(dtype, ORIGINAL_ULPS[np.dtype(np.float32)])

    def values(source: Mapping[str, np.ndarray]) -> tuple[_Values, list[str]]:
        missing = []

        def get(name):
            if name is None:
                return None
            if name in site.constants:
                return site.constants[name]
            if name in source:
                return source[name]
            missing.append(name)
            return fused[name]

        return _Values(get(site.x), get(site.skip), get(site.scale), get(site.bias), get(site.offset)), missing

    own, _ = values(fused)
    reference, _, reference_size = evaluate(definition, dtype, own.x, own.skip, own.scale, own.bias, own.offset)
    kernel = ulps(y, reference, dtype, reference_size)
    kernel_ok = _within_contract(site, y, reference, own.scale, dtype) if site.op.startswith(OP_DOMAIN + ".") \
        else kernel <= other_kernel_tolerance(tolerance, y, definition.axis)
    verdict = NormVerdict(site.node, site.op, str(dtype), kernel, kernel_ok, None, tolerance)
    if site.y not in original:
        verdict.note = f"the original has no value named '{site.y}'"
        return verdict
    theirs, missing = values(original)
    if missing:
        verdict.note = ("compared from the fused model's " + ", ".join(f"'{name}'" for name in missing)
                        + ", at the size of each row")
    original_y = original[site.y]
    if original_y.shape != y.shape:
        verdict.difference = (f"shape: the original's '{site.y}' has shape {list(original_y.shape)}, the fused "
                              f"op's {list(y.shape)}")
        return verdict
    expected, expected_sum, size = evaluate(definition, dtype, theirs.x, theirs.skip, theirs.scale, theirs.bias,
                                            theirs.offset)
    rows = bool(missing)
    if rows:
        # Values the pass made (a residual sum it writes as its own Adds) carry the fused model's rounding upstream,
        # which a sum that cancels turns into any number of ulps of its element: measured at the row's RMS, within
        # twice the tolerance (the outputs' own criterion, 8 ulps at 1 for 16-bit types).
        verdict.tolerance = tolerance = 2 * tolerance
        size = _at_rows(size, expected, definition.axis)
    verdict.original_ulps = ulps(original_y, expected, dtype, size)
    sum_ulps = None
    if site.sum is not None and site.sum in original and expected_sum is not None:
        sum_ulps = verdict.sum_ulps = ulps(original[site.sum], expected_sum, dtype,
                                           term_size(theirs.x, theirs.skip, theirs.bias))
        verdict.original_ulps = max(verdict.original_ulps, sum_ulps)
    if verdict.original_ulps <= tolerance:
        return verdict
    if sum_ulps is not None and sum_ulps > tolerance:
        verdict.difference = _residual_difference(site, original, theirs, definition, dtype, tolerance)
        return verdict
    verdict.difference = _diagnose(site, definition, dtype, theirs, original_y, tolerance, other_scales, rows) + (
        f" (max {ulps_text(verdict.original_ulps)} from the fused op's definition)")
    return verdict


def other_kernel_tolerance(tolerance: float, y: np.ndarray, axis: int) -> float:
    """The ulps another runtime's kernel may be from the float64 definition on rows like ``y``'s: its sum of squares
    accumulates in the order it chooses (onnxruntime's float32 SkipSimplifiedLayerNormalization was 19 ulp off on
    rows of 2048), an error that grows with the row's length; ``tolerance`` at least. Whether the fused op keeps the
    original's meaning is the other comparison's question, not this one's."""
    rank = y.ndim
    row = int(np.prod(y.shape[axis % rank:])) if rank else 1
    return max(tolerance, 4.0 * float(np.sqrt(max(row, 1))))


def _within_contract(site: NormSite, y: np.ndarray, reference: np.ndarray, scale: np.ndarray | None,
                     dtype: np.dtype) -> bool:
    relative = CONTRACT_RELATIVE.get(dtype)
    if relative is None:
        return True
    magnitude = 0.0 if scale is None or scale.size == 0 else float(np.max(np.abs(scale.astype(np.float64))))
    floor = float(ml_dtypes.finfo(dtype).smallest_subnormal) + 2.0**-149 * magnitude
    finite = np.isfinite(reference)
    error = np.abs(y.astype(np.float64) - reference)
    with np.errstate(invalid="ignore"):
        return bool(np.all(error[finite] <= relative * np.abs(reference[finite]) + floor))


def _at_rows(size: np.ndarray, y: np.ndarray, axis: int) -> np.ndarray:
    """``size``, at least each row's RMS of ``y`` (the normalized dims from ``axis``)."""
    rank = y.ndim
    with np.errstate(invalid="ignore", over="ignore"):
        rms = np.sqrt(np.mean(y**2, axis=tuple(range(axis % rank, rank)), keepdims=True))
    return np.maximum(size, np.where(np.isfinite(rms), rms, 0.0))


def _matches(candidate: tuple, original_y: np.ndarray, dtype: np.dtype, tolerance: float,
             rows: bool = False, axis: int = -1) -> bool:
    """Whether the original's Y is within ``tolerance`` of an :func:`evaluate` result (``rows``: at least at each
    row's RMS)."""
    y, _, size = candidate
    return ulps(original_y, y, dtype, _at_rows(size, y, axis) if rows else size) <= tolerance


def _placement(outside: bool) -> str:
    return "outside the sqrt" if outside else "inside the sqrt"


def _fitted_epsilons(base: np.ndarray, scale: np.ndarray | None, original_y: np.ndarray, axes: tuple[int, ...],
                     outside: bool) -> list[float]:
    """Epsilons that would make the original's rows: the per-row factor fitted by least squares, then
    ``1/f^2 - ms`` (inside) or ``1/f - rms`` (outside); the median over rows. The simplest values first (a power of
    ten within a factor 3 of the fit, then the fit rounded to 1, 2 and 3 digits): the fit is as noisy as the
    original's rounding."""
    target = original_y.astype(np.float64)
    unit = base if scale is None else base * scale.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        factor = np.sum(target * unit, axis=axes, keepdims=True) / np.sum(unit * unit, axis=axes, keepdims=True)
        ms = np.mean(base**2, axis=axes, keepdims=True)
        estimate = 1.0 / factor - np.sqrt(ms) if outside else 1.0 / factor**2 - ms
    estimate = estimate[np.isfinite(estimate)]
    if estimate.size == 0:
        return []
    value = float(np.median(estimate))
    if value <= 0:
        return [0.0]
    decade = np.floor(np.log10(value))
    powers = [10.0**exponent for exponent in (decade, decade + 1) if value / 3 <= 10.0**exponent <= value * 3]
    return list(dict.fromkeys([*(float(f"{power:.1g}") for power in powers),
                               *(float(f"{value:.{digits}g}") for digits in (1, 2, 3))]))


def _diagnose(site: NormSite, definition: Definition, dtype: np.dtype, values: _Values, original_y: np.ndarray,
              tolerance: float, other_scales: Mapping[str, np.ndarray], rows: bool = False) -> str:
    """Which one part of the meaning, changed, makes the definition match the original's value."""

    def evaluate_with(changed: Definition = definition, scale=values.scale, normalized_input=None):
        return evaluate(changed, dtype, values.x, values.skip, scale, values.bias, values.offset,
                        normalized_input=normalized_input)

    def matches(candidate) -> bool:
        return _matches(candidate, original_y, dtype, tolerance, rows, definition.axis)

    rank = original_y.ndim
    axes = tuple(range(definition.axis % rank, rank))
    base_input = normalized(definition, dtype, values.x, values.skip, values.bias)[0]
    with np.errstate(over="ignore", under="ignore"):
        single = np.sum(base_input.astype(np.float32) ** 2, axis=axes, dtype=np.float32)
    exact = np.sum(base_input**2, axis=axes)
    if np.any(np.isinf(single) & np.isfinite(exact)) or np.any((single == 0) & (exact > 0)):
        return ("range (a row's sum of squares overflows or underflows float32, where the original computes it; "
                "the fused op's definition holds it)")
    if not definition.centred:
        for outside in (definition.eps_outside, not definition.eps_outside):
            for epsilon in _fitted_epsilons(base_input, values.scale, original_y, axes, outside):
                if matches(evaluate_with(dataclasses.replace(definition, epsilon=epsilon, eps_outside=outside))):
                    if outside == definition.eps_outside:
                        return f"epsilon (the original matches {epsilon:g}, the fused op has {definition.epsilon:g})"
                    return (f"epsilon placement (the original matches {epsilon:g} {_placement(outside)}, the fused "
                            f"op adds {definition.epsilon:g} {_placement(definition.eps_outside)})")
    for count in range(1, rank + 1):
        axis = rank - count
        if axis != definition.axis % rank and matches(evaluate_with(dataclasses.replace(definition, axis=axis))):
            return (f"axis (the original normalizes the last {count} dims, the fused op the last "
                    f"{rank - definition.axis % rank})")
    if matches(evaluate_with(dataclasses.replace(definition, centred=not definition.centred))):
        return ("mean (the original centres each row, a LayerNorm; the fused op divides by the RMS about zero)"
                if not definition.centred else
                "mean (the fused op centres each row, a LayerNorm; the original divides by the RMS about zero)")
    scale = values.scale
    if scale is not None and matches(evaluate_with(scale=None)):
        return "scale (the original applies none, the fused op multiplies by its scale)"
    if scale is not None:
        as_float = scale.astype(np.float64)
        if matches(evaluate_with(scale=1.0 + as_float)):
            return "scale (the original multiplies by 1 + w, the fused op by w: the `1 + w` is lost)"
        if matches(evaluate_with(scale=as_float - 1.0)):
            return "scale (the original multiplies by w, the fused op by 1 + w)"
    for node, other in other_scales.items():
        if node != site.node and (scale is None or other.shape != scale.shape or not np.array_equal(other, scale)):
            try:
                if matches(evaluate_with(scale=other)):
                    return f"scale (the original matches the scale of norm '{node}')"
            except ValueError:  # does not broadcast onto this norm
                continue
    fitted = _fitted_scale(evaluate_with(scale=None)[0], original_y, axes)
    if fitted is not None and matches(evaluate_with(scale=fitted)):
        return ("scale (the original multiplies by a scale the fused op lacks)" if scale is None else
                "scale (the original multiplies by another per-column scale than the fused op's)")
    if values.skip is not None and matches(evaluate(definition, dtype, values.x, None, scale, None, values.offset)):
        return "residual sum (the original normalizes X alone, the fused op X + skip)"
    return "not one part alone (no single change of epsilon, axis, mean, scale or residual sum explains it)"


def _fitted_scale(unscaled: np.ndarray, original_y: np.ndarray, axes: tuple[int, ...]) -> np.ndarray | None:
    """The per-element scale over the normalized dims that best maps ``unscaled`` onto the original (the median
    ratio over rows); None with fewer than 2 rows (one row fits any scale)."""
    rows = int(np.prod(original_y.shape[:axes[0]])) if axes else 1
    if rows < 2:
        return None
    trailing = original_y.shape[axes[0]:]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = (original_y.astype(np.float64) / unscaled).reshape(rows, *trailing)
    with warnings.catch_warnings():  # a column of zeros has no ratio: "All-NaN slice"
        warnings.simplefilter("ignore", RuntimeWarning)
        fitted = np.nanmedian(np.where(np.isfinite(ratio), ratio, np.nan), axis=0)
    return None if not np.isfinite(fitted).all() else fitted


def _residual_difference(site: NormSite, original: Mapping[str, np.ndarray], values: _Values,
                         definition: Definition, dtype: np.dtype, tolerance: float) -> str:
    """The original's sum is not the fused op's X + skip (+ bias): say whether its Y is still the norm of that sum."""
    total = original[site.sum]
    y_of_sum = evaluate(dataclasses.replace(definition, float32_sum=False), dtype, values.x, None, values.scale, None,
                        values.offset, normalized_input=total)
    norm_kept = _matches(y_of_sum, original[site.y], dtype, tolerance)
    return (f"residual sum (the original's '{site.sum}' is not X + skip"
            + (" + bias" if values.bias is not None else "")
            + " of the fused op's inputs: it adds another tensor"
            + ("; its norm of that sum is the fused op's definition)" if norm_kept else ")"))


# --- all norms of a model ------------------------------------------------------------------------------------------


@dataclasses.dataclass
class NormReport:
    norms: list[NormVerdict]
    amplifiers: list[str]  # amplifying op types downstream of the norms in the fused model
    problem: str | None = None  # why the check did not run

    @property
    def ok(self) -> bool:
        return all(norm.ok for norm in self.norms)

    @property
    def max_ulps(self) -> float:
        return max((norm.original_ulps for norm in self.norms if norm.original_ulps is not None), default=0.0)

    def summary(self) -> str:
        if self.problem is not None:
            return f"norms: not checked: {self.problem}"
        if not self.norms:
            return "norms: the fused model has no norm op"
        failed = [norm for norm in self.norms if not norm.ok]
        if failed:
            return f"norms: {len(failed)} of {len(self.norms)} MISMATCH"
        compared = sum(norm.original_ulps is not None for norm in self.norms)
        return (f"norms: all of {len(self.norms)} keep the exact definition (max {ulps_text(self.max_ulps)} "
                f"from it, {compared} compared with the original)")


def check_norms(sites: Sequence[NormSite], fused: Mapping[str, np.ndarray], original: Mapping[str, np.ndarray],
                amplifiers: list[str]) -> NormReport:
    scales = {site.node: site.constants[site.scale] for site in sites
              if site.scale is not None and site.scale in site.constants}
    return NormReport([_checked(site, fused, original, scales) for site in sites], amplifiers)


def _checked(site: NormSite, fused: Mapping[str, np.ndarray], original: Mapping[str, np.ndarray],
             scales: Mapping[str, np.ndarray]) -> NormVerdict:
    """:func:`check_norm`, or a verdict saying why the norm could not be evaluated (a scale that does not broadcast
    as the op's rules say, a value the runs did not give): onnxruntime ran the node, so that is no mismatch."""
    try:
        with warnings.catch_warnings():  # numpy's on empty tensors and NaN rows: the verdict says what matters
            warnings.simplefilter("ignore", RuntimeWarning)
            return check_norm(site, fused, original, scales)
    except (ValueError, KeyError, IndexError, TypeError) as error:
        return NormVerdict(site.node, site.op, "?", None, True, None, 0.0,
                           note=f"not evaluated: {type(error).__name__}: {one_line(error)}")


def names_to_expose(sites: Sequence[NormSite]) -> list[str]:
    names = []
    for site in sites:
        for name in (site.x, site.skip, site.scale, site.bias, site.offset, site.y, site.sum):
            if name is not None and name not in site.constants:
                names.append(name)
    return names


def run_checks(fused_model: onnx.ModelProto, original_model: onnx.ModelProto, base_dirs: tuple[str, str],
               feeds: Mapping[str, np.ndarray], run: Callable[[onnx.ModelProto, list[str], str], list[np.ndarray]]
               ) -> NormReport:
    """Finds the fused model's norms, runs both models once with their values exposed (``run(model, names,
    which)``, ``which`` "original" or "fused") and checks each norm."""
    # A norm node the original has as it is (a LayerNorm the pass does not touch, an op a target keeps) is no
    # fusion's: onnxruntime runs the same node in both models.
    unchanged = {node_key(node) for node in original_model.graph.node}
    sites = [site for site in find_norms(fused_model, base_dirs[1]) if site.key not in unchanged]
    amplifiers = amplifying_ops(fused_model, [name for site in sites for name in (site.y, site.sum) if name])
    if not sites:
        return NormReport([], amplifiers)
    names = names_to_expose(sites)
    values = {}
    for which, model in (("fused", fused_model), ("original", original_model)):
        augmented, outputs = exposed(model, names)
        arrays = run(augmented, outputs, which)
        values[which] = {**dict(feeds), **dict(zip(outputs, arrays))}
    return check_norms(sites, values["fused"], values["original"], amplifiers)
