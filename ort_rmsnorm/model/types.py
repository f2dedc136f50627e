"""Element types and shapes of a model's values, as ONNX shape inference finds them, without writing them into it.

ONNX shape inference (symbolic dims) runs on the main graph and its subgraphs, on a copy of the model without its
large initializers' data (as onnx_ir's ShapeInferencePass does), so external weights are never loaded.
The copy's subgraph values are named apart first, and the dims ONNX leaves unknown that the graph shows (after a
`Slice` with computed bounds, a `Reshape` of a computed shape, in a `Loop` body's carried values) are put back and
inference runs again (:mod:`ort_rmsnorm.model.shapes`). Model-local function bodies get no shapes from it, so
each function is inferred on its own from the types at its call sites. The results go into a :class:`TypeTable`;
the model keeps its own annotations.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping

import onnx
import onnx_ir as ir

from ..contract import ONNX_DOMAINS
from .graphs import all_call_sites, graph_likes, values_of
from .shapes import infer_shapes, names_apart

logger = logging.getLogger(__name__)


class TypeTable:
    """Element types and shapes of values.

    Inferred facts are kept here rather than written into the model (the pass must not add value_info everywhere);
    where inference knows nothing, the model's own annotations count.
    """

    def __init__(self, inferred: Mapping[ir.Value, tuple[ir.DataType | None, ir.Shape | None]] | None = None) -> None:
        self._inferred = dict(inferred or {})
        self.symbolic: Callable[[], tuple[dict, str | None]] | None = None
        """Computes a second table of shapes, and why it is empty if so (see :meth:`symbolic_shape`)."""
        self._symbolic: tuple[dict, str | None] | None = None
        self._aliases: dict[ir.Value, ir.Value] = {}

    def learn(self, facts: Mapping[ir.Value, tuple[ir.DataType | None, ir.Shape | None]]) -> None:
        """Adds facts: those of a function body, or of the values the pass creates in place of others."""
        self._inferred.update(facts)

    def stands_for(self, new: ir.Value, old: ir.Value) -> None:
        """``new`` (made by the pass) replaces ``old``: it has old's facts in the second table too."""
        self._aliases[new] = self._aliases.get(old, old)

    def symbolic_shape(self, value: ir.Value) -> tuple[ir.Shape | None, str | None]:
        """The shape onnxruntime's symbolic shape inference gives the value (main graph only; computed on first use,
        from the model as it was before the pass), and why there is none when it could not run."""
        if self.symbolic is None:
            return None, None
        if self._symbolic is None:
            self._symbolic = self.symbolic()
        facts, why = self._symbolic
        return facts.get(self._aliases.get(value, value), (None, None))[1], why

    def _second_opinion(self, value: ir.Value) -> tuple[ir.DataType | None, ir.Shape | None]:
        """What symbolic shape inference knows of a value ONNX's inference knows nothing of: it also knows
        onnxruntime's contrib ops (SkipSimplifiedLayerNormalization, GroupQueryAttention, MatMulNBits, ...), past
        which ONNX's inference cannot see."""
        if self.symbolic is None:
            return None, None
        if self._symbolic is None:
            self._symbolic = self.symbolic()
        return self._symbolic[0].get(self._aliases.get(value, value), (None, None))

    def dtype(self, value: ir.Value) -> ir.DataType | None:
        if value.const_value is not None:
            return value.const_value.dtype
        cast_to = _cast_target(value)
        if cast_to is not None:  # whatever a (wrong) annotation says: some converters write such
            return cast_to
        inferred = self._inferred.get(value)
        if inferred is not None and inferred[0] is not None:
            return inferred[0]
        if value.dtype is not None:
            return value.dtype
        return self._second_opinion(value)[0]

    def shape(self, value: ir.Value) -> ir.Shape | None:
        if value.const_value is not None:
            return ir.Shape(value.const_value.shape)
        inferred = self._inferred.get(value)
        if inferred is not None and inferred[1] is not None:
            return inferred[1]
        if value.shape is None:
            tensor = constant_tensor(value)
            return ir.Shape(tensor.shape) if tensor is not None else self._second_opinion(value)[1]
        return value.shape


def _cast_target(value: ir.Value) -> ir.DataType | None:
    """The type a Cast node's output has by definition."""
    producer = value.producer()
    if producer is None or producer.op_type != "Cast" or producer.domain not in ONNX_DOMAINS:
        return None
    attr = producer.attributes.get("to")
    if attr is None or attr.type != ir.AttributeType.INT:
        return None
    try:
        return ir.DataType(attr.value)
    except ValueError:
        return None


# ---- dims and constants ------------------------------------------------------------------------------------------


def dim_key(dim) -> int | str | None:
    """A static size, a symbol name, or None when nothing is known."""
    if isinstance(dim, int):
        return dim
    value = getattr(dim, "value", None)
    return value if isinstance(value, (int, str)) else None


def same_dim(a, b) -> bool:
    """True when two dims are known to be equal (same size, or the same symbol)."""
    key = dim_key(a)
    return key is not None and key == dim_key(b)


def constant_tensor(value: ir.Value | None) -> ir.TensorProtocol | None:
    """The tensor of an initializer (not overridable as a graph input) or of a Constant node's output."""
    if value is None or value.is_graph_input():
        return None
    try:
        return ir.convenience.get_const_tensor(value)
    except ValueError:  # a malformed Constant node: not a constant we can trust
        return None


# ---- inference -------------------------------------------------------------------------------------------------


def infer_types(model: ir.Model) -> TypeTable:
    """Types and shapes of the values in ``model`` (main graph, subgraphs, functions); the model is left as it was."""
    small_external = _small_external_initializers(model)
    # Bound before anything can fail: every path below reads them.
    stripped: list[onnx.ModelProto] = []
    renames: list[dict[str, str]] = []
    inferred_proto: onnx.ModelProto | None = None
    try:
        # ONNX inference reads constant inputs (axes, shapes) only from in-memory data: give it the small external
        # ones (the larger initializers are left out, so weights are not read).
        for value, tensor in small_external.items():
            value.const_value = ir.Tensor(tensor.numpy(), name=tensor.name)
        # Initializers that are also graph inputs are no constants (the proto inferred makes every initializer an
        # input: _call_without_large_initializers).
        overridable = frozenset(value.name for value in model.graph.inputs if value.is_initializer() and value.name)

        def infer(proto: onnx.ModelProto) -> onnx.ModelProto:
            renames.extend(names_apart(proto))
            stripped.append(proto)
            return infer_shapes(proto, overridable)

        inferred_proto = _call_without_large_initializers(infer, model)
    except Exception as error:  # noqa: BLE001 - as onnx_ir's ShapeInferencePass: the model's own annotations stand
        logger.warning("shape inference failed: %s", error)
        inferred_proto = None
    finally:
        for value, tensor in small_external.items():
            value.const_value = tensor
    inferred_graphs = ()
    if inferred_proto is not None:
        try:
            inferred_graphs = ir.serde.deserialize_model(inferred_proto).graphs()
        except Exception as error:  # noqa: BLE001 - as a failed inference: the model's own annotations stand
            logger.warning("shape inference gave a model onnx_ir cannot read: %s", error)
    found: dict[ir.Value, tuple[ir.DataType | None, ir.Shape | None]] = {}
    for graph, inferred_graph, renamed in itertools.zip_longest(model.graphs(), inferred_graphs, renames):
        by_name = (
            ir.convenience.create_value_mapping(inferred_graph, include_subgraphs=False)
            if inferred_graph is not None
            else {}
        )
        renamed = renamed or {}
        for value in values_of(graph):
            other = by_name.get(renamed.get(value.name, value.name))
            dtype = other.dtype if other is not None and other.dtype is not None else value.dtype
            shape = other.shape if other is not None and other.shape is not None else value.shape
            found[value] = (dtype, shape)
    table = TypeTable(found)
    if stripped:
        names = {value.name: value for value in values_of(model.graph) if value.name}
        table.symbolic = lambda: _symbolic_shapes(stripped[0], names)
    return _infer_functions(model, table)


def _call_without_large_initializers(call: Callable[[onnx.ModelProto], onnx.ModelProto], model: ir.Model
                                     ) -> onnx.ModelProto:
    """``call`` on the model as a proto whose initializers of more than SMALL_TENSOR_BYTES are typed graph inputs
    without data (so that weights are neither read nor copied), the model left as it was, its initializers in their
    order. What onnx_ir's ShapeInferencePass does (``_c_api_utils.call_onnx_api``), whose test of each initializer
    against the list of graph inputs made it quadratic in the number of initializers (30,000 took minutes)."""
    graph = model.graph
    values = tuple(graph.initializers.values())
    tensors = [value.const_value for value in values]
    inputs = len(graph.inputs)
    detached = False
    try:
        for value, tensor in zip(values, tensors):
            if tensor is not None:
                value.shape = value.shape if value.shape is not None else ir.Shape(tensor.shape)
                value.dtype = value.dtype if value.dtype is not None else tensor.dtype
            if not value.is_graph_input():
                graph.inputs.append(value)
            if tensor is None or tensor.nbytes > SMALL_TENSOR_BYTES:
                value.const_value = None
                graph.initializers.pop(value.name)
                detached = True
        proto = ir.serde.serialize_model(model)
    finally:
        for value, tensor in zip(values, tensors):
            value.const_value = tensor
        while len(graph.inputs) > inputs:
            graph.inputs.pop()
        if detached:
            graph.initializers.clear()
            for value in values:
                graph.initializers.add(value)
    return call(proto)


# onnxruntime's symbolic shape inference saves a model it could not complete under this name, in the working directory,
# before it raises; the data file is onnx's default name for the model's external data.
SYMBOLIC_LEFTOVERS = ("sym_shape_infer_temp.onnx", "sym_shape_infer_temp.onnx.data")
_symbolic_leftovers_lock = threading.Lock()


@contextlib.contextmanager
def symbolic_leftovers_removed() -> Iterator[None]:
    """Runs onnxruntime's symbolic shape inference within it: the files it leaves in the working directory are removed
    (those that were there before are not touched). One such run at a time, so that a file is one run's."""
    with _symbolic_leftovers_lock:
        before = {name for name in SYMBOLIC_LEFTOVERS if os.path.lexists(name)}
        try:
            yield
        finally:
            for name in SYMBOLIC_LEFTOVERS:
                if name not in before:
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(name)


def _symbolic_shapes(proto: onnx.ModelProto, values: Mapping[str, ir.Value]) -> tuple[dict, str | None]:
    """The main graph's types and shapes as onnxruntime's symbolic shape inference finds them (it follows dims through
    Shape, Gather, Concat and Reshape arithmetic, where ONNX's invents new symbols, and knows onnxruntime's contrib
    ops), and why there are none if so."""
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
    except ImportError as error:
        return {}, f"onnxruntime's symbolic shape inference is not available ({error}; pip install sympy)"
    try:
        # auto_merge=False: two different symbols are never assumed equal.
        with symbolic_leftovers_removed():
            inferred = SymbolicShapeInference.infer_shapes(proto, auto_merge=False, guess_output_rank=False)
    except Exception as error:  # noqa: BLE001 - any failure there leaves only ONNX's shapes
        return {}, f"onnxruntime's symbolic shape inference failed on this model ({error})"
    shapes = {}
    for info in (*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input):
        value = values.get(info.name)
        if value is not None and info.type.HasField("tensor_type"):
            shapes[value] = _type_and_shape(info.type.tensor_type)
    return shapes, None


def computed_dtypes(model: ir.Model) -> set[ir.DataType]:
    """The element types of the values the model's nodes compute, in every graph and function (as
    :func:`infer_types` finds them): what its arithmetic rounds to. Constant nodes are left out (their values are
    given, not computed), and so are inputs and initializers."""
    types = infer_types(model)
    return {
        dtype
        for graph in graph_likes(model)
        for node in graph
        if node.op_type != "Constant"
        for value in node.outputs
        if (dtype := types.dtype(value)) is not None
    }


SMALL_TENSOR_BYTES = 1000  # shape inference gets initializers above this size without data (as onnx_ir's pass)


def _small_external_initializers(model: ir.Model) -> dict[ir.Value, ir.TensorProtocol]:
    return {
        value: value.const_value
        for value in model.graph.initializers.values()
        if isinstance(value.const_value, ir.ExternalTensor) and value.const_value.nbytes <= SMALL_TENSOR_BYTES
    }


def _merged_input_types(
    calls: list[ir.Node], table: TypeTable, arity: int
) -> list[tuple[ir.DataType, ir.Shape | None]] | None:
    """Per function input, the type all call sites agree on and the shape they share (dims that differ: unknown)."""
    merged = []
    for index in range(arity):
        args = [call.inputs[index] if index < len(call.inputs) else None for call in calls]
        if any(arg is None for arg in args):
            return None
        dtypes = {table.dtype(arg) for arg in args}
        if len(dtypes) != 1 or None in dtypes:
            return None
        shapes = [table.shape(arg) for arg in args]
        shape = shapes[0]
        if any(other is None or shape is None or other.rank() != shape.rank() for other in shapes):
            shape = None
        else:
            dims = [
                dim if all(same_dim(dim, other.dims[i]) for other in shapes) else None
                for i, dim in enumerate(shape.dims)
            ]
            shape = ir.Shape(dims)
        merged.append((dtypes.pop(), shape))
    return merged


def _infer_functions(model: ir.Model, table: TypeTable) -> TypeTable:
    """Adds each function body's facts, inferred from its call sites' input types. A function whose callers disagree
    on an input type stays without facts.

    Each body is inferred on its own, without the other functions: a call it makes to another function gets that
    function's output types as annotations, once they are known. Bodies are taken callers first (their facts type
    the calls they make), and a body is inferred again when the input types its callees get, or the output types of
    a function it calls, change; so a chain of functions calling the next costs two inferences per function. (Handing
    ONNX every other function instead made each body's inference walk all the functions it reaches: cubic in a chain
    of a few hundred functions.)"""
    functions = list(model.functions.values())
    if not functions:
        return table
    sites = all_call_sites(model)
    callers = {function: {top for top, _ in sites.get(function, []) if isinstance(top, ir.Function)}
               for function in functions}
    callees: dict[ir.Function, set[ir.Function]] = {function: set() for function in functions}
    calls_in: dict[ir.Function, list] = {function: [] for function in functions}  # (callee, call) in the body itself
    for callee, found in sites.items():
        for top, node in found:
            if isinstance(top, ir.Function):
                callees[top].add(callee)
                if node.graph is top.graph:
                    calls_in[top].append((callee, node))

    inputs_used: dict[ir.Function, object] = {}
    outputs: dict[ir.Function, list[tuple[ir.DataType | None, ir.Shape | None]]] = {}
    rounds: dict[ir.Function, int] = dict.fromkeys(functions, 0)
    queue = collections.deque(_callers_first(functions, callers))
    queued = set(queue)
    while queue:
        function = queue.popleft()
        queued.discard(function)
        # Types only gain facts from round to round; the bound stops a recursion whose types go back and forth.
        if rounds[function] > len(callees[function]) + 2:
            continue
        rounds[function] += 1
        calls = [node for _, node in sites.get(function, [])]
        inputs = _merged_input_types(calls, table, len(function.inputs)) if calls else None
        if inputs is None:
            continue
        inputs_used[function] = _facts_key(inputs)
        known = {}
        for callee, node in calls_in[function]:
            for value, fact in zip(node.outputs, outputs.get(callee, ())):
                if value.name and fact[0] is not None:
                    known[value.name] = fact
        facts = _infer_function_body(model, function, inputs, known)
        table.learn(facts)
        found_outputs = [facts.get(value, (None, None)) for value in function.outputs]
        wake = []
        if _facts_key(found_outputs) != _facts_key(outputs.get(function, [(None, None)] * len(function.outputs))):
            wake += callers[function]
        outputs[function] = found_outputs
        for callee in callees[function]:
            callee_calls = [node for _, node in sites.get(callee, [])]
            merged = _merged_input_types(callee_calls, table, len(callee.inputs))
            if merged is not None and _facts_key(merged) != inputs_used.get(callee):
                wake.append(callee)
        for other in wake:
            if other not in queued:
                queue.append(other)
                queued.add(other)
    return table


def _callers_first(functions: list[ir.Function], callers: Mapping[ir.Function, set[ir.Function]]
                   ) -> list[ir.Function]:
    """The functions, each after the functions that call it (Kahn's order; those in a recursion, in model order)."""
    waiting = {function: len(callers[function] - {function}) for function in functions}
    called_by: dict[ir.Function, list[ir.Function]] = {function: [] for function in functions}
    for function in functions:
        for caller in callers[function] - {function}:
            called_by[caller].append(function)
    ready = collections.deque(function for function in functions if waiting[function] == 0)
    order, placed = [], set()
    while len(order) < len(functions):
        if not ready:  # a recursion: take the first function left as it is
            ready.append(next(function for function in functions if function not in placed))
        function = ready.popleft()
        if function in placed:
            continue
        order.append(function)
        placed.add(function)
        for callee in called_by[function]:
            waiting[callee] -= 1
            if waiting[callee] == 0 and callee not in placed:
                ready.append(callee)
    return order


def _facts_key(facts) -> tuple:
    """Types and shapes as a comparable key (dims by size or symbol)."""
    return tuple(
        (dtype, None if shape is None else tuple(dim_key(dim) for dim in shape.dims)) for dtype, shape in facts
    )


def _infer_function_body(model: ir.Model, function: ir.Function, inputs, calls: Mapping[str, tuple]) -> dict:
    """Runs ONNX shape inference on a throwaway model whose graph is the function body with typed inputs, and the
    outputs of the calls it makes to other functions annotated with ``calls`` (name -> (type, shape))."""
    body = ir.serde.serialize_function(function)

    def info(name: str, dtype, shape) -> onnx.ValueInfoProto:
        return onnx.helper.make_tensor_value_info(
            name, int(dtype), None if shape is None else [dim_key(dim) for dim in shape.dims]
        )

    graph = onnx.helper.make_graph(
        list(body.node),
        f"{function.name}_body",
        [info(value.name, dtype, shape) for value, (dtype, shape) in zip(function.inputs, inputs)],
        [onnx.helper.make_empty_tensor_value_info(value.name) for value in function.outputs],
        value_info=[info(name, dtype, shape) for name, (dtype, shape) in calls.items()],
    )
    opsets = [onnx.helper.make_opsetid(domain, version) for domain, version in function.opset_imports.items()]
    proto = onnx.helper.make_model(graph, opset_imports=opsets, ir_version=model.ir_version)
    names_apart(proto)  # the body's own names stay as they are; those of its subgraphs get no facts here
    try:
        inferred = infer_shapes(proto)
    except Exception as error:  # noqa: BLE001 - the body stays without shapes; rules then say why they skip
        logger.info("shape inference of function %s failed: %s", function.name, error)
        return {}
    # A graph output keeps its empty annotation where ONNX knows nothing of its producer (a call): the annotation
    # given for the call's output counts then.
    by_name = {info.name: info for info in (*inferred.graph.output, *inferred.graph.value_info)
               if info.type.HasField("tensor_type") and info.type.tensor_type.elem_type}
    facts = {}
    for node in function:
        for value in node.outputs:
            info = by_name.get(value.name)
            if info is not None:
                facts[value] = _type_and_shape(info.type.tensor_type)
    for value, (dtype, shape) in zip(function.inputs, inputs):
        facts[value] = (dtype, shape)
    return facts


def _type_and_shape(tensor_type) -> tuple[ir.DataType | None, ir.Shape | None]:
    dtype = ir.DataType(tensor_type.elem_type) if tensor_type.elem_type else None
    if not tensor_type.HasField("shape"):
        return dtype, None
    dims = [dim.dim_value if dim.HasField("dim_value") else (dim.dim_param or None) for dim in tensor_type.shape.dim]
    return dtype, ir.Shape(dims)
