"""State shared by the rules of one run: target, inferred types, where each graph lies, and what was fused or not."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import onnx_ir as ir

from ..contract import DEFAULT_EPSILON, DEFAULT_TARGET
from ..model_types import TypeTable, call_sites, graph_likes, values_of
from ._annotations import Annotations
from ._facts import NotFusable, dtype_name, float_attribute, int_attribute, label
from ._report import Fusion, FusionReport, Skipped
from ._targets import NormSpec, Target, get_target


@dataclasses.dataclass
class FusedNode:
    """A node the pass emitted, with what it takes the place of."""

    node: ir.Node
    record: Fusion
    matched: list[ir.Node]
    """Nodes of the original model the rule(s) matched (removed now or by the clean-up)."""
    output_facts: list[tuple[str | None, ir.DataType | None, ir.Shape | None]]
    """Per output of ``node``: the name, type and shape of the value it replaced (None: a new optional output)."""
    root: ir.Node
    """The matched node the rewriter met the candidate at (its last node): orders the report."""
    removed: list[ir.Node] = dataclasses.field(default_factory=list)
    initializers: set[ir.Value] = dataclasses.field(default_factory=set)
    """Initializers the matched nodes read: removed once nothing reads them (a rule may remove its nodes itself)."""


@dataclasses.dataclass
class NearMiss:
    """One reason a candidate was not fused, from each rule that found it (larger forms first, as the phases run)."""

    location: str
    reason: str
    seen: list[tuple[int, str, list[ir.Node], ir.Node]]
    """(phase, rule, matched nodes, root) per rule that gave this reason."""

    def rule_and_nodes(self) -> tuple[str, list[ir.Node]]:
        """The smallest form's rule (that of the latest phase), and the nodes from the smallest form outwards."""
        nodes: list[ir.Node] = []
        ordered = sorted(self.seen, key=lambda entry: -entry[0])
        for _, _, matched, _ in ordered:
            nodes += [node for node in matched if node not in nodes]
        return ordered[0][1], nodes


class FusionSession:
    """One run of the rules over a model. ``types`` should come from :func:`infer_types`; without it only the model's
    own annotations are known and more candidates are skipped for unknown shapes."""

    def __init__(
        self,
        target: str | Target = DEFAULT_TARGET,
        types: TypeTable | None = None,
        locations: dict | None = None,
        order: dict[ir.Node, int] | None = None,
    ):
        self.target = get_target(target) if isinstance(target, str) else target
        self.types = types if types is not None else TypeTable()
        self._locations = locations or {}
        self._order = order or {}
        self._phase = 0
        self.fused: list[FusedNode] = []
        self._near_misses: dict[tuple, NearMiss] = {}
        self.notes: list[str] = []

    # ---- during matching ----

    def location(self, graph_like: ir.Graph | ir.Function) -> str:
        found = self._locations.get(id(graph_like))
        if found is not None:
            return found
        if isinstance(graph_like, ir.Function):
            return f"function '{graph_like.domain}::{graph_like.name}'"
        return f"graph '{graph_like.name}'"

    def near_miss(self, context, rule: str, error: NotFusable, anchor: ir.Node, met: ir.Node | None = None) -> None:
        """Records why a candidate (identified by ``anchor``, e.g. its reduction) was not fused by ``rule``. ``met``:
        the node the rewriter met it at (default: the match's root)."""
        key = (anchor, error.reason)
        entry = self._near_misses.get(key)
        if entry is None:
            entry = self._near_misses[key] = NearMiss(self.location(context.graph_or_function), error.reason, [])
        entry.seen.append((self._phase, rule, list(context.nodes), met if met is not None else context.root))

    def fused_norm(
        self,
        spec: NormSpec,
        node: ir.Node,
        context,
        rule: str,
        converted_from: str | None = None,
        replaced: list[ir.Value | None] | None = None,
        skip: bool = False,
    ) -> None:
        """``node`` (the target's norm op, or with ``skip`` its skip op, converted from another runtime's) replaced
        the match. ``replaced[i]``: the value output i of ``node`` takes the place of (None: a new optional output;
        by default the match's one output)."""
        replaced = replaced if replaced is not None else [context.output_values[0]]
        record = Fusion(
            op_type=_qualified(node),
            target=self.target.name,
            node=node.name,
            replaced_nodes=[],
            location=self.location(context.graph_or_function),
            axis=spec.axis,
            epsilon=as_float32(spec.epsilon),
            eps_placement=spec.eps_placement,
            scale=spec.scale.form if spec.scale is not None else "none",
            input_dtype=dtype_name(spec.x_dtype),
            scale_dtype=dtype_name(spec.scale.dtype) if spec.scale is not None else None,
            skip=skip,
            rule=rule,
            converted_from=converted_from,
            roundings=list(spec.roundings),
        )
        facts = [self._facts(value) if value is not None else (None, None, None) for value in replaced]
        self.fused.append(FusedNode(node, record, list(context.nodes), facts, context.root, [], _read(context.nodes)))
        self._learn(node, replaced)

    def left_alone(self, graph_like: ir.Graph | ir.Function, node: ir.Node, rule: str, reason: str) -> None:
        """A norm op that stays in the model as it is, and why (unless a rule already said why not)."""
        if not any(anchor is node for anchor, _ in self._near_misses):
            self._near_misses[(node, reason)] = NearMiss(
                self.location(graph_like), reason, [(self._phase, rule, [node], node)]
            )

    def fused_residual(
        self,
        norm: ir.Node,
        node: ir.Node,
        context,
        rule: str,
        replaced: list[ir.Value | None],
        roundings: tuple[str, ...] = (),
    ) -> None:
        """The residual Add before ``norm`` was fused into ``node``: extends the norm's record (or makes one for a norm
        that was in the model already). ``replaced[i]``: the value output i of ``node`` takes the place of (None for an
        optional output that nothing read before); output 0 replaces the norm's output. ``roundings``: as
        :attr:`NormSpec.roundings`, for the sum."""
        earlier = next((fused for fused in self.fused if fused.node is norm), None)
        if earlier is None:
            location = self.location(context.graph_or_function)
            record = _record_of_existing_norm(norm, self.target.name, location, self.types)
            earlier = FusedNode(norm, record, [norm], [self._facts(norm.outputs[0])], norm)
            self.fused.append(earlier)
        earlier.output_facts = [earlier.output_facts[0]] + [
            self._facts(value) if value is not None else (None, None, None) for value in replaced[1:]
        ]
        earlier.node = node
        self._learn(node, replaced)
        earlier.record.op_type = _qualified(node)
        earlier.record.skip = True
        earlier.record.rule += f" + {rule}"
        earlier.record.roundings += [rounding for rounding in roundings if rounding not in earlier.record.roundings]
        earlier.matched += [
            matched for matched in context.nodes if matched is not norm and matched not in earlier.matched
        ]
        earlier.initializers |= _read(context.nodes)

    def _learn(self, node: ir.Node, replaced: list[ir.Value | None]) -> None:
        """The emitted node's outputs have the types and shapes of the values they replace (later rules read them)."""
        fused = next(fused for fused in self.fused if fused.node is node)
        self.types.learn(
            {value: (dtype, shape) for value, (_, dtype, shape) in zip(node.outputs, fused.output_facts) if dtype}
        )
        for new, old in zip(node.outputs, replaced):
            if old is not None:
                self.types.stands_for(new, old)

    def _facts(self, value: ir.Value) -> tuple[str | None, ir.DataType | None, ir.Shape | None]:
        return value.name, self.types.dtype(value), self.types.shape(value)

    # ---- between phases and after the rewriter ----

    def next_phase(self) -> None:
        """Between two phases of rules: the next phase must not match a fused norm's nodes again."""
        self.remove_dead()
        self._phase += 1

    def remove_dead(self) -> None:
        """Removes what the fusions so far made dead."""
        for fused in self.fused:
            fused.removed += [node for node in _remove_dead(fused.matched) if node not in fused.removed]
            for value in fused.initializers:
                if value.graph is not None and not (value.uses() or value.is_graph_input() or value.is_graph_output()):
                    value.graph.initializers.pop(value.name)

    def finish(self, model: ir.Model, annotations: Annotations) -> FusionReport:
        """Removes what the fusions made dead, restores the names the rewriter changed, names and types the new
        nodes' outputs, and builds the report. Fusions and near misses are listed in the order the rewriter meets
        their last nodes (a graph's subgraphs at their node, functions after the main graph)."""
        self.fused.sort(key=lambda fused: self._position(fused.root))
        self.remove_dead()
        annotations.restore_names()
        annotations.restore_types()  # the rewriter annotates Constant outputs
        _type_function_calls(model, [fused.node for fused in self.fused], self.types)
        new_values = {value for fused in self.fused for value in _new_values(fused, annotations)}
        taken = {
            value.name
            for graph in graph_likes(model)
            for value in values_of(graph)
            if value.name and value not in new_values
        }
        node_names = _NodeNames(annotations)
        # Before IR 10 a function body has no value_info: onnx_ir writes its types into the main graph under names it
        # cannot read back when they contain "/", so a second run would drop them. There the values the pass makes
        # in functions stay unannotated, as the rest of the body is.
        unannotated = set() if model.ir_version >= 10 else {
            graph for function in model.functions.values() for graph in _graphs_of(function)
        }
        for fused in self.fused:
            node_names.give(fused.node, fused.node.name)
            _finish_outputs(fused, taken, annotations, node_names)
            if fused.node.graph in unannotated:
                for value in _new_values(fused, annotations):
                    value.type, value.shape = None, None
            fused.record.node = fused.node.name
            replaced = fused.matched + [node for node in fused.removed if node not in fused.matched]
            fused.record.replaced_nodes = [label(node).strip("'") for node in replaced]
        _restore_topological_order([fused.node for fused in self.fused if fused.record.skip])
        return self.report()

    def report(self) -> FusionReport:
        report = FusionReport(target=self.target.name, notes=list(self.notes))
        report.fusions = [fused.record for fused in self.fused]
        removed_by = {node: fused for fused in self.fused for node in (*fused.removed, *fused.matched)}
        entries = []
        for miss in self._near_misses.values():
            rule, nodes = miss.rule_and_nodes()
            fused = next((removed_by[node] for node in nodes if node in removed_by), None)
            # Where the rewriter met the candidate: its last node, or that of the smaller form that was fused.
            roots = [root for *_, root in miss.seen] + ([fused.root] if fused is not None else [])
            met = min(self._position(root) for root in roots)
            names = [label(node).strip("'") for node in nodes]
            entries.append((met, Skipped(miss.location, names, miss.reason, rule, fused.node.name if fused else None)))
        report.skipped = [entry for _, entry in sorted(entries, key=lambda item: item[0])]
        return report

    def _position(self, node: ir.Node) -> int:
        """Where the rewriter meets ``node``: a node the pass emitted stands where the match it replaced ended."""
        if node in self._order:
            return self._order[node]
        emitted = next((fused for fused in self.fused if fused.node is node), None)
        return self._position(emitted.root) if emitted is not None else len(self._order)


def as_float32(number: float) -> float:
    """The value a float32 attribute holds, written with the fewest digits (1e-06, not 9.999999974752427e-07)."""
    return float(str(np.float32(number)))


def _qualified(node: ir.Node) -> str:
    return f"{node.domain}.{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type


def _record_of_existing_norm(norm: ir.Node, target: str, location: str, types: TypeTable) -> Fusion:
    """A record for a norm node that was already in the model (fused by an earlier run or by hand)."""
    scale = norm.inputs[-1] if len(norm.inputs) > 1 else None
    placement = "outside_sqrt" if int_attribute(norm, "eps_outside_sqrt", 0) else "inside_sqrt"
    return Fusion(
        op_type=norm.op_type,
        target=target,
        node=norm.name,
        replaced_nodes=[],
        location=location,
        axis=int_attribute(norm, "axis", -1),
        epsilon=as_float32(float_attribute(norm, "epsilon", DEFAULT_EPSILON)),
        eps_placement=placement,
        scale="tensor" if scale is not None else "none",
        input_dtype=dtype_name(types.dtype(norm.inputs[0])),
        scale_dtype=dtype_name(types.dtype(scale)) if scale is not None else None,
        skip=False,
        rule="(fused before this run)",
    )


def _read(nodes) -> set[ir.Value]:
    return {value for node in nodes for value in node.inputs if value is not None and value.is_initializer()}


def _remove_dead(seeds: list[ir.Node]) -> list[ir.Node]:
    """Removes the seeds and their producers, as far as they are dead now (no uses, not graph outputs), and the
    initializers only they used. Returns the nodes removed."""
    removed: list[ir.Node] = []
    pending = list(seeds)
    while pending:
        node = pending.pop()
        graph = node.graph
        if graph is None or any(value.is_graph_output() or value.uses() for value in node.outputs):
            continue
        inputs = [value for value in node.inputs if value is not None]
        graph.remove(node, safe=True)
        removed.append(node)
        for value in inputs:
            if value.producer() is not None:
                pending.append(value.producer())
            elif value.is_initializer() and not (value.uses() or value.is_graph_input() or value.is_graph_output()):
                value.graph.initializers.pop(value.name)
    return removed


def _type_function_calls(model: ir.Model, emitted: list[ir.Node], types: TypeTable) -> None:
    """ONNX and onnxruntime infer the outputs of a call to a model-local function from the function's body, and an
    operator without an ONNX schema there (ours, or SimplifiedLayerNormalization for onnx.checker) leaves them
    untyped, so that ops reading them fail type inference. The outputs of calls to a function that now holds a fused
    node keep the types and shapes inferred before (written as value_info)."""
    in_graph = {node.graph for node in emitted}
    for function in model.functions.values():
        if not in_graph & _graphs_of(function):
            continue
        for _, call in call_sites(model, function):
            for value in call.outputs:
                dtype, shape = types.dtype(value), types.shape(value)
                if dtype is not None:
                    value.dtype = dtype
                if shape is not None:
                    value.shape = shape


def _graphs_of(function: ir.Function) -> set[ir.Graph]:
    """The function's body and every subgraph in it."""
    return {function.graph, *function.subgraphs()}


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


def _new_constants(node: ir.Node, annotations: Annotations) -> list[ir.Node]:
    """The Constant nodes the pass made for ``node`` (a folded, converted or ones scale, an expanded gamma). An input
    produced by another fused node (a norm right after a norm) is a value of the model, not one of these."""
    producers = [value.producer() for value in node.inputs if value is not None]
    return [
        producer
        for producer in producers
        if producer is not None and producer.op_type == "Constant" and not annotations.existed(producer)
    ]


def _new_values(fused: FusedNode, annotations: Annotations) -> list[ir.Value]:
    """Outputs of the emitted node and of the constants the pass made for it."""
    created = _new_constants(fused.node, annotations)
    return [*fused.node.outputs, *(value for node in created for value in node.outputs)]


def _finish_outputs(fused: FusedNode, taken: set[str], annotations: Annotations, node_names: _NodeNames) -> None:
    """Each output that replaced a value takes its name, type and shape (value_info helps onnxruntime's later
    optimizations); optional outputs nobody reads are dropped or left unnamed; new constants get unique names."""
    node = fused.node
    for value, (name, dtype, shape) in zip(node.outputs, fused.output_facts):
        if name:
            value.name = _unique(name, taken)
        if dtype is not None:
            value.dtype = dtype
        if shape is not None:
            value.shape = shape
    read = [index == 0 or bool(value.uses()) or value.is_graph_output() for index, value in enumerate(node.outputs)]
    node.resize_outputs(max(index for index, flag in enumerate(read) if flag) + 1)
    for value, flag in zip(node.outputs, read):
        if not flag:
            value.name = ""
    for producer in _new_constants(node, annotations):
        node_names.give(producer, f"{node.name}/scale")
        producer.outputs[0].name = _unique(f"{node.name}/scale", taken)


def _unique(name: str, taken: set[str]) -> str:
    candidate, counter = name, 1
    while candidate in taken:
        candidate, counter = f"{name}_{counter}", counter + 1
    taken.add(candidate)
    return candidate


class _NodeNames:
    """Node names must be unique within a graph: gives each new node ``name``, with a suffix if a node of the model
    or an earlier new node there has it."""

    def __init__(self, annotations: Annotations) -> None:
        self._annotations = annotations
        self._taken: dict[int, set[str]] = {}

    def give(self, node: ir.Node, name: str) -> None:
        graph = node.graph
        if id(graph) not in self._taken:
            self._taken[id(graph)] = {other.name for other in graph if other.name and self._annotations.existed(other)}
        node.name = _unique(name or node.op_type, self._taken[id(graph)])


def node_path(node: ir.Node) -> str:
    """The path prefix of a node's name (``/model/layers.0/`` of ``/model/layers.0/add``), or the name and a slash."""
    if "/" in node.name:
        return node.name.rsplit("/", 1)[0] + "/"
    return f"{node.name}/" if node.name else ""


def fused_node_name(matched: list[ir.Node], top: ir.Node, op_type: str) -> str:
    """``/model/layers.0/input_layernorm/RMSNorm`` when the replaced nodes share a path prefix, else derived from the
    last replaced node's name."""
    names = [node.name for node in matched if node.name]
    prefix = os.path.commonprefix(names) if names else ""
    short_op = op_type.rsplit(".", 1)[-1]
    if "/" in prefix:
        return prefix[: prefix.rindex("/") + 1] + short_op
    return f"{top.name}/{short_op}" if top.name else short_op
