"""ONNX shape inference on a model proto, and the dims it leaves unknown that the graph itself shows.

:func:`infer_shapes` runs ``onnx.shape_inference.infer_shapes`` (symbolic dims, data propagation). Where that leaves a
dim unknown (or an invented ``unk__N``) that follows from the graph, the dim is put back as an annotation of the value
and inference runs again, so that it reaches everything after it (each round can reach nodes further down):

- **Slice** with computed starts or ends (TorchScript exports of Phi-3 split the MLP's gate and up so, from
  ``Shape``): ONNX infers only the rank; the dims the slice does not touch (constant ``axes``) are the input's.
- **Reshape** whose shape input ONNX's data propagation cannot follow (a ``Div`` of dims, a vision tower's patch
  grid) or whose ``-1`` it cannot resolve with symbolic dims (``Reshape(x, [batch, -1])``): the shape input is
  evaluated from ``Shape``, ``Gather``, ``Slice``, ``Concat``, ``Unsqueeze``/``Squeeze``, ``Cast`` and integer
  arithmetic of the inferred dims, ``0`` copies the input's dim, and ``-1`` is the input's element count divided by
  the other dims, symbols cancelling (``[batch, 4, 8]`` to ``[batch, -1]`` is ``[batch, 32]``).
- **Loop-carried values**: ONNX gives a Loop body's carried inputs no shape (they may change from one iteration to
  the next). Where inference with the initial value's dims assumed for the body input gives the body output the
  same dims, they hold in every iteration (by induction) and the body input keeps them; dims the body changes are
  dropped from the assumption and it is tried again.

Each refinement, and each op whose integer output is evaluated, is one function registered by op type
(``_REFINEMENTS``, ``_EVALUATORS``), as onnx_ir's symbolic shape inference registers one inference function per op.

Only sizes and the model's own symbols (those of its inputs, outputs and annotations) are put back: ONNX invents new
``unk__N`` symbols in every run. A dim ONNX inferred as a size is never replaced, nor one of the model's symbols by
another.

:func:`names_apart` comes first: ONNX's data propagation keeps the values it computes by name across all of a
model's graphs, so two subgraphs that use one name for different values get each other's. optimum's merged decoder
is such a model (both branches of its ``If`` are exports of one module): the shapes of its no-past branch came out
wrong (a rank-5 reshape of a rank-4 tensor) and, from there, unknown.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Iterator, Mapping

import numpy as np
import onnx
from onnx import numpy_helper

from ..contract import ONNX_DOMAINS

Entry = int | str | None
"""One element of a shape computation: a size, a symbol, or unknown."""
_MAX_ELEMENTS = 64  # longer int tensors are not shapes
_MAX_DEPTH = 64


# ---- the graphs of a proto ---------------------------------------------------------------------------------------


def proto_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and every subgraph in it, in onnx_ir's order (``Model.graphs()``): each graph before its nodes'
    subgraphs, nodes and attributes in order."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from proto_graphs(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for subgraph in attr.graphs:
                    yield from proto_graphs(subgraph)


def _defined(graph: onnx.GraphProto) -> list[str]:
    """The names a graph defines: its inputs, initializers and node outputs."""
    names = [info.name for info in graph.input] + [tensor.name for tensor in graph.initializer]
    names += [tensor.values.name for tensor in graph.sparse_initializer]
    return names + [name for node in graph.node for name in node.output if name]


# ---- names apart -------------------------------------------------------------------------------------------------


def names_apart(proto: onnx.ModelProto) -> list[dict[str, str]]:
    """Renames, in place, each value a subgraph defines under a name that another graph of the model defines too;
    returns, per graph in :func:`proto_graphs`' order, ``{original name: new name}`` of the values it defines."""
    taken = {name for graph in proto_graphs(proto.graph) for name in _defined(graph)}
    seen: set[str] = set()
    renames: list[dict[str, str]] = []

    def fresh(name: str) -> str:
        for index in itertools.count(1):
            candidate = f"{name}__{index}"
            if candidate not in taken:
                taken.add(candidate)
                return candidate
        raise AssertionError  # unreachable

    def visit(graph: onnx.GraphProto, scope: dict[str, str]) -> None:
        own = {}
        for name in _defined(graph):
            if name in seen and name not in own:
                own[name] = fresh(name)
            seen.add(name)
        mapping = {**scope, **own}
        if mapping:
            _rename(graph, mapping)
        renames.append(own)
        for node in graph.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    visit(attr.g, mapping)
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    for subgraph in attr.graphs:
                        visit(subgraph, mapping)

    visit(proto.graph, {})
    return renames


def _rename(graph: onnx.GraphProto, mapping: Mapping[str, str]) -> None:
    """Renames the values of one graph (not of its subgraphs) by ``mapping``."""
    for info in (*graph.input, *graph.output, *graph.value_info):
        info.name = mapping.get(info.name, info.name)
    for tensor in graph.initializer:
        tensor.name = mapping.get(tensor.name, tensor.name)
    for tensor in graph.sparse_initializer:
        tensor.values.name = mapping.get(tensor.values.name, tensor.values.name)
    for node in graph.node:
        node.input[:] = [mapping.get(name, name) for name in node.input]
        node.output[:] = [mapping.get(name, name) for name in node.output]


# ---- inference with refinements ----------------------------------------------------------------------------------


def infer_shapes(proto: onnx.ModelProto, overridable: frozenset[str] = frozenset()) -> onnx.ModelProto:
    """ONNX inference of ``proto`` (a model, or a function body as one), with the dims of the module doc put back
    while that gains any. Values should be named apart (:func:`names_apart`). ``overridable``: initializers that are
    also graph inputs (their values are no constants). Every round gains some value a dim, so a cap of one round per
    refinable node only stops a model whose values gain dims piecemeal or back and forth; the dims gained until then
    stand."""
    model = _Model(proto, overridable)
    carried = _loop_carried(model)
    refined: dict[str, onnx.ValueInfoProto] = {}
    inferred = proto
    for _ in range(len(model.refinable) + 1):
        inferred = model.run(carried, refined)
        gained = _dims_gained(_Values(model, inferred))
        if not gained:
            return inferred
        refined.update(gained)
    return inferred


class _Model:
    """What stays the same from one round of inference to the next: the graphs' places, the nodes, the constants."""

    def __init__(self, proto: onnx.ModelProto, overridable: frozenset[str]) -> None:
        self.proto = proto
        self.paths = list(_graph_paths(proto.graph, ()))
        graphs = self.graphs(proto)
        self.home = {name: index for index, graph in enumerate(graphs) for name in _defined(graph)}
        """The graph (its index in :attr:`paths`) that defines each value."""
        self.stable = {
            dim.dim_param
            for graph in graphs
            for info in (*graph.input, *graph.output, *graph.value_info)
            for dim in info.type.tensor_type.shape.dim
            if dim.dim_param
        }
        """The model's own symbols (ONNX invents others in every run)."""
        self.producers: dict[str, onnx.NodeProto] = {}
        self.constants: dict[str, onnx.TensorProto | onnx.NodeProto] = {}
        self.refinable: list[onnx.NodeProto] = []
        self.loops: list[onnx.NodeProto] = []
        for graph in graphs:
            for tensor in graph.initializer:
                if tensor.name not in overridable:
                    self.constants[tensor.name] = tensor
            for node in graph.node:
                for name in node.output:
                    self.producers[name] = node
                if node.domain not in ONNX_DOMAINS:
                    continue
                if node.op_type == "Constant" and node.output:
                    self.constants[node.output[0]] = node
                elif node.op_type in _REFINEMENTS and node.output and node.output[0]:
                    self.refinable.append(node)
                elif node.op_type == "Loop":
                    self.loops.append(node)
        self._ints: dict[str, np.ndarray | None] = {}

    def graphs(self, proto: onnx.ModelProto) -> list[onnx.GraphProto]:
        """The graphs of ``proto`` (this model or a copy of it), in :func:`proto_graphs`' order."""
        found = []
        for path in self.paths:
            graph = proto.graph
            for node_index, attribute_index, graph_index in path:
                attr = graph.node[node_index].attribute[attribute_index]
                graph = attr.g if graph_index < 0 else attr.graphs[graph_index]
            found.append(graph)
        return found

    def constant_ints(self, name: str) -> np.ndarray | None:
        """A small integer constant's value (an initializer or a Constant node's), else None."""
        if name not in self._ints:
            source = self.constants.get(name)
            if isinstance(source, onnx.NodeProto):
                self._ints[name] = _constant_node_ints(source)
            else:
                self._ints[name] = _small_ints(source) if source is not None else None
        return self._ints[name]

    def run(self, inputs: Mapping[str, onnx.ValueInfoProto],
            annotations: Mapping[str, onnx.ValueInfoProto]) -> onnx.ModelProto:
        """ONNX inference of a copy of the model whose graph inputs named in ``inputs`` and values named in
        ``annotations`` carry those types (an annotation goes to the graph that defines the value)."""
        annotated = onnx.ModelProto()
        annotated.CopyFrom(self.proto)
        if inputs or annotations:
            by_graph = collections.defaultdict(list)
            for name, info in annotations.items():
                by_graph[self.home.get(name, 0)].append(info)
            for index, graph in enumerate(self.graphs(annotated)):
                for info in graph.input:
                    if info.name in inputs:
                        info.CopyFrom(inputs[info.name])
                if by_graph[index]:
                    kept = [info for info in graph.value_info if info.name not in annotations]
                    del graph.value_info[:]
                    graph.value_info.extend([*kept, *by_graph[index]])
        return onnx.shape_inference.infer_shapes(annotated, check_type=False, strict_mode=False, data_prop=True)


def _graph_paths(graph: onnx.GraphProto, prefix: tuple) -> Iterator[tuple]:
    """Where each graph lies, in :func:`proto_graphs`' order: ``(node index, attribute index, index in GRAPHS or
    -1)`` per level."""
    yield prefix
    for node_index, node in enumerate(graph.node):
        for attribute_index, attr in enumerate(node.attribute):
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _graph_paths(attr.g, (*prefix, (node_index, attribute_index, -1)))
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for graph_index, subgraph in enumerate(attr.graphs):
                    yield from _graph_paths(subgraph, (*prefix, (node_index, attribute_index, graph_index)))


def _dims_gained(values: _Values) -> dict[str, onnx.ValueInfoProto]:
    """The values (every graph) whose dims the refinements of the module doc show better than this round's
    inference."""
    gained = {}
    for node in values.model.refinable:
        dims = _REFINEMENTS[node.op_type](node, values)
        info = _filled(values, node.output[0], node.input[0], dims) if dims is not None else None
        if info is not None:
            gained[info.name] = info
    return gained


def _filled(values: _Values, name: str, source: str, dims: list[Entry]) -> onnx.ValueInfoProto | None:
    """The value's type with ``dims`` filled in: a size where the value's dim is no size, one of the model's symbols
    where it is neither a size nor one of them; None when nothing changes (or the ranks disagree)."""
    current = values.infos.get(name)
    info = onnx.ValueInfoProto()
    if current is not None:
        info.CopyFrom(current)
    else:
        info.name = name
        source_info = values.infos.get(source)
        if source_info is None or not source_info.type.tensor_type.elem_type:
            return None
        info.type.tensor_type.elem_type = source_info.type.tensor_type.elem_type
    tensor_type = info.type.tensor_type
    if tensor_type.HasField("shape"):
        if len(tensor_type.shape.dim) != len(dims):
            return None
    else:
        tensor_type.shape.SetInParent()
        for _ in dims:
            tensor_type.shape.dim.add()
    changed, stable = False, values.model.stable
    for dim, entry in zip(tensor_type.shape.dim, dims):
        if dim.HasField("dim_value") or entry is None:
            continue
        if isinstance(entry, int) and entry >= 0:
            dim.Clear()
            dim.dim_value = entry
            changed = True
        elif isinstance(entry, str) and entry in stable and dim.dim_param not in stable:
            dim.Clear()
            dim.dim_param = entry
            changed = True
    return info if changed else None


# ---- the refinements ---------------------------------------------------------------------------------------------

Refinement = Callable[[onnx.NodeProto, "_Values"], "list[Entry] | None"]
"""The dims of a node's first output that the graph shows, from one round's inferred types (None: nothing)."""
_REFINEMENTS: dict[str, Refinement] = {}
"""op_type -> its refinement (ops of the ONNX domains); a node of another op is left to ONNX's inference."""


def _refines(op_type: str) -> Callable[[Refinement], Refinement]:
    def register(refinement: Refinement) -> Refinement:
        _REFINEMENTS[op_type] = refinement
        return refinement

    return register


@_refines("Slice")
def _slice_dims(node: onnx.NodeProto, values: _Values) -> list[Entry] | None:
    """A Slice with constant `axes`: the input's dims on the axes it does not touch, where they are sizes or the
    model's symbols (an annotation keeps a symbolic dim over the one ONNX infers, so a gained dim stays in later
    rounds)."""
    if len(node.input) < 4 or not node.input[3]:
        return None
    axes = values.constant_ints(node.input[3])
    data, stable = values.dims(node.input[0]), values.model.stable
    if axes is None or data is None:
        return None
    rank = len(data)
    if any(not -rank <= axis < rank for axis in axes):
        return None  # an invalid model; onnxruntime will say so
    sliced = {axis % rank for axis in axes}
    return [None if i in sliced or (isinstance(dim, str) and dim not in stable) else dim for i, dim in enumerate(data)]


@_refines("Reshape")
def _reshape_dims(node: onnx.NodeProto, values: _Values) -> list[Entry] | None:
    """The dims a Reshape gives, from its evaluated shape input (see the module doc)."""
    if len(node.input) < 2:
        return None
    target = values.elements(node.input[1])
    if target is None:
        return None
    data = values.dims(node.input[0])
    allow_zero = _int_attribute(node, "allowzero", 0) != 0
    dims: list[Entry] = []
    inferred_at = None
    for index, entry in enumerate(target):
        if entry == -1:
            if inferred_at is not None:
                return None
            inferred_at = index
            dims.append(None)
        elif entry == 0 and not allow_zero:
            dims.append(data[index] if data is not None and index < len(data) else None)
        elif isinstance(entry, int) and entry < 0:
            return None
        else:
            dims.append(entry)
    if inferred_at is not None and data is not None:
        others = [dim for index, dim in enumerate(dims) if index != inferred_at]
        dims[inferred_at] = _quotient(data, others)
    return dims


def _quotient(numerator: list[Entry], denominator: list[Entry]) -> Entry:
    """prod(numerator) / prod(denominator) where that is a size or one symbol (symbols cancel), else None."""
    if None in numerator or None in denominator:
        return None
    top = collections.Counter(entry for entry in numerator if isinstance(entry, str))
    bottom = collections.Counter(entry for entry in denominator if isinstance(entry, str))
    if bottom - top:
        return None
    size = int(np.prod([entry for entry in numerator if isinstance(entry, int)], dtype=np.int64))
    divisor = int(np.prod([entry for entry in denominator if isinstance(entry, int)], dtype=np.int64))
    if divisor == 0 or size % divisor:
        return None
    left = list((top - bottom).elements())
    quotient = size // divisor
    if not left:
        return quotient
    return left[0] if len(left) == 1 and quotient == 1 else None


def _loop_carried(model: _Model) -> dict[str, onnx.ValueInfoProto]:
    """Shapes of Loop bodies' carried inputs that hold in every iteration (see the module doc), by input name."""
    carried = []  # (initial value, body input, body output)
    for node in model.loops:
        body = next((attr.g for attr in node.attribute if attr.name == "body"), None)
        if body is None:
            continue
        for index, initial in enumerate(node.input[2:]):
            inputs, outputs = body.input, body.output
            if not initial or 2 + index >= len(inputs) or 1 + index >= len(outputs):
                continue
            if not inputs[2 + index].type.tensor_type.HasField("shape"):
                carried.append((initial, inputs[2 + index], outputs[1 + index].name))
    if not carried:
        return {}
    values = _Values(model, model.run({}, {}))
    assumed: dict[str, onnx.ValueInfoProto] = {}
    for initial, body_input, _ in carried:
        dims = values.dims(initial)
        if dims is None or not body_input.type.tensor_type.elem_type:
            continue
        info = onnx.ValueInfoProto()
        info.CopyFrom(body_input)
        shape = info.type.tensor_type.shape
        shape.SetInParent()
        for entry in dims:
            dim = shape.dim.add()
            if isinstance(entry, int):
                dim.dim_value = entry
            elif entry in model.stable:
                dim.dim_param = entry
        assumed[body_input.name] = info
    # Each round drops at least one dim or ends.
    for _ in range(sum(len(info.type.tensor_type.shape.dim) for info in assumed.values()) + 1):
        if not assumed:
            return {}
        values = _Values(model, model.run(assumed, {}))
        changed = False
        for _, body_input, body_output in carried:
            info = assumed.get(body_input.name)
            if info is None:
                continue
            output = values.dims(body_output)
            dims = info.type.tensor_type.shape.dim
            if output is None or len(output) != len(dims):
                del assumed[body_input.name]
                changed = True
                continue
            for dim, entry in zip(dims, output):
                known = dim.dim_value if dim.HasField("dim_value") else (dim.dim_param or None)
                if known is not None and known != entry:
                    dim.Clear()
                    changed = True
        if not changed:
            return assumed
    return {}


# ---- evaluating shape computations -------------------------------------------------------------------------------


class _Values:
    """One round's inferred types (every graph; names are apart), and the shape computations evaluated from them."""

    def __init__(self, model: _Model, inferred: onnx.ModelProto) -> None:
        self.model = model
        self.infos: dict[str, onnx.ValueInfoProto] = {}
        self._memo: dict[str, list[Entry] | None] = {}
        for graph in model.graphs(inferred):
            for info in (*graph.input, *graph.value_info, *graph.output):
                known = self.infos.get(info.name)
                if known is None or not known.type.tensor_type.HasField("shape"):
                    self.infos[info.name] = info

    def dims(self, name: str) -> list[Entry] | None:
        """The inferred dims of a value (sizes, symbols, None), or None when its rank is unknown."""
        info = self.infos.get(name)
        if info is None or not info.type.tensor_type.HasField("shape"):
            return None
        return [dim.dim_value if dim.HasField("dim_value") else (dim.dim_param or None)
                for dim in info.type.tensor_type.shape.dim]

    def constant_ints(self, name: str) -> list[int] | None:
        array = self.model.constant_ints(name)
        return [int(item) for item in array.reshape(-1)] if array is not None else None

    def elements(self, name: str, depth: int = 0) -> list[Entry] | None:
        """The elements of a small integer tensor computed from dims and constants (flattened), or None."""
        if name in self._memo:
            return self._memo[name]
        self._memo[name] = None  # a cycle (an invalid model) evaluates to nothing
        result = self._evaluate(name, depth) if depth < _MAX_DEPTH else None
        if result is not None and len(result) > _MAX_ELEMENTS:
            result = None
        self._memo[name] = result
        return result

    def _evaluate(self, name: str, depth: int) -> list[Entry] | None:
        constant = self.constant_ints(name)
        if constant is not None:
            return list(constant)
        node = self.model.producers.get(name)
        if node is None or node.domain not in ONNX_DOMAINS:
            return None
        evaluate = _EVALUATORS.get(node.op_type)
        if evaluate is None:
            return None
        operand = lambda index: (  # noqa: E731
            self.elements(node.input[index], depth + 1) if index < len(node.input) and node.input[index] else None
        )
        return evaluate(node, operand, self)


Operand = Callable[[int], "list[Entry] | None"]
"""The evaluated elements of a node's input by index (None: absent or not evaluated)."""
Evaluator = Callable[[onnx.NodeProto, Operand, _Values], "list[Entry] | None"]
"""The elements of a node's output from its operands and the inferred dims (None: not evaluated)."""
_EVALUATORS: dict[str, Evaluator] = {}
"""op_type -> its evaluator (ops of the ONNX domains); a value another op computes is not evaluated."""


def _evaluates(*op_types: str) -> Callable[[Evaluator], Evaluator]:
    def register(evaluator: Evaluator) -> Evaluator:
        _EVALUATORS.update(dict.fromkeys(op_types, evaluator))
        return evaluator

    return register


@_evaluates("Shape")
def _shape_of(node: onnx.NodeProto, operand: Operand, values: _Values) -> list[Entry] | None:
    dims = values.dims(node.input[0])
    if dims is None:
        return None
    rank = len(dims)
    start, end = _int_attribute(node, "start", 0), _int_attribute(node, "end", rank)
    start, end = (min(max(bound + rank if bound < 0 else bound, 0), rank) for bound in (start, end))
    return dims[start:end]


@_evaluates("Identity", "Unsqueeze", "Squeeze")
def _same_elements(node: onnx.NodeProto, operand: Operand, values: _Values) -> list[Entry] | None:
    return operand(0)


@_evaluates("Cast")
def _cast_to_integers(node: onnx.NodeProto, operand: Operand, values: _Values) -> list[Entry] | None:
    """A cast to int32 or int64 keeps the elements."""
    return operand(0) if _int_attribute(node, "to", 0) in (6, 7) else None


@_evaluates("Concat")
def _concatenated(node: onnx.NodeProto, operand: Operand, values: _Values) -> list[Entry] | None:
    if _int_attribute(node, "axis", 0) not in (0, -1):
        return None
    parts = [operand(index) if part else [] for index, part in enumerate(node.input)]
    return None if any(part is None for part in parts) else [entry for part in parts for entry in part]


@_evaluates("Gather")
def _gathered(node: onnx.NodeProto, operand: Operand, values: _Values) -> list[Entry] | None:
    if _int_attribute(node, "axis", 0) != 0:
        return None
    data, indices = operand(0), operand(1)
    if data is None or indices is None or not all(isinstance(index, int) for index in indices):
        return None
    if any(not -len(data) <= index < len(data) for index in indices):
        return None
    return [data[index] for index in indices]


@_evaluates("Slice")
def _sliced(node: onnx.NodeProto, operand: Operand, values: _Values) -> list[Entry] | None:
    data, starts, ends = operand(0), operand(1), operand(2)
    axes, steps = operand(3), operand(4)
    if data is None or starts is None or ends is None or len(starts) != 1 or len(ends) != 1:
        return None
    if axes not in (None, [0], [-1]) or steps not in (None, [1]):
        return None
    start, end = starts[0], ends[0]
    if not isinstance(start, int) or not isinstance(end, int):
        return None
    return data[slice(start, end)]


@_evaluates("Add", "Sub", "Mul", "Div")
def _elementwise(node: onnx.NodeProto, operand: Operand, values: _Values) -> list[Entry] | None:
    left, right = operand(0), operand(1)
    if left is None or right is None or not left or not right:
        return None
    if len(left) != len(right) and 1 not in (len(left), len(right)):
        return None
    size = max(len(left), len(right))
    left, right = (side * size if len(side) == 1 else side for side in (left, right))
    return [_arithmetic(node.op_type, a, b) for a, b in zip(left, right)]


def _arithmetic(op: str, a: Entry, b: Entry) -> Entry:
    if isinstance(a, int) and isinstance(b, int):
        if op == "Add":
            return a + b
        if op == "Sub":
            return a - b
        if op == "Mul":
            return a * b
        if b == 0:
            return None
        quotient = abs(a) // abs(b)  # integer Div truncates toward zero
        return quotient if (a >= 0) == (b > 0) else -quotient
    if op == "Mul" and 1 in (a, b):
        return b if a == 1 else a
    if op in ("Add", "Sub") and b == 0 or op == "Add" and a == 0:
        return b if a == 0 else a
    if op == "Div" and b == 1:
        return a
    return None


def _int_attribute(node: onnx.NodeProto, name: str, default: int) -> int:
    for attr in node.attribute:
        if attr.name == name and attr.type == onnx.AttributeProto.INT:
            return attr.i
    return default


def _small_ints(tensor: onnx.TensorProto) -> np.ndarray | None:
    if tensor.data_type not in (onnx.TensorProto.INT64, onnx.TensorProto.INT32) or tensor.data_location:
        return None
    if int(np.prod(tensor.dims, dtype=np.int64)) > _MAX_ELEMENTS:
        return None
    try:
        return numpy_helper.to_array(tensor)
    except Exception:  # noqa: BLE001 - a malformed tensor is no constant we can use
        return None


def _constant_node_ints(node: onnx.NodeProto) -> np.ndarray | None:
    for attr in node.attribute:
        if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
            return _small_ints(attr.t)
        if attr.name == "value_int":
            return np.array(attr.i, np.int64)
        if attr.name == "value_ints" and len(attr.ints) <= _MAX_ELEMENTS:
            return np.array(list(attr.ints), np.int64)
    return None
