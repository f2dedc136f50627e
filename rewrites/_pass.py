"""The whole pass over an onnx_ir model: infer shapes, apply the rules, clean up, report."""

from __future__ import annotations

import onnx
import onnx_ir as ir
import onnx_ir.passes.common as common_passes
from onnxscript.rewriter import pattern

from ..contract import (
    DEFAULT_TARGET,
    ONNX_RMSNORM,
    ONNX_RMSNORM_OPSET,
    OP_DOMAIN,
    ORT_SIMPLIFIED_LAYER_NORM,
    RMSNORM,
    SKIP_RMSNORM,
)
from ..model_types import TypeTable, graph_likes, infer_types
from ._annotations import Annotations, visiting_order
from ._conversions import NORM_OPS, SKIP_NORM_OP
from ._facts import label
from ._report import FusionReport
from ._rule_set import PhasedRuleSet, build_phases
from ._session import FusionSession
from ._targets import default_opset, get_target


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
    return PhasedRuleSet(build_phases(FusionSession(target, types)))


def fuse_model(model: ir.Model, target: str = DEFAULT_TARGET, *, allow_opset_upgrade: bool = False) -> FusionReport:
    """Fuses every decomposed RMSNorm (and residual Add before one) in ``model``, in place; returns the report.

    Weights are never loaded: shape inference runs with large initializers detached, and the rules read only small
    constants (epsilon, exponents, axes; a scale when it is folded or converted for a target). ``target`` is ``custom`` (ort_rmsnorm.RMSNorm/SkipRMSNorm), ``onnx``
    (RMSNormalization, opset 23) or ``ort`` (onnxruntime's SimplifiedLayerNormalization and
    com.microsoft.SkipSimplifiedLayerNormalization). With ``target="onnx"`` and a model below opset 23,
    ``allow_opset_upgrade=True`` first converts the model with onnx's version converter; otherwise each norm is
    reported as skipped.
    """
    chosen = get_target(target)
    notes = []
    current = default_opset(model.graph, model)
    if chosen.name == "onnx" and allow_opset_upgrade and current < ONNX_RMSNORM_OPSET:
        upgrade_default_opset(model, ONNX_RMSNORM_OPSET)
        notes.append(f"default opset upgraded from {current} to {ONNX_RMSNORM_OPSET} with onnx.version_converter")
    session = FusionSession(chosen, infer_types(model), graph_locations(model), visiting_order(model))
    session.notes += notes
    annotations = Annotations(model)
    rule_set = PhasedRuleSet(build_phases(session), between_phases=session.next_phase)
    rule_set.remove_unused_nodes = False  # the session removes exactly what the fusions made dead, nothing else
    rule_set.apply_to_model(model)
    _norm_ops_left(model, session)
    return session.finish(model, annotations)


# The norm ops each target emits, and those a model may hold that the pass converts or leaves (domain-qualified).
_OURS = (f"{OP_DOMAIN}.{RMSNORM}", f"{OP_DOMAIN}.{SKIP_RMSNORM}")
_ORT = (ORT_SIMPLIFIED_LAYER_NORM, SKIP_NORM_OP)
_EMITTED = {"custom": _OURS, "onnx": (ONNX_RMSNORM,), "ort": _ORT}
_NORM_OPS = (*_OURS, ONNX_RMSNORM, *_ORT)


def _norm_ops_left(model: ir.Model, session: FusionSession) -> None:
    """Every norm op that stays in the model and is not one the target emits goes into the report: those a rule
    declined say why already; the rest get the reason here."""
    target = session.target.name
    for graph_like in graph_likes(model):
        for node in graph_like:
            op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
            if op not in _NORM_OPS or op in _EMITTED[target]:
                continue
            if op in NORM_OPS or (op == SKIP_NORM_OP and target == "custom"):
                reason = f"{op} {label(node)}: not converted, its inputs and outputs are not the op's (a malformed node?)"
            elif op in (SKIP_NORM_OP, f"{OP_DOMAIN}.{SKIP_RMSNORM}") and target == "onnx":
                reason = f"{op} {label(node)} stays: the onnx target has no residual norm op"
            else:
                reason = f"{op} {label(node)} stays: the pass does not convert it to the {target} target's ops"
            session.left_alone(graph_like, node, f"Left[{op}]", reason)


def graph_locations(model: ir.Model) -> dict[int, str]:
    """id(graph or function) → where it is: ``main graph``, ``function 'dom::name'``, ``If 'n3'.then_branch``,
    ``Loop 'l'.body/If 'n3'.else_branch``..."""
    locations: dict[int, str] = {}

    def visit(graph_like, where: str, prefix: str) -> None:
        locations[id(graph_like)] = where
        for node in graph_like:
            for attr in node.attributes.values():
                if attr.type == ir.AttributeType.GRAPH:
                    path = f"{prefix}{node.op_type} '{node.name}'.{attr.name}"
                    visit(attr.value, path, path + "/")
                elif attr.type == ir.AttributeType.GRAPHS:
                    for index, subgraph in enumerate(attr.value):
                        path = f"{prefix}{node.op_type} '{node.name}'.{attr.name}[{index}]"
                        visit(subgraph, path, path + "/")

    visit(model.graph, "main graph", "")
    for function in model.functions.values():
        where = f"function '{function.domain}::{function.name}'" + (
            f" ({function.overload})" if function.overload else ""
        )
        visit(function, where, where + "/")
    return locations


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
