"""The rules of one run, in phases: each phase is an onnxscript rule set applied to the whole model before the next.

1. the RMSNorm rules, one phase per form, the largest form first (``_patterns.FORMS``): onnxscript's rewriter visits
   nodes in graph order and would otherwise meet a norm's inner node, and fuse it alone, before the scale Mul that
   follows it;
   (for a target that fuses them: ``Target.fuses_subgraphs``);
2. the conversions of the norm ops already in the model that the target converts (``Target.converts``);
3. the residual rule for each norm op a target fuses an Add into (``Target.residual_norm_ops``): it reads the norm
   ops the phases before made.

Each rule is built by onnxscript's own constructor (``RewriteRuleClassBase.rule``), which keeps its setup and
clean-up hooks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import onnx_ir as ir
from onnxscript.rewriter import pattern

from ort_rmsnorm.contract import NORM_OPS, SKIP_NORM_OPS

from ._conversions import NormOpConversion, SkipOpConversion
from ._norm_fusion import RMSNormFusion
from ._patterns import FORMS
from ._residual import SkipFusion
from ._session import FusionSession


class PhasedRuleSet(pattern.RewriteRuleSet):
    """An onnxscript ``RewriteRuleSet`` that applies its phases one after the other (each over the whole model), so
    that it composes with onnxscript's rewriter like a single rule set. Between phases the nodes a fusion left dead
    must go, or a later phase would fuse them again: ``between_phases`` removes them (else each phase ends with
    onnxscript's removal of unused nodes)."""

    def __init__(
        self, phases: Sequence[Sequence[pattern.RewriteRule]], between_phases: Callable[[], None] | None = None
    ) -> None:
        self.phases = [pattern.RewriteRuleSet(list(rules)) for rules in phases if rules]
        self._between_phases = between_phases
        super().__init__([rule for phase in self.phases for rule in phase.rules])

    @property
    def remove_unused_nodes(self) -> bool:
        return any(phase.remove_unused_nodes for phase in self.phases)

    @remove_unused_nodes.setter
    def remove_unused_nodes(self, value: bool) -> None:
        for phase in getattr(self, "phases", ()):
            phase.remove_unused_nodes = value

    def apply_to_model(self, model: ir.Model, *, verbose: int | None = None, tracer=None) -> int:
        count = 0
        for phase in self.phases:
            count += phase.apply_to_model(model, verbose=verbose, tracer=tracer)
            if self._between_phases is not None:
                self._between_phases()
        return count


def build_phases(session: FusionSession) -> list[list[pattern.RewriteRule]]:
    """The rules of each phase, in order (see the module doc)."""
    target = session.target
    phases = [
        [RMSNormFusion.rule(form, session) for form, phase in FORMS.items() if phase == number]
        for number in sorted(set(FORMS.values()))
        if target.fuses_subgraphs
    ]
    conversions = [NormOpConversion.rule(source, session) for source in NORM_OPS if source in target.converts]
    conversions += [
        SkipOpConversion.rule(source, session, with_sum=with_sum)
        for source in SKIP_NORM_OPS
        if source in target.converts
        for with_sum in (True, False)
    ]
    phases.append(conversions)
    phases.append([SkipFusion.rule(session, norm_op) for norm_op in target.residual_norm_ops])
    return phases
