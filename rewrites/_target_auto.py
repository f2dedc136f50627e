"""The ``auto`` target: each norm as ours or as onnxruntime's own op, whichever runs faster on the CPU, where
onnxruntime's computes the same thing (the ``ort`` target's rules); ours everywhere else.

A custom op pays more per call than a built-in one (its calls into onnxruntime's C API, cold where a decoder runs a
norm: right after a MatMul, docs/benchmarks.md "The cold call"), and our kernels are faster: onnxruntime's op
wins only on rows short enough that the call costs more than the row. Where that is, per op and type, is measured
cold (``ort-rmsnorm tune``) and read from the table: onnxruntime's op up to the largest row
length at which it was measured faster, ours above it, and ours where the row length is not static or no length
was measured faster. A model already holding either op gets the faster one too; an op that is already the faster
one stays as it is (the report's notes count them).

The table describes norms that run cold, after more weights than the L2 cache holds. Where a model's weights per norm
fit in half of this CPU's L2 (``ort_rmsnorm.auto_table.l2_cache_bytes``), its norms run warm, and there ours is the
cheaper call at every length measured (docs/benchmarks.md, "Cold is a regime"): ``auto`` writes ours and says why.
"""

from __future__ import annotations

import dataclasses
import math

import onnx_ir as ir

from ort_rmsnorm.contract import (
    AUTO,
    AXIS,
    NORM_OPS,
    ORT_SIMPLIFIED_LAYER_NORM,
    ORT_SKIP_NORM,
    OURS_RMSNORM,
    OURS_SKIP_RMSNORM,
    RMSNORM,
    SKIP_NORM_OPS,
    SKIP_RMSNORM,
)

from ort_rmsnorm.auto_table import L2_ENV, SHIPPED, AutoTable, l2_cache_bytes, load
from ort_rmsnorm.model.graphs import nodes

from ._auto_table import FASTER_UP_TO, MEASURED_ON
from ._facts import SIXTEEN_BIT, Facts, NotFusable, dtype_name, int_attribute, static_dims
from ._specs import NormSpec, SkipSpec
from ._target_base import SkipOp, Target
from ._target_custom import CustomTarget
from ._target_ort import OrtTarget


@dataclasses.dataclass(frozen=True)
class Verdict:
    onnxruntime: bool
    reason: str


SHIPPED_TABLE = AutoTable(FASTER_UP_TO, MEASURED_ON, SHIPPED)


def current_table() -> AutoTable:
    """The table ``auto`` reads now: this machine's, or the shipped one (:func:`ort_rmsnorm.auto_table.load`)."""
    return load(SHIPPED_TABLE)


# The ops that read a weight once per step (a decoder's matrix products and the weights dequantized for them), and
# the nodes that mark a norm (each decomposed RMSNorm or LayerNorm has one reduction; norm ops in every spelling).
WEIGHT_READERS = frozenset({"MatMul", "Gemm", "MatMulNBits", "MatMulInteger", "MatMulIntegerToFloat",
                            "DynamicQuantizeMatMul", "QLinearMatMul", "DequantizeLinear", "Conv", "MatMulBnb4"})
NORM_MARKS = frozenset({"ReduceMean", "ReduceL2", "ReduceSumSquare", "SimplifiedLayerNormalization",
                        "SkipSimplifiedLayerNormalization", "RMSNormalization", "LayerNormalization",
                        "SkipLayerNormalization", RMSNORM, SKIP_RMSNORM})


def weight_bytes_per_norm(model: ir.Model) -> float | None:
    """The bytes of constant weights the model's matrix products read per norm, on average (each weight once; its
    data is not loaded), or None for a model without norms."""
    weights, marks, seen = 0, 0, set()
    for node in nodes(model):
        if node.op_type in NORM_MARKS:
            marks += 1
        elif node.op_type in WEIGHT_READERS:
            for value in node.inputs:
                if value is not None and value.const_value is not None and id(value) not in seen:
                    seen.add(id(value))
                    weights += value.const_value.nbytes
    return weights / marks if marks else None


def _megabytes(count: float) -> str:
    return f"{count / 2**20:.2g} MiB"


def warm_reason(per_norm: float | None, l2: int | None) -> str | None:
    """Why the model's norms run warm (its weights per norm fit in half of the L2), or None where they may not."""
    if per_norm is None or not l2 or per_norm > l2 / 2:
        return None
    return (f"the model reads {_megabytes(per_norm)} of weights per norm, within half of this CPU's L2 cache "
            f"({_megabytes(l2)}; {L2_ENV}): its norms run warm, where ours is the cheaper call")


def choose(kind: str, dtype: ir.DataType | None, columns: int | None, table: AutoTable,
           warm: str | None = None) -> Verdict:
    """Whether onnxruntime's op runs ``kind`` (``RMSNorm`` or ``SkipRMSNorm``) on rows of ``columns`` elements of
    ``dtype`` faster than ours, by the measured table; ``warm``: why the model's norms run warm (:func:`warm_reason`),
    where the table, measured cold, does not apply."""
    dtype_text = dtype_name(dtype)
    limit = table.faster_up_to.get(kind, {}).get(dtype_text)
    source = table.describe()
    if limit is None:
        return Verdict(False, f"ours: faster at every {dtype_text} row length measured ({source})")
    if columns is None:
        return Verdict(False, f"ours: the row length is not static (onnxruntime's op is faster up to {limit} "
                              f"{dtype_text} elements, {source})")
    if columns <= limit and warm is not None:
        return Verdict(False, f"ours: {warm} (onnxruntime's op is faster cold on rows of up to {limit} {dtype_text} "
                              f"elements, {source})")
    if columns <= limit:
        return Verdict(True, f"onnxruntime's op: faster on rows of up to {limit} {dtype_text} elements, these have "
                             f"{columns} ({source})")
    return Verdict(False, f"ours: faster on rows of more than {limit} {dtype_text} elements, these have {columns} "
                          f"({source})")


def row_length(shape: ir.Shape | None, axis: int) -> int | None:
    """The static number of elements a row normalizes (dims ``[axis, rank)``), or None."""
    if shape is None or shape.rank() < -axis:
        return None
    dims = static_dims(list(shape.dims)[axis:])
    return math.prod(dims) if dims is not None else None


class AutoTarget(Target):
    name = AUTO
    norm_op = OURS_RMSNORM
    converts = (*NORM_OPS, *SKIP_NORM_OPS)

    def __init__(self, table: AutoTable | None = None) -> None:
        """``table``: the one to choose by; by default :func:`current_table`, read when first needed."""
        self._ours, self._ort = CustomTarget(), OrtTarget()
        self.skip = self._ours.skip
        self._table = table
        self._warm: str | None = None

    def prepare(self, model: ir.Model) -> None:
        self._warm = warm_reason(weight_bytes_per_norm(model), l2_cache_bytes())

    @property
    def table(self) -> AutoTable:
        if self._table is None:
            self._table = current_table()
        return self._table

    @property
    def emits(self) -> tuple[str, ...]:
        return (*self._ours.emits, *self._ort.emits)

    @property
    def residual_norm_ops(self) -> tuple[str, ...]:
        return (OURS_RMSNORM, ORT_SIMPLIFIED_LAYER_NORM)

    def adapt(self, spec, graph_like, model, facts):
        verdict = choose(RMSNORM, spec.x_dtype, row_length(spec.x_shape, spec.axis), self.table, self._warm)
        reason = verdict.reason
        if verdict.onnxruntime:
            try:
                adapted = self._ort.adapt(spec, graph_like, model, facts)
                return dataclasses.replace(adapted, op=ORT_SIMPLIFIED_LAYER_NORM, choice=reason)
            except NotFusable as error:
                reason = f"ours: onnxruntime's op would be faster but cannot express the norm ({error.reason})"
        adapted = self._ours.adapt(spec, graph_like, model, facts)
        return dataclasses.replace(adapted, op=OURS_RMSNORM, choice=reason)

    def emit(self, op, spec: NormSpec, name: str) -> ir.Value:
        chosen = self._ort if spec.op == ORT_SIMPLIFIED_LAYER_NORM else self._ours
        return chosen.emit(op, spec, name)

    def skip_for(self, norm: ir.Node, shape: ir.Shape | None, facts: Facts) -> list[tuple[SkipOp, str | None]]:
        axis = int_attribute(norm, AXIS, -1)
        if axis is not None and axis >= 0:
            axis = axis - shape.rank() if shape is not None else None
        length = row_length(shape, axis) if axis is not None else None
        dtype = facts.dtype(norm.inputs[0])
        if dtype in SIXTEEN_BIT:  # the graph's Add rounds the sum; onnxruntime's 16-bit op normalizes it unrounded
            return [(self._ours.skip, f"ours: onnxruntime's {dtype_name(dtype)} residual op normalizes the float32 "
                                      "sum, the graph the sum its Add rounded")]
        verdict = choose(SKIP_RMSNORM, dtype, length, self.table, self._warm)
        ours = (self._ours.skip, verdict.reason if not verdict.onnxruntime else
                "ours: onnxruntime's op would be faster but cannot express the norm")
        return [(self._ort.skip, verdict.reason), ours] if verdict.onnxruntime else [ours]

    def adapt_skip(self, spec: SkipSpec, graph_like, model, facts) -> SkipSpec:
        verdict = choose(SKIP_RMSNORM, spec.dtype, row_length(spec.norm.x_shape, spec.norm.axis), self.table,
                         self._warm)
        reason = verdict.reason
        if verdict.onnxruntime:
            try:
                written = self._ort._as_skip_op(spec, graph_like, model, facts)
                return dataclasses.replace(written, norm=dataclasses.replace(written.norm, op=ORT_SKIP_NORM,
                                                                             choice=reason))
            except NotFusable as error:
                reason = f"ours: onnxruntime's op would be faster but cannot express the norm ({error.reason})"
        written = self._ours.adapt_skip(spec, graph_like, model, facts)
        return dataclasses.replace(written, norm=dataclasses.replace(written.norm, op=OURS_SKIP_RMSNORM,
                                                                     choice=reason))

    def emit_skip(self, op, spec: SkipSpec, name: str):
        chosen = self._ort if spec.norm.op == ORT_SKIP_NORM else self._ours
        return chosen.emit_skip(op, spec, name)
