"""The model's own names and annotations, kept to be restored after the rewriter (which renames values on its way
out and annotates the Constant outputs it makes)."""

from __future__ import annotations

import onnx_ir as ir

from ort_rmsnorm.model.graphs import graph_likes, nodes, values_of


class Annotations:
    """A snapshot of every value's name, type and shape and every node's name, to restore after the pass."""

    def __init__(self, model: ir.Model) -> None:
        self._values = {
            value: (value.name, value.type, value.shape) for graph in graph_likes(model) for value in values_of(graph)
        }
        self._nodes = {node: node.name for graph in graph_likes(model) for node in graph}

    def restore_types(self) -> None:
        for value, (_, type_, shape) in self._values.items():
            value.type, value.shape = type_, shape

    def restore_names(self) -> None:
        """Original names back on every value and node that existed before (the rest are the pass's own)."""
        for value, (name, _, _) in self._values.items():
            if value.name != name:
                value.name = name
        for node, name in self._nodes.items():
            node.name = name

    def existed(self, item: ir.Value | ir.Node) -> bool:
        return item in self._values or item in self._nodes


def visiting_order(model: ir.Model) -> dict[ir.Node, int]:
    """Each node's place in the order onnxscript's rewriter visits nodes (:func:`ort_rmsnorm.model.graphs.walk`)."""
    return {node: index for index, node in enumerate(nodes(model))}
