"""Names the pass gives: to the nodes it emits (after the replaced nodes' path), and unique names in a graph."""

from __future__ import annotations

import os

import onnx_ir as ir

from ort_rmsnorm.contract import unqualified


def node_path(node: ir.Node) -> str:
    """The path prefix of a node's name (``/model/layers.0/`` of ``/model/layers.0/add``), or the name and a slash."""
    if "/" in node.name:
        return node.name.rsplit("/", 1)[0] + "/"
    return f"{node.name}/" if node.name else ""


def fused_node_name(matched: list[ir.Node], top: ir.Node, op: str) -> str:
    """``/model/layers.0/input_layernorm/RMSNorm`` when the replaced nodes share a path prefix, else derived from the
    last replaced node's name. ``op``: the emitted op, domain-qualified or not."""
    names = [node.name for node in matched if node.name]
    prefix = os.path.commonprefix(names) if names else ""
    op_type = unqualified(op)[1]
    if "/" in prefix:
        return prefix[: prefix.rindex("/") + 1] + op_type
    return f"{top.name}/{op_type}" if top.name else op_type


def unique(name: str, taken: set[str]) -> str:
    """``name``, or ``name_1``, ``name_2``... if taken; the name returned is taken from then on."""
    candidate, counter = name, 1
    while candidate in taken:
        candidate, counter = f"{name}_{counter}", counter + 1
    taken.add(candidate)
    return candidate


class NodeNames:
    """Node names must be unique within a graph: gives each new node ``name``, with a suffix if a node of the model
    (``existed``) or an earlier new node there has it."""

    def __init__(self, existed) -> None:
        self._existed = existed
        self._taken: dict[int, set[str]] = {}

    def give(self, node: ir.Node, name: str) -> None:
        graph = node.graph
        if id(graph) not in self._taken:
            self._taken[id(graph)] = {other.name for other in graph if other.name and self._existed(other)}
        node.name = unique(name or node.op_type, self._taken[id(graph)])
