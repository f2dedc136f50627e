"""The rules of one run, in phases: each phase is an onnxscript rule set applied to the whole model before the next.

1. the RMSNorm rules, one phase per form, the largest form first (``_patterns.FORMS``): onnxscript's rewriter visits
   nodes in graph order and would otherwise meet a norm's inner node, and fuse it alone, before the scale Mul that
   follows it;
2. the conversions of the norm ops already in the model (onnxruntime's skip op too, for the ``custom`` target);
3. the residual rule, where the target has a skip op: it reads the norm ops the phases before made.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import onnx_ir as ir
from onnxscript.rewriter import pattern

from ._conversions import NORM_OPS, NormOpConversion, SkipNormOpConversion
from ._norm_rules import RMSNormFusion
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
    norm_rules = [RMSNormFusion(form, session) for form in FORMS]
    phases = [
        [_as_rule(rule) for rule in norm_rules if rule.phase == phase] for phase in sorted(set(FORMS.values()))
    ]
    conversions = [NormOpConversion(source, session) for source in NORM_OPS if source != session.target.norm_op]
    if session.target.name == "custom":
        conversions += [SkipNormOpConversion(session, with_sum=True), SkipNormOpConversion(session, with_sum=False)]
    phases.append([_as_rule(rule) for rule in conversions])
    if session.target.name in ("custom", "ort"):
        phases.append([_as_rule(SkipFusion(session))])
    return phases


def _as_rule(instance: pattern.RewriteRuleClassBase) -> pattern.RewriteRule:
    return pattern.RewriteRule(
        instance.pattern, instance.rewrite, instance.check, name=instance.name, remove_nodes=instance.remove_nodes
    )
