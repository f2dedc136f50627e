"""The whole pass over an onnx_ir model: infer shapes, apply the rules, clean up, report."""

from __future__ import annotations

from collections.abc import Sequence

import onnx
import onnx_ir as ir
import onnx_ir.passes.common as common_passes
from onnxscript.rewriter import pattern

from ort_rmsnorm.contract import DEFAULT_TARGET, NORM_OPS, SKIP_NORM_OPS, qualified
from ort_rmsnorm.model_graphs import scopes, walk
from ort_rmsnorm.model_types import TypeTable, infer_types

from ._annotations import Annotations, visiting_order
from ._cleanup import between_phases, finish
from ._facts import Facts, label
from ._report import FusionReport
from ._rule_set import PhasedRuleSet, build_phases
from ._session import FusionSession
from ._target_list import get_target
from ._targets import default_opset


def rules(target: str = DEFAULT_TARGET, *, types: TypeTable | None = None) -> pattern.RewriteRuleSet:
    """The fusion rules for ``target`` as an onnxscript RewriteRuleSet, to compose with other rewrites (it applies
    its phases one after the other, see ``_rule_set``).

    Shapes come from the model's annotations, or from ``types`` (see :func:`infer_types`); run shape inference first
    (e.g. onnx_ir's ShapeInferencePass), as rules skip candidates whose rank or dims they cannot see. Applied this
    way there is no report and onnxscript's own clean-up runs (it renames unnamed values and removes every unused
    node); :func:`fuse_model` does neither. A residual fusion puts the skip op where the norm was, which may be after
    other readers of the Add's output: run onnx_ir's TopologicalSortPass afterwards (``fuse_model`` sorts where
    needed).
    """
    session = FusionSession(get_target(target), Facts(types if types is not None else TypeTable()))
    return PhasedRuleSet(build_phases(session))


def fuse_model(
    model: ir.Model,
    target: str = DEFAULT_TARGET,
    *,
    allow_opset_upgrade: bool = False,
    notes: Sequence[str] = (),
) -> FusionReport:
    """Fuses every decomposed RMSNorm (and residual Add before one) in ``model``, in place; returns the report.

    Weights are never loaded: shape inference runs with large initializers detached, and the rules read only small
    constants (epsilon, exponents, axes; a scale when it is folded or converted for a target). ``target`` is
    ``custom`` (ort_rmsnorm.RMSNorm/SkipRMSNorm), ``onnx`` (RMSNormalization, opset 23) or ``ort`` (onnxruntime's
    SimplifiedLayerNormalization and com.microsoft.SkipSimplifiedLayerNormalization). With ``target="onnx"`` and a
    model below opset 23, ``allow_opset_upgrade=True`` first converts the model with onnx's version converter;
    otherwise each norm is reported as skipped. ``notes`` open the report's notes (what reading the model did).
    """
    chosen = get_target(target)
    notes = list(notes)
    current = default_opset(model.graph, model)
    if chosen.opset is not None and allow_opset_upgrade and current < chosen.opset:
        upgrade_default_opset(model, chosen.opset)
        notes.append(f"default opset upgraded from {current} to {chosen.opset} with onnx.version_converter")
    session = FusionSession(chosen, Facts(infer_types(model)), scopes(model), visiting_order(model), notes)
    annotations = Annotations(model)
    rule_set = PhasedRuleSet(build_phases(session), between_phases=lambda: between_phases(session))
    rule_set.remove_unused_nodes = False  # the session removes exactly what the fusions made dead, nothing else
    rule_set.apply_to_model(model)
    _norm_ops_left(model, session)
    return finish(session, model, annotations)


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


def upgrade_default_opset(model: ir.Model, version: int) -> None:
    """Converts ``model`` (in place) to default-opset ``version`` with onnx's version converter.

    The converter works on a ModelProto; the main graph's initializers are detached while it runs (passed as typed
    graph inputs) and re-attached afterwards, so external or large weights are never loaded or copied. It drops
    model-local functions (onnx 1.23), so a model that has any is refused.
    """
    if model.functions:
        names = ", ".join(f"{function.domain}::{function.name}" for function in model.functions.values())
        raise ValueError(
            f"onnx's version converter cannot convert a model with model-local functions ({names}): it drops them; "
            f"convert the model to opset {version} yourself first"
        )
    graph = model.graph
    weights = dict(graph.initializers)
    also_inputs = {name for name, value in weights.items() if value.is_graph_input()}
    for name, value in weights.items():
        tensor = value.const_value
        if tensor is not None:
            value.dtype = value.dtype or tensor.dtype
            value.shape = value.shape or ir.Shape(tensor.shape)
        graph.initializers.pop(name)
        if name not in also_inputs:
            graph.inputs.append(value)
    try:
        converted = ir.serde.deserialize_model(
            onnx.version_converter.convert_version(ir.serde.serialize_model(model), version)
        )
    except Exception as error:
        raise ValueError(f"onnx's version converter could not convert the model to opset {version}: {error}") from error
    finally:
        for name, value in weights.items():
            if name not in also_inputs:
                graph.inputs.remove(value)
            graph.register_initializer(value)
    # The converter names the values it adds (_v_N) per graph, so that a subgraph may repeat a name of its parent,
    # which breaks single assignment (onnx 1.23): make the names unique again (graph inputs and outputs keep theirs).
    common_passes.NameFixPass()(converted)
    placeholders = {value.name: value for value in converted.graph.inputs}
    for name, value in weights.items():
        placeholder = placeholders[name]
        if name not in also_inputs:
            converted.graph.inputs.remove(placeholder)
        placeholder.const_value = value.const_value
        converted.graph.register_initializer(placeholder)
    model.graph = converted.graph
    minimum = onnx.helper.find_min_ir_version_for([onnx.helper.make_opsetid("", version)])
    model.ir_version = max(model.ir_version or 0, minimum)
