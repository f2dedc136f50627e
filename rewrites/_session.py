"""What one run of the rules shares: its target, the facts about the model's values, where each graph lies, and the
record of what was fused or not, from which the report is made. The clean-up after the rules is ``_cleanup``'s."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from ort_rmsnorm.contract import AXIS, DEFAULT_EPSILON, EPS_INSIDE, EPS_OUTSIDE, EPS_OUTSIDE_SQRT, EPSILON
from ort_rmsnorm.model.graphs import Scope

from ._facts import Facts, NotFusable, dtype_name, float_attribute, int_attribute, label
from ._report import Fusion, FusionReport, Skipped
from ._specs import NormSpec
from ._target_base import Target


ValueFacts = tuple[str | None, ir.DataType | None, ir.Shape | None]
"""The name, type and shape of a value an emitted value takes the place of ((None, None, None): a new optional
output)."""


@dataclasses.dataclass
class FusedNode:
    """What the pass emitted for one norm: its node (the norm op) and, where a target writes a norm as several
    nodes (Casts, the residual Add, the decomposed ops), the others (found by ``_cleanup``), with what the emitted
    values take the place of."""

    node: ir.Node
    record: Fusion
    matched: list[ir.Node]
    """Nodes of the original model the rule(s) matched (removed now or by the clean-up)."""
    outputs: list[tuple[ir.Value, ValueFacts]]
    """Each emitted value that stands for a value of the model (or, from ``node``, a new optional output), with
    that value's facts; ``node``'s outputs come first, in their order."""
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
    """One run of the rules over a model.

    ``facts`` should come from :func:`infer_types`; without it only the model's own annotations are known and more
    candidates are skipped for unknown shapes. ``scopes`` and ``order`` (:mod:`ort_rmsnorm.model.graphs`) name where
    each graph lies and order the report as the rewriter meets the nodes; without them graphs are named by their
    own names. ``notes`` open the report. ``through_qdq``: see ``_quantized``."""

    def __init__(
        self,
        target: Target,
        facts: Facts,
        scopes: Sequence[Scope] = (),
        order: dict[ir.Node, int] | None = None,
        notes: Sequence[str] = (),
        through_qdq: bool = False,
    ):
        self.target = target
        self.through_qdq = through_qdq
        """Fuse norms across the QuantizeLinear/DequantizeLinear pairs inside them (``_quantized``)."""
        self.facts = facts
        self._locations = {id(scope.graph): scope.location for scope in scopes}
        self._order = order or {}
        self.phase = 0
        """The phase of rules running (``_phases``): a near miss of a later phase is that of a smaller form."""
        self.fused: list[FusedNode] = []
        self._fused_by_node: dict[ir.Node, FusedNode] = {}  # by the node each fusion emitted last (``.node``)
        self._emitted: set[ir.Value] = set()  # the values of every fusion's ``outputs``
        self._near_misses: dict[tuple, NearMiss] = {}
        self._anchors: set[ir.Node] = set()  # the anchors of every near miss, left_alone's too
        self._kept: dict[str, int] = {}
        self._missed: set[ir.Node] = set()
        """The anchors of the near misses recorded (:meth:`has_near_miss`)."""
        self.notes: list[str] = list(notes)

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
            self._anchors.add(anchor)
        entry.seen.append((self.phase, rule, list(context.nodes), met if met is not None else context.root))
        self._missed.add(anchor)

    def has_anchor(self, node: ir.Node) -> bool:
        """Whether a near miss (a rule's, or one left alone) is identified by ``node``."""
        return node in self._anchors

    def has_near_miss(self, anchor: ir.Node) -> bool:
        """Whether a rule already said why the candidate identified by ``anchor`` stays."""
        return anchor in self._missed

    def fused_norm(
        self,
        spec: NormSpec,
        node: ir.Node,
        context,
        rule: str,
        converted_from: str | None = None,
        replaced: list[ir.Value | None] | None = None,
        skip: bool = False,
        emitted: list[ir.Value] | None = None,
        op_type: str | None = None,
    ) -> None:
        """``node`` (the target's norm op, or with ``skip`` its skip op, converted from another runtime's) replaced
        the match. ``replaced[i]``: the value ``emitted[i]`` takes the place of (None: a new optional output; by
        default the match's one output), ``emitted`` by default ``node``'s outputs. ``op_type``: what the report
        calls the emitted op (default ``node``'s)."""
        replaced = replaced if replaced is not None else [context.output_values[0]]
        emitted = emitted if emitted is not None else list(node.outputs[: len(replaced)])
        record = Fusion(
            op_type=op_type or self.target.label(node),
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
            choice=spec.choice,
            derivation=spec.derivation,
        )
        outputs = [(new, self._facts(old) if old is not None else (None, None, None))
                   for new, old in zip(emitted, replaced)]
        self._add(FusedNode(node, record, list(context.nodes), outputs, context.root, [], _read(context.nodes)))
        self._learn(emitted, replaced)

    def written(self, node: ir.Node | None) -> bool:
        """Whether the pass wrote ``node`` in this run (known where the run has the model's node order): such a node
        is never a candidate of a later phase, and its name is none the report may give."""
        return node is not None and bool(self._order) and node not in self._order

    def emitted(self, value: ir.Value) -> bool:
        """Whether ``value`` is one the pass emitted in place of a value of the model."""
        return value in self._emitted

    def kept(self, op: str) -> None:
        """A norm op of the model that the target would write as it is (``auto``): it stays, counted in the notes."""
        self._kept[op] = self._kept.get(op, 0) + 1

    def left_alone(self, graph_like: ir.Graph | ir.Function, node: ir.Node, rule: str, reason: str) -> None:
        """A norm op that stays in the model as it is, and why (unless a rule already said why not)."""
        if node not in self._anchors:
            self._near_misses[(node, reason)] = NearMiss(
                self.location(graph_like), reason, [(self.phase, rule, [node], node)]
            )
            self._anchors.add(node)

    def fused_residual(
        self,
        norm: ir.Node,
        node: ir.Node,
        context,
        rule: str,
        replaced: list[ir.Value | None],
        roundings: tuple[str, ...] = (),
        choice: str | None = None,
    ) -> None:
        """The residual Add before ``norm`` was fused into ``node``: extends the norm's record (or makes one for a norm
        that was in the model already). ``replaced[i]``: the value output i of ``node`` takes the place of (None for an
        optional output that nothing read before); output 0 replaces the norm's output. ``roundings``: as
        :attr:`NormSpec.roundings`, for the sum."""
        earlier = self._fused_by_node.get(norm)
        if earlier is None:
            location = self.location(context.graph_or_function)
            record = _record_of_existing_norm(norm, self.target.name, location, self.facts)
            earlier = FusedNode(norm, record, [norm], [(norm.outputs[0], self._facts(norm.outputs[0]))], norm)
            self._add(earlier)
        norm_facts = next(facts for value, facts in earlier.outputs if value is norm.outputs[0])
        self._emitted.difference_update(value for value, _ in earlier.outputs)
        earlier.outputs = [(node.outputs[0], norm_facts)] + [
            (new, self._facts(old) if old is not None else (None, None, None))
            for new, old in zip(node.outputs[1:], replaced[1:])
        ] + [(value, facts) for value, facts in earlier.outputs
             if value.producer() is not norm and not any(value is old for old in replaced)]
        self._emitted.update(value for value, _ in earlier.outputs)
        del self._fused_by_node[earlier.node]
        earlier.node = node
        self._fused_by_node[node] = earlier
        self._learn(list(node.outputs), replaced)
        earlier.record.op_type = self.target.label(node)
        earlier.record.skip = True
        if choice is not None:
            earlier.record.choice = choice
        earlier.record.rule += f" + {rule}"
        earlier.record.roundings += [rounding for rounding in roundings if rounding not in earlier.record.roundings]
        earlier.matched += [
            matched for matched in context.nodes if matched is not norm and matched not in earlier.matched
        ]
        earlier.initializers |= _read(context.nodes)

    def _add(self, fused: FusedNode) -> None:
        self.fused.append(fused)
        self._fused_by_node[fused.node] = fused
        self._emitted.update(value for value, _ in fused.outputs)

    def _learn(self, emitted: list[ir.Value], replaced: list[ir.Value | None]) -> None:
        """Emitted values have the types and shapes of the values they replace (later rules read them)."""
        for new, old in zip(emitted, replaced):
            if old is not None:
                dtype, shape = self.facts.dtype(old), self.facts.shape(old)
                if dtype:
                    self.facts.types.learn({new: (dtype, shape)})
                self.facts.types.stands_for(new, old)

    def _facts(self, value: ir.Value) -> tuple[str | None, ir.DataType | None, ir.Shape | None]:
        return value.name, self.facts.dtype(value), self.facts.shape(value)

    # ---- the report ----

    def report(self) -> FusionReport:
        """The fusions in their order here (``_cleanup.finish`` puts them in the order the rewriter meets their last
        nodes), near misses in the order the rewriter met them (a graph's subgraphs at their node, functions after the
        main graph)."""
        kept = [f"{count} x {op} kept: already the faster op here" for op, count in self._kept.items()]
        report = FusionReport(target=self.target.name, notes=list(self.notes) + kept)
        report.fusions = [fused.record for fused in self.fused]
        removed_by = {node: fused for fused in self.fused for node in (*fused.removed, *fused.matched)}
        entries = []
        for miss in self._near_misses.values():
            rule, nodes = miss.rule_and_nodes()
            fused = next((removed_by[node] for node in nodes if node in removed_by), None)
            # Where the rewriter met the candidate: its last node, or that of the smaller form that was fused.
            roots = [root for *_, root in miss.seen] + ([fused.root] if fused is not None else [])
            met = min(self.position(root) for root in roots)
            names = [label(node).strip("'") for node in nodes]
            entries.append((met, Skipped(miss.location, names, miss.reason, rule, fused.node.name if fused else None)))
        report.skipped = [entry for _, entry in sorted(entries, key=lambda item: item[0])]
        return report

    def position(self, node: ir.Node) -> int:
        """Where the rewriter meets ``node``: a node the pass emitted stands where the match it replaced ended."""
        if node in self._order:
            return self._order[node]
        emitted = self._fused_by_node.get(node)
        return self.position(emitted.root) if emitted is not None else len(self._order)


def as_float32(number: float) -> float:
    """The value a float32 attribute holds, written with the fewest digits (1e-06, not 9.999999974752427e-07)."""
    return float(str(np.float32(number)))


def _record_of_existing_norm(norm: ir.Node, target: str, location: str, facts: Facts) -> Fusion:
    """A record for a norm node that was already in the model (fused by an earlier run or by hand)."""
    scale = norm.inputs[-1] if len(norm.inputs) > 1 else None
    placement = EPS_OUTSIDE if int_attribute(norm, EPS_OUTSIDE_SQRT, 0) else EPS_INSIDE
    return Fusion(
        op_type=norm.op_type,
        target=target,
        node=norm.name,
        replaced_nodes=[],
        location=location,
        axis=int_attribute(norm, AXIS, -1),
        epsilon=as_float32(float_attribute(norm, EPSILON, DEFAULT_EPSILON)),
        eps_placement=placement,
        scale="tensor" if scale is not None else "none",
        input_dtype=dtype_name(facts.dtype(norm.inputs[0])),
        scale_dtype=dtype_name(facts.dtype(scale)) if scale is not None else None,
        skip=False,
        rule="(fused before this run)",
    )


def _read(nodes) -> set[ir.Value]:
    return {value for node in nodes for value in node.inputs if value is not None and value.is_initializer()}
