"""The whole pass over an onnx_ir model: infer shapes, apply the rules, clean up, report."""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir
from onnxscript.rewriter import pattern

from ort_rmsnorm.contract import (
    DEFAULT_TARGET,
    NORM_OPS,
    OP_DOMAIN,
    OP_VERSION,
    OURS_RMSNORM,
    OURS_SKIP_RMSNORM,
    SKIP_NORM_OPS,
    qualified,
)
from ort_rmsnorm.model.graphs import nodes, scopes, walk
from ort_rmsnorm.model.types import TypeTable, infer_types

from ._annotations import Annotations, visiting_order
from ._cleanup import between_phases, finish
from ._conversions import check_our_ops, declared_dtype
from ._emit import default_opset
from ._facts import Facts, label
from ._norm_fusion import squared_operand, unfused_reduction
from ._opset_upgrade import upgrade_default_opset
from ._report import FusionReport
from ._phases import PhasedRuleSet, build_phases
from ._session import FusionSession
from ._target_list import get_target


def rules(
    target: str = DEFAULT_TARGET, *, types: TypeTable | None = None, through_qdq: bool = False
) -> pattern.RewriteRuleSet:
    """The fusion rules for ``target`` as an onnxscript RewriteRuleSet, to compose with other rewrites (it applies
    its phases one after the other, see ``_phases``).

    Shapes come from the model's annotations, or from ``types`` (see :func:`infer_types`); run shape inference first
    (e.g. onnx_ir's ShapeInferencePass), as rules skip candidates whose rank or dims they cannot see. Applied this
    way there is no report and onnxscript's own clean-up runs (it renames unnamed values and removes every unused
    node); :func:`fuse_model` does neither. A residual fusion puts the skip op where the norm was, which may be after
    other readers of the Add's output: run onnx_ir's TopologicalSortPass afterwards (``fuse_model`` sorts where
    needed). ``through_qdq``: as for :func:`fuse_model`.
    """
    session = FusionSession(
        get_target(target), Facts(types if types is not None else TypeTable()), through_qdq=through_qdq
    )
    return PhasedRuleSet(build_phases(session))


def fuse_model(
    model: ir.Model,
    target: str = DEFAULT_TARGET,
    *,
    allow_opset_upgrade: bool = False,
    through_qdq: bool = False,
    notes: Sequence[str] = (),
) -> FusionReport:
    """Fuses every decomposed RMSNorm (and residual Add before one) in ``model``, in place; returns the report.

    Weights are never loaded: shape inference runs with large initializers detached, and the rules read only small
    constants (epsilon, exponents, axes; a scale when it is folded or converted for a target). ``target`` is
    ``custom`` (ort_rmsnorm.RMSNorm/SkipRMSNorm), ``onnx`` (RMSNormalization, opset 23), ``ort`` (onnxruntime's
    SimplifiedLayerNormalization and com.microsoft.SkipSimplifiedLayerNormalization), ``auto`` (per norm the faster
    of ``custom``'s and ``ort``'s) or ``decomposed`` (every norm op as plain ONNX ops). With ``target="onnx"`` and a
    model below opset 23, ``allow_opset_upgrade=True`` first converts the model with onnx's version converter;
    otherwise each norm is reported as skipped. ``through_qdq=True`` fuses norms across the
    QuantizeLinear/DequantizeLinear pairs inside them (an int8 QDQ model's), keeping those at their boundaries; the
    fusion's ``roundings`` list the pairs dropped (otherwise such norms are reported as skipped). ``notes`` open the
    report's notes (what reading the model did).
    """
    chosen = get_target(target)
    notes = list(notes) + _drop_unused_import(model)
    chosen.prepare(model)
    current = default_opset(model.graph, model)
    if chosen.opset is not None and allow_opset_upgrade and current < chosen.opset:
        notes += upgrade_default_opset(model, chosen.opset)
    converts_ours = any(op in chosen.converts for op in (OURS_RMSNORM, OURS_SKIP_RMSNORM))
    if converts_ours:  # first with the types the model states: before inference, which would warn of the same node
        check_our_ops(model, declared_dtype)
    session = FusionSession(
        chosen, Facts(infer_types(model)), scopes(model), visiting_order(model), notes, through_qdq=through_qdq
    )
    if converts_ours:  # then with the types inferred
        check_our_ops(model, session.facts.dtype)
    annotations = Annotations(model)
    rule_set = PhasedRuleSet(build_phases(session), between_phases=lambda: between_phases(session))
    rule_set.remove_unused_nodes = False  # the session removes exactly what the fusions made dead, nothing else
    rule_set.apply_to_model(model)
    _norm_ops_left(model, session)
    _reductions_left(model, session)
    return finish(session, model, annotations)


def _drop_unused_import(model: ir.Model) -> list[str]:
    """Drops an import of our domain at another version than ours that no node uses, and says so. onnxruntime writes
    ``ort_rmsnorm`` version 1000 into every model it saves in a process that registered the library (its domain table
    is process-wide), whether or not the model uses the ops; kept, it would stop the pass from writing version
    ``OP_VERSION``. An import that nodes use is kept (the target's rules then say why they cannot add ours)."""
    holders = [model.graph, *model.functions.values()]
    versions = {holder.opset_imports[OP_DOMAIN] for holder in holders
                if holder.opset_imports.get(OP_DOMAIN, OP_VERSION) != OP_VERSION}
    if not versions or any(node.domain == OP_DOMAIN for node in nodes(model)):
        return []
    for holder in holders:
        if holder.opset_imports.get(OP_DOMAIN, OP_VERSION) != OP_VERSION:
            del holder.opset_imports[OP_DOMAIN]
    listed = ", ".join(str(version) for version in sorted(versions))
    return [f"the model imported domain '{OP_DOMAIN}' version {listed}, which no node uses (onnxruntime writes such "
            "an import into the models it saves in a process that registered the library): dropped"]


def _norm_ops_left(model: ir.Model, session: FusionSession) -> None:
    """Every norm op that stays in the model and is not one the target emits goes into the report: those a rule
    declined say why already; the rest get the reason here."""
    target = session.target
    for scope, node in walk(model):
        op = qualified(node.domain, node.op_type)
        if op not in (*NORM_OPS, *SKIP_NORM_OPS) or op in target.emits:
            continue
        if op in target.converts:
            reason = f"{op} {label(node)}: not converted, its inputs and outputs are not the op's (a malformed node?)"
        elif op in SKIP_NORM_OPS and target.skip is None:
            reason = f"{op} {label(node)} stays: the {target.name} target has no residual norm op"
        else:
            reason = f"{op} {label(node)} stays: the pass does not convert it to the {target.name} target's ops"
        session.left_alone(scope.graph, node, f"Left[{op}]", reason)


def _reductions_left(model: ir.Model, session: FusionSession) -> None:
    """Every reduction of squares (a norm's statistic, whatever the spelling around it) that stays in the model and
    that no rule reported goes into the report, with what follows it: no candidate is silent."""
    for scope, node in walk(model):
        if session.has_anchor(node):
            continue
        x = squared_operand(node, session.facts)
        if x is not None:
            reason = unfused_reduction(node, x, session.facts)
            session.left_alone(scope.graph, node, f"Reduction[{node.op_type}]", reason)
