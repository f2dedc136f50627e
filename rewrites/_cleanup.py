"""After the rules: what the fusions made dead goes, the names and annotations the rewriter changed come back, the new
nodes and values get their names and types, and graphs a skip op put out of order are sorted."""

from __future__ import annotations

import onnx_ir as ir

from ort_rmsnorm.model.graphs import all_bodies, all_call_sites, graph_likes, values_of

from ._annotations import Annotations
from ._facts import Facts, label
from ._naming import NodeNames, unique
from ._report import FusionReport
from ._session import FusedNode, FusionSession


def between_phases(session: FusionSession) -> None:
    """Between two phases of rules: the next phase must not match a fused norm's nodes again."""
    remove_dead(session.fused)
    session.phase += 1


def remove_dead(fused_nodes: list[FusedNode]) -> None:
    """Removes what the fusions so far made dead."""
    initializers: dict[ir.Value, None] = {}  # checked once each, at the end: constants many norms share are common
    for fused in fused_nodes:
        removed = set(fused.removed)
        fused.removed += [node for node in _remove_dead(fused.matched, initializers) if node not in removed]
        initializers.update(dict.fromkeys(fused.initializers))
    for value in initializers:
        if value.graph is not None and value.is_initializer() and not (
            _used(value) or value.is_graph_input() or value.is_graph_output()
        ):
            value.graph.initializers.pop(value.name)


def _used(value: ir.Value) -> bool:
    """Whether any node reads ``value``, at constant cost: ``Value.uses()`` copies every use, which over a value read
    by thousands of nodes (a shared epsilon) made the clean-up quadratic in the model's size."""
    uses = getattr(value, "_uses", None)  # onnx_ir's own record of the uses; the public copy where it has none
    return bool(uses) if uses is not None else bool(value.uses())


def finish(session: FusionSession, model: ir.Model, annotations: Annotations) -> FusionReport:
    """Removes what the fusions made dead, restores the names the rewriter changed, names and types the new nodes'
    outputs, and makes the report. Fusions are listed in the order the rewriter meets their last nodes (a graph's
    subgraphs at their node, functions after the main graph), and named in that order."""
    fused_nodes = session.fused
    fused_nodes.sort(key=lambda fused: session.position(fused.root))
    remove_dead(fused_nodes)
    annotations.restore_names()
    annotations.restore_types()  # the rewriter annotates Constant outputs
    bodies = all_bodies(model)  # one walk for all functions
    _type_function_calls(model, bodies, [fused.node for fused in fused_nodes], session.facts)
    stops = {value for fused in fused_nodes for value, _ in fused.outputs}
    orders: dict[ir.Graph, dict[ir.Node, int]] = {}
    extras = {id(fused): _emitted_with(fused, annotations, stops, orders) for fused in fused_nodes}
    new_values = {value for fused in fused_nodes for value in _new_values(fused, extras[id(fused)], annotations)}
    taken = {
        value.name
        for graph in graph_likes(model)
        for value in values_of(graph)
        if value.name and value not in new_values
    }
    node_names = NodeNames(annotations.existed)
    # Before IR 10 a function body has no value_info: onnx_ir writes its types into the main graph under names it
    # cannot read back when they contain "/", so a second run would drop them. There the values the pass makes in
    # functions stay unannotated, as the rest of the body is.
    unannotated = set() if model.ir_version >= 10 else {graph for graphs in bodies.values() for graph in graphs}
    for fused in fused_nodes:
        node_names.give(fused.node, fused.node.name)
        _finish_outputs(fused, extras[id(fused)], taken, annotations, node_names)
        if fused.node.graph in unannotated:
            for value in _new_values(fused, extras[id(fused)], annotations):
                value.type, value.shape = None, None
        fused.record.node = fused.node.name
        replaced = fused.matched + [node for node in fused.removed if node not in fused.matched]
        fused.record.replaced_nodes = [label(node).strip("'") for node in replaced]
    _restore_topological_order([fused.node for fused in fused_nodes if fused.record.skip])
    return session.report()


def _remove_dead(seeds: list[ir.Node], initializers: dict[ir.Value, None]) -> list[ir.Node]:
    """Removes the seeds and their producers, as far as they are dead now (no uses, not graph outputs). Returns the
    nodes removed; the initializers they read go into ``initializers``, for the caller to remove those now unused."""
    removed: list[ir.Node] = []
    pending = list(seeds)
    while pending:
        node = pending.pop()
        graph = node.graph
        if graph is None or any(value.is_graph_output() or _used(value) for value in node.outputs):
            continue
        inputs = [value for value in node.inputs if value is not None]
        graph.remove(node, safe=True)
        removed.append(node)
        for value in inputs:
            if value.producer() is not None:
                pending.append(value.producer())
            elif value.is_initializer():
                initializers[value] = None
    return removed


def _type_function_calls(model: ir.Model, bodies: dict[ir.Function, set[ir.Graph]], emitted: list[ir.Node],
                         facts: Facts) -> None:
    """ONNX and onnxruntime infer the outputs of a call to a model-local function from the function's body, and an
    operator without an ONNX schema there (ours, or SimplifiedLayerNormalization for onnx.checker) leaves them
    untyped, so that ops reading them fail type inference. The outputs of calls to a function that now holds a fused
    node keep the types and shapes inferred before (written as value_info)."""
    in_graph = {node.graph for node in emitted}
    sites = None
    for function in model.functions.values():
        if not in_graph & bodies.get(function, set()):
            continue
        sites = all_call_sites(model) if sites is None else sites
        for _, call in sites.get(function, []):
            for value in call.outputs:
                dtype, shape = facts.dtype(value), facts.shape(value)
                if dtype is not None:
                    value.dtype = dtype
                if shape is not None:
                    value.shape = shape


def _restore_topological_order(skip_nodes: list[ir.Node]) -> None:
    """A skip op takes the place of the norm, but the residual Add's other readers (now reading its ``sum``) may come
    before the norm: those graphs get onnx_ir's stable topological sort (which keeps every other order). A reader
    inside a subgraph counts as out of order (its If/Loop node may come first)."""
    graphs = {id(node.graph): node.graph for node in skip_nodes}
    for graph in graphs.values():
        position = {node: index for index, node in enumerate(graph)}
        if any(
            position.get(reader, -1) < position[node]
            for node in skip_nodes
            if node.graph is graph
            for value in node.outputs
            for reader in value.consumers()
        ):
            graph.sort()


def _emitted_with(fused: FusedNode, annotations: Annotations, stops: set[ir.Value],
                  orders: dict[ir.Graph, dict[ir.Node, int]]) -> list[ir.Node]:
    """The other nodes the pass emitted for ``fused`` (Constants for a folded, converted or ones scale or an expanded
    gamma; where a target writes a norm as several nodes, those too), in graph order: the new producers upstream of
    its values, up to values of the model and those another fused norm emitted in place of one (a norm right after
    a norm). ``orders``: each graph's node order, made once for all fusions (per fusion, it was quadratic in the
    model's size)."""
    found: list[ir.Node] = []
    pending = [fused.node] + [value.producer() for value, _ in fused.outputs if value.producer() is not None]
    seen = set()
    while pending:
        node = pending.pop()
        if node in seen:
            continue
        seen.add(node)
        if node is not fused.node and node not in found:
            found.append(node)
        for value in node.inputs:
            producer = value.producer() if value is not None else None
            if producer is not None and value not in stops and not annotations.existed(producer):
                pending.append(producer)
    graph = fused.node.graph
    if len(found) < 2 or graph is None:
        return found
    if graph not in orders:
        orders[graph] = {node: index for index, node in enumerate(graph)}
    order = orders[graph]
    return sorted(found, key=lambda node: order.get(node, -1))


def _new_values(fused: FusedNode, extras: list[ir.Node], annotations: Annotations) -> list[ir.Value]:
    """Outputs of the emitted nodes."""
    return [*fused.node.outputs, *(value for node in extras for value in node.outputs)]


def _finish_outputs(
    fused: FusedNode, extras: list[ir.Node], taken: set[str], annotations: Annotations, node_names: NodeNames
) -> None:
    """Each emitted value that replaced a value takes its name, type and shape (value_info helps onnxruntime's later
    optimizations); optional outputs nobody reads are dropped or left unnamed; the other emitted nodes and their
    outputs get unique names after the norm's (``<norm>/scale`` for a scale constant)."""
    node = fused.node
    for value, (name, dtype, shape) in fused.outputs:
        if name:
            value.name = unique(name, taken)
        if dtype is not None:
            value.dtype = dtype
        if shape is not None:
            value.shape = shape
    read = [index == 0 or bool(value.uses()) or value.is_graph_output() for index, value in enumerate(node.outputs)]
    node.resize_outputs(max(index for index, flag in enumerate(read) if flag) + 1)
    for value, flag in zip(node.outputs, read):
        if not flag:
            value.name = ""
    replacing = {value for value, _ in fused.outputs}
    for extra in extras:
        suffix = "scale" if extra.op_type == "Constant" and any(value in node.inputs for value in extra.outputs) \
            else extra.op_type
        node_names.give(extra, f"{node.name}/{suffix}")
        for value in extra.outputs:
            if value not in replacing:
                value.name = unique(f"{node.name}/{suffix}", taken)
