"""What every rule of the pass shares: onnxscript's rule class with the run's session, a near miss recorded for each
candidate a check declines, and a check's decision handed to the rewrite of the same match.

onnxscript builds a rule from a class with :meth:`RewriteRuleClassBase.rule` and calls ``check(context, **bindings)``
and then, for a match that passed, ``rewrite(op, **bindings)``: one instance serves every match. A check's decision
is therefore kept by the match's root node (the node the rewriter met the match at), which the rewrite finds again
from its bindings, and the rule's ``cleanup`` (called after each graph) drops what no rewrite took.
"""

from __future__ import annotations

from typing import Any

import onnx_ir as ir
from onnxscript.rewriter import pattern

from ._facts import NotFusable
from ._naming import fused_node_name
from ._session import FusionSession


class FusionRule(pattern.RewriteRuleClassBase):
    """A rule of one run (``session``); the session removes what a fusion made dead unless ``remove_nodes``."""

    def __init__(self, name: str, session: FusionSession, *, remove_nodes: bool = False) -> None:
        super().__init__(name, remove_nodes=remove_nodes)
        self._session = session
        self._decided: dict[ir.Node, Any] = {}

    def root(self, bindings: dict) -> ir.Node:
        """The match's root node, from the pattern's bindings."""
        raise NotImplementedError

    def _accept(self, bindings: dict, decision) -> pattern.MatchResult:
        """The check passes; ``decision`` is what the rewrite of this match gets from :meth:`_decision`."""
        self._decided[self.root(bindings)] = decision
        return pattern.MatchResult()

    def _decision(self, bindings: dict):
        return self._decided.pop(self.root(bindings))

    def _decline(self, context, error: NotFusable, anchor: ir.Node, met: ir.Node | None = None) -> pattern.MatchResult:
        """The check fails: the near miss goes into the report (see :meth:`FusionSession.near_miss`)."""
        self._session.near_miss(context, self.name, error, anchor=anchor, met=met)
        return pattern.MatchResult().fail(error.reason, list(error.sources))

    def _keep(self, op: str, node: ir.Node) -> pattern.MatchResult:
        """The op in the model is the one the target would write (``auto``): it stays as it is, and is counted unless
        this run wrote it."""
        if not self._session.written(node):
            self._session.kept(op)
        return pattern.MatchResult().fail(f"{op} is already the op the target writes here")

    def cleanup(self) -> None:
        self._decided.clear()


class NormRule(FusionRule):
    """A rule whose check decides the :class:`NormSpec` that the target's norm op replaces the match with."""

    converted_from: str | None = None
    """The norm op the rule converts (as the report names it); None for a fusion."""

    def _adapted(self, context, bindings: dict, analyze, anchor: ir.Node) -> pattern.MatchResult:
        """Accepts ``analyze()``'s spec as the target can emit it, or declines the match."""
        session = self._session
        try:
            spec = session.target.adapt(analyze(), context.graph_or_function, context.model, session.facts)
        except NotFusable as error:
            return self._decline(context, error, anchor)
        if spec.op is not None and spec.op == self.converted_from:
            return self._keep(spec.op, anchor)
        return self._accept(bindings, (spec, context))

    def rewrite(self, op, **bindings):
        spec, context = self._decision(bindings)
        target = self._session.target
        name = fused_node_name(list(context.nodes), context.root, spec.op or target.norm_op)
        output = target.emit(op, spec, name)
        self._session.fused_norm(spec, output.producer(), context, self.name, self.converted_from)
        return output
