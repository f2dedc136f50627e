"""The graphs of an onnx_ir model: its main graph, its model-local functions and every subgraph (If/Loop/Scan bodies)
inside them, walked once, in the order onnxscript's rewriter visits them (:func:`walk`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import onnx_ir as ir


@dataclasses.dataclass(frozen=True)
class Scope:
    """One graph-like of a model."""

    graph: ir.Graph | ir.Function
    location: str
    """Where it is: ``main graph``, ``function 'domain::name'``, ``If 'n3'.then_branch``,
    ``Loop 'l'.body/If 'n3'.else_branch``..."""
    top: ir.Graph | ir.Function
    """The main graph or the model-local function it lies in."""


def _visit(model: ir.Model) -> Iterator[tuple[Scope, ir.Node | None]]:
    """``(scope, None)`` on entering each graph-like, ``(scope, node)`` for each of its nodes, in :func:`walk`'s
    order."""

    def visit(graph_like: ir.Graph | ir.Function, where: str, prefix: str, top) -> Iterator:
        scope = Scope(graph_like, where, top)
        yield scope, None
        for node in graph_like:
            yield scope, node
            for attr in node.attributes.values():
                if not isinstance(attr, ir.Attr):
                    continue  # a reference to a function's attribute holds no graph
                if attr.type == ir.AttributeType.GRAPH:
                    path = f"{prefix}{node.op_type} '{node.name}'.{attr.name}"
                    yield from visit(attr.value, path, path + "/", top)
                elif attr.type == ir.AttributeType.GRAPHS:
                    for index, subgraph in enumerate(attr.value):
                        path = f"{prefix}{node.op_type} '{node.name}'.{attr.name}[{index}]"
                        yield from visit(subgraph, path, path + "/", top)

    yield from visit(model.graph, "main graph", "", model.graph)
    for function in model.functions.values():
        where = f"function '{function.domain}::{function.name}'" + (
            f" ({function.overload})" if function.overload else ""
        )
        yield from visit(function, where, where + "/", function)


def walk(model: ir.Model) -> Iterator[tuple[Scope, ir.Node]]:
    """Every node of ``model`` with the graph-like it lies in, in the order onnxscript's rewriter visits them: the main
    graph's nodes in order, each node's subgraphs right after it, then every function likewise."""
    return ((scope, node) for scope, node in _visit(model) if node is not None)


def scopes(model: ir.Model) -> list[Scope]:
    """Every graph-like of the model (empty ones too), in :func:`walk`'s order."""
    return [scope for scope, node in _visit(model) if node is None]


def nodes(model: ir.Model) -> Iterator[ir.Node]:
    """Every node of the model, in :func:`walk`'s order."""
    return (node for _, node in walk(model))


def graph_likes(model: ir.Model) -> list[ir.Graph | ir.Function]:
    """The main graph, every model-local function and every subgraph inside any of them."""
    return [scope.graph for scope in scopes(model)]


def values_of(graph_like: ir.Graph | ir.Function) -> Iterator[ir.Value]:
    """Inputs, initializers and node outputs of one graph (not of its subgraphs)."""
    yield from graph_like.inputs
    if isinstance(graph_like, ir.Graph):
        yield from graph_like.initializers.values()
    for node in graph_like:
        yield from node.outputs


def all_call_sites(model: ir.Model) -> dict[ir.Function, list[tuple[ir.Graph | ir.Function, ir.Node]]]:
    """The nodes calling each model-local function that is called, each with the main graph or function it lies in
    (possibly inside a subgraph): one walk of the model for all of them."""
    functions = model.functions
    found: dict[ir.Function, list[tuple[ir.Graph | ir.Function, ir.Node]]] = {}
    for scope, node in walk(model):
        function = functions.get(node.op_identifier())
        if function is not None:
            found.setdefault(function, []).append((scope.top, node))
    return found


def all_bodies(model: ir.Model) -> dict[ir.Function, set[ir.Graph]]:
    """The graphs each model-local function's nodes lie in (``node.graph``): its body and every subgraph in it; one
    walk of the model for all of them."""
    found: dict[ir.Function, set[ir.Graph]] = {}
    for scope in scopes(model):
        if isinstance(scope.top, ir.Function):
            graph = scope.graph.graph if isinstance(scope.graph, ir.Function) else scope.graph
            found.setdefault(scope.top, set()).add(graph)
    return found
