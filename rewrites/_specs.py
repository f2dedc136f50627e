"""What a rule's check hands its target, and the target back: the norm to emit (:class:`NormSpec`, with its
:class:`Scale`), a residual norm op already in the model (:class:`SkipSpec`), and what a target wrote for one
(:class:`Emitted`). Plain data: the checks decide it, the targets adapt and emit it."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir

from ._facts import SIXTEEN_BIT


@dataclasses.dataclass
class Scale:
    """The scale the fused op reads: a value of the graph, or (``value`` None) a new constant holding ``constant``."""

    value: ir.Value | None
    constant: np.ndarray | None
    """The elements of a scale the pass makes (folded 1 + w, ones, a converted constant); None for the graph's
    own value (weights are read only when a target needs them converted)."""
    form: str
    dtype: ir.DataType


@dataclasses.dataclass
class NormSpec:
    """Everything the emitted operator needs, decided by the rule's check."""

    x: ir.Value
    x_dtype: ir.DataType
    x_shape: ir.Shape | None
    axis: int
    epsilon: float
    eps_placement: str
    scale: Scale | None
    roundings: tuple[str, ...] = ()
    """Where the unfused subgraph rounds to a 16-bit type and the fused op does not (see Fusion.roundings)."""
    op: str | None = None
    """The op to emit, where a target chooses per norm (``auto``); None: the target's norm op."""
    choice: str | None = None
    """Why that op (``auto``), for the report."""
    opset: int | None = None
    """The default opset where the norm is emitted (for a target that writes plain ONNX ops)."""
    derivation: str | None = None
    """How epsilon and the scale were derived from a spelling that is not the mean square's (the L2 family)."""


@dataclasses.dataclass
class SkipSpec:
    """A residual norm op already in the model, ours or onnxruntime's: ``Y = norm(s)`` and ``sum = round_T(s)`` with
    ``s = (x + skip) + bias`` computed in float32 (docs/ops.md). ``norm`` is the norm of the sum as the target emits
    it (its ``x`` the op's X until then; of float32 where Y normalizes the unrounded float32 sum of 16-bit inputs)."""

    x: ir.Value
    skip: ir.Value
    bias: ir.Value | None
    dtype: ir.DataType
    """X's type (the sum's)."""
    float32_sum: bool
    """Y normalizes the float32 sum before it is rounded to the type (onnxruntime's op for 16-bit types, ours with
    ``normalize_float32_sum=1``); for float32 the two are the same."""
    norm: NormSpec
    what: str
    """The op and its node, for reasons."""
    gamma: ir.Value | np.ndarray | None = None
    """onnxruntime's residual op only: its gamma (a value, or the elements of a new constant)."""
    bias_input: ir.Value | np.ndarray | None = None
    """onnxruntime's residual op only: its bias."""
    as_adds: str | None = None
    """Why a target that has a residual op writes this one as the sum's Adds and its norm op (None: it does not)."""

    @property
    def wide(self) -> bool:
        """Whether the norm reads the float32 sum of a 16-bit input."""
        return self.float32_sum and self.dtype in SIXTEEN_BIT


@dataclasses.dataclass
class Emitted:
    """What a target wrote for a residual norm op: Y, the sum, and the node the report names."""

    y: ir.Value
    total: ir.Value
    node: ir.Node
