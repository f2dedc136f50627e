"""The residual Add before a norm: Add + the target's norm op -> the target's skip op (``Target.skip_for``)."""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import pattern

from ort_rmsnorm.contract import unqualified

from ._facts import NORM_DTYPES, SIXTEEN_BIT, NotFusable, dtype_name, format_shape, label, same_shape
from ._naming import node_path
from ._rule_base import FusionRule
from ._session import FusionSession


class SkipFusion(FusionRule):
    """Add(a, b) → one of the target's norm ops (``norm_op``), with a and b of one shape → the target's skip op for
    it, whose ``sum`` output replaces the Add's output for its other consumers. Also fuses an Add before a norm fused
    by an earlier run (so the pass is idempotent). For a target with a skip op: ``custom`` (RMSNorm → SkipRMSNorm),
    ``ort`` (SimplifiedLayerNormalization → com.microsoft.SkipSimplifiedLayerNormalization), ``auto`` (either norm
    op → the skip op its table prefers, ours where onnxruntime's cannot express the norm)."""

    def __init__(self, session: FusionSession, norm_op: str) -> None:
        super().__init__(f"SkipAdd[{session.target.name}]", session, remove_nodes=True)
        self._target = session.target
        self._norm_op = norm_op

    def root(self, bindings):
        return bindings["normed"].producer()

    def pattern(self, op, a, b):
        scale = pattern.Var("scale", can_match_none=True)
        # Or the same sum in float32, rounded back: a float16 converter that keeps Add in float32 writes it so, and
        # float32 holds the sum of two float16 or bfloat16 values well enough that rounding it once more is exact.
        widened = op.Add(op.Cast(a, _outputs=["a_wide"]), op.Cast(b, _outputs=["b_wide"]), _outputs=["wide_sum"])
        total = pattern.OrValue([op.Add(a, b, _outputs=["total"]), op.Cast(widened, _outputs=["total"])])
        domain, op_type = unqualified(self._norm_op)
        normed = getattr(op, op_type)(total, scale, _domain=domain, _outputs=["normed"])
        return normed, total

    def check(self, context, a, b, total, normed, scale=None, wide_sum=None, a_wide=None, b_wide=None, **_):
        norm = normed.producer()
        facts = self._session.facts
        if self._session.emitted(total) or self._session.written(total.producer()):
            # The sum's Add of a residual op this run wrote back as an Add and its norm op, where the target's
            # residual op would not compute the same thing: it stays.
            return pattern.MatchResult().fail("the pass wrote this Add for a residual op")
        try:
            if wide_sum is not None:
                self._check_widened_sum(a, b, a_wide, b_wide, wide_sum, total)
            self._check_residual(a, b, total, norm)
            shape = facts.shape(a)
            candidates = self._target.skip_for(norm, shape, facts)
            for index, (skip_op, choice) in enumerate(candidates):
                try:
                    gamma = skip_op.gamma(norm, scale, shape, context, facts)
                    break
                except NotFusable:
                    if index == len(candidates) - 1:
                        raise
        except NotFusable as error:
            return self._decline(context, error, anchor=total.producer(), met=norm)
        return self._accept({"normed": normed}, (skip_op, gamma, choice, context))

    def rewrite(self, op, a, b, total, normed, **_):
        skip_op, gamma, choice, context = self._decision({"normed": normed})
        norm = normed.producer()
        name = f"{node_path(norm)}{skip_op.op_type}"
        outputs, roundings = skip_op.emit(op, a, b, gamma, norm, name, self._session.facts)
        replaced = [normed, *[None] * (len(outputs) - 2), total]  # Y first, the sum last, optional ones between
        self._session.fused_residual(norm, outputs[0].producer(), context, self.name, replaced, roundings, choice)
        return outputs[0], outputs[-1]

    def _check_widened_sum(self, a, b, a_wide, b_wide, wide_sum, total) -> None:
        """Cast(Add(Cast(a), Cast(b))) is a's type's own Add when a and b are 16-bit, widened to float32 exactly and
        the sum is rounded back to their type."""
        facts = self._session.facts
        dtypes = {facts.dtype(a), facts.dtype(b), facts.dtype(total)}
        wide = {facts.dtype(a_wide), facts.dtype(b_wide), facts.dtype(wide_sum)}
        if len(dtypes) != 1 or not dtypes <= SIXTEEN_BIT or wide != {ir.DataType.FLOAT}:
            raise NotFusable(
                f"Add {label(wide_sum.producer())} adds {'/'.join(sorted(map(dtype_name, wide)))} casts of "
                f"{'/'.join(sorted(map(dtype_name, dtypes)))} values and is cast back: not the 16-bit Add of its "
                "operands",
                wide_sum.producer(),
            )

    def _check_residual(self, a, b, total, norm: ir.Node) -> None:
        facts = self._session.facts
        add = total.producer()
        a_shape, b_shape = facts.shape(a), facts.shape(b)
        if not same_shape(a_shape, b_shape):
            # Post-processing tools (onnxsim, float16 converters) drop or rename the stored shapes: follow the dims
            # through the graph's own shape arithmetic.
            (a_symbolic, why), (b_symbolic, _) = facts.symbolic_shape(a), facts.symbolic_shape(b)
            if not same_shape(a_symbolic, b_symbolic):
                shown = f"; symbolic shape inference: {format_shape(a_symbolic)} and {format_shape(b_symbolic)}"
                raise NotFusable(
                    f"Add {label(add)} of shapes {format_shape(a_shape)} and {format_shape(b_shape)} is not known to "
                    "add two tensors of one shape (a residual add); a broadcast operand such as a bias stays"
                    + (f" ({why})" if why else shown if a_symbolic is not None or b_symbolic is not None else ""),
                    add,
                )
        if facts.dtype(a) not in NORM_DTYPES:
            raise NotFusable(
                f"{dtype_name(facts.dtype(a))} residual: the fused ops take float32, float16, bfloat16", add
            )
        if any(value.uses() or value.is_graph_output() for value in norm.outputs[1:]):
            raise NotFusable(f"{norm.op_type} {label(norm)} has other outputs in use", norm)
