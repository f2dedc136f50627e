"""What a fusion run did: each fusion and each near miss, as JSON and as a readable summary."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from typing import Optional


@dataclasses.dataclass
class Fusion:
    """One fused operator and what it replaced."""

    op_type: str
    """Emitted operator, qualified by domain when not the default one: ``ort_rmsnorm.RMSNorm``,
    ``ort_rmsnorm.SkipRMSNorm``, ``RMSNormalization``, ``SimplifiedLayerNormalization``,
    ``com.microsoft.SkipSimplifiedLayerNormalization``."""
    target: str
    node: str
    """Name of the fused node in the output model."""
    replaced_nodes: list[str]
    """Names of the nodes it replaced (unnamed nodes appear as ``<unnamed OpType>``)."""
    location: str
    """``main graph``, ``function 'domain::name'``, or a subgraph path such as ``If 'n3'.then_branch``."""
    axis: int
    """First normalized axis, negative: ``-k`` normalizes the last k dims."""
    epsilon: float
    eps_placement: str
    """``inside_sqrt`` (x / sqrt(ms + eps)), ``outside_sqrt`` (x / (sqrt(ms) + eps)) or ``none`` (eps = 0)."""
    scale: str
    """``none``, ``tensor``, ``cast tensor``, ``1+w`` (computed at run time), ``folded 1+w``, ``ones (added)``;
    ``, converted to <dtype>`` when a constant scale was converted exactly to X's type; ``, broadcast to [..]`` when a
    constant scale was expanded to the shape the target operator requires."""
    input_dtype: str
    scale_dtype: Optional[str]
    skip: bool
    """True when a residual Add was fused too (SkipRMSNorm / SkipSimplifiedLayerNormalization)."""
    rule: str
    """Name of the rule that matched (several when the residual Add was fused in a second step)."""
    converted_from: Optional[str] = None
    """The norm op the model had in place of the decomposed subgraph (``RMSNormalization``,
    ``SimplifiedLayerNormalization``, ``ort_rmsnorm.RMSNorm``, ``com.microsoft.SkipSimplifiedLayerNormalization``),
    converted to the target's; None for a fusion."""
    roundings: list[str] = dataclasses.field(default_factory=list)
    """Where the unfused subgraph rounds to a 16-bit type and the fused op does not (it computes the statistic in
    float32 or wider and rounds its output once), e.g. ``the mean square is computed in float16``: the two then differ
    by a few units in the last place, within ``verify``'s tolerance (docs/fusion.md, "Roundings"). With
    ``through_qdq``, also each QuantizeLinear/DequantizeLinear pair dropped from inside the norm, e.g. ``the mean
    square is quantized to int8 by a Q/DQ pair``: those differ by quantization steps (docs/fusion.md, "Quantized
    models")."""
    choice: Optional[str] = None
    """``auto``: why this op, ours or onnxruntime's (the measured table's verdict for its type and row length)."""
    derivation: Optional[str] = None
    """How epsilon and the scale were derived where the graph does not spell the mean square (the L2 family: a sum
    of squares, or its root scaled to the rms), e.g. ``the sum of squares over 64 elements is 64 x their mean:
    epsilon 1e-06/64 = 1.5625e-08 (eps, inside_sqrt), scale 1/sqrt(64) = 0.125 in a scale of its own (exact)``."""


@dataclasses.dataclass
class Skipped:
    """A near miss: a subgraph that looks like an RMSNorm (or a residual Add before one) and was left unfused."""

    location: str
    nodes: list[str]
    reason: str
    rule: str
    fused_as: Optional[str] = None
    """When a smaller part of these nodes was fused after all (e.g. the norm without a scale that does not qualify),
    the name of that fused node; the reason then says what was left out."""


@dataclasses.dataclass
class FusionReport:
    """Result of one run of the pass: ``fusions``, near misses in ``skipped``, and general ``notes``."""

    target: str
    fusions: list[Fusion] = dataclasses.field(default_factory=list)
    skipped: list[Skipped] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def ops_written(self) -> Counter:
        """How many fusions wrote each op (domain-qualified), e.g. ``{"ort_rmsnorm.SkipRMSNorm": 4, ...}``."""
        return Counter(fusion.op_type for fusion in self.fusions)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def summary(self) -> str:
        """Counts by location and form, and near misses grouped by reason."""
        lines = [f"RMSNorm fusion (target {self.target}): {len(self.fusions)} fused, {len(self.skipped)} skipped"]
        lines += [f"  note: {note}" for note in self.notes]
        if self.fusions:
            lines.append("  fused, by location:")
            lines += _counted(Counter(fusion.location for fusion in self.fusions))
            lines.append("  fused, by form:")
            lines += _counted(Counter(_form(fusion) for fusion in self.fusions))
        if self.skipped:
            lines.append("  skipped, by reason:")
            by_reason: dict[str, list[Skipped]] = {}
            for entry in self.skipped:
                by_reason.setdefault(entry.reason, []).append(entry)
            for reason, entries in sorted(by_reason.items(), key=lambda item: -len(item[1])):
                places = ", ".join(
                    f"{entry.location}: {entry.nodes[0] if entry.nodes else '?'}" for entry in entries[:3]
                )
                more = f", and {len(entries) - 3} more" if len(entries) > 3 else ""
                partly = sum(entry.fused_as is not None for entry in entries)
                fused_note = f" ({partly} of {len(entries)}: the norm was fused without this part)" if partly else ""
                lines.append(f"    {len(entries)} x {reason}{fused_note}  [{places}{more}]")
        return "\n".join(lines)


def _form(fusion: Fusion) -> str:
    op_type = fusion.op_type + (f" (from {fusion.converted_from})" if fusion.converted_from else "")
    parts = [op_type, f"axis {fusion.axis}", f"eps {fusion.eps_placement}", f"scale {fusion.scale}"]
    dtypes = fusion.input_dtype + (f"/{fusion.scale_dtype}" if fusion.scale_dtype else "")
    if fusion.choice:
        dtypes += f" ({fusion.choice.split(':')[0]})"
    rounded = f" (the graph rounds: {'; '.join(fusion.roundings)})" if fusion.roundings else ""
    return ", ".join([*parts, dtypes]) + rounded


def _counted(counter: Counter) -> list[str]:
    return [f"    {count} x {key}" for key, count in counter.most_common()]
