"""Element types and shapes of a model's values, as ONNX shape inference finds them, without writing them into it.

ONNX shape inference (symbolic dims) runs on the main graph and its subgraphs, on a copy of the model without its
large initializers' data (onnx_ir's helper behind its ShapeInferencePass), so external weights are never loaded.
The copy's subgraph values are named apart first, and the dims ONNX leaves unknown that the graph shows (after a
`Slice` with computed bounds, a `Reshape` of a computed shape, in a `Loop` body's carried values) are put back and
inference runs again (:mod:`ort_rmsnorm.shape_refinement`). Model-local function bodies get no shapes from it, so
each function is inferred on its own from the types at its call sites. The results go into a :class:`TypeTable`;
the model keeps its own annotations.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Mapping

import onnx
import onnx_ir as ir

# The helper behind onnx_ir's ShapeInferencePass: the model as a proto without its large initializers' data.
from onnx_ir.passes.common import _c_api_utils

from .contract import ONNX_DOMAINS
from .model_graphs import call_sites, graph_likes, values_of
from .shape_refinement import infer_shapes, names_apart

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
    try:
        # ONNX inference reads constant inputs (axes, shapes) only from in-memory data: give it the small external
        # ones (the larger initializers are left out, so weights are not read).
        for value, tensor in small_external.items():
            value.const_value = ir.Tensor(tensor.numpy(), name=tensor.name)
        # Initializers that are also graph inputs are no constants (onnx_ir's helper makes every initializer an
        # input of the proto it infers).
        overridable = frozenset(value.name for value in model.graph.inputs if value.is_initializer() and value.name)
        stripped: list[onnx.ModelProto] = []
        renames: list[dict[str, str]] = []

        def infer(proto: onnx.ModelProto) -> onnx.ModelProto:
            renames.extend(names_apart(proto))
            stripped.append(proto)
            return infer_shapes(proto, overridable)

        inferred_proto = _c_api_utils.call_onnx_api(infer, model)
    except Exception as error:  # noqa: BLE001 - as onnx_ir's ShapeInferencePass: the model's own annotations stand
        logger.warning("shape inference failed: %s", error)
        inferred_proto = None
    finally:
        for value, tensor in small_external.items():
            value.const_value = tensor
    inferred_graphs = ir.serde.deserialize_model(inferred_proto).graphs() if inferred_proto is not None else ()
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


SMALL_TENSOR_BYTES = 1000  # onnx_ir's helper leaves initializers above this size out of the proto


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
    """Adds each function body's facts, inferred from its call sites' input types (callers first, so that calls
    nested in functions resolve too). A function whose callers disagree on an input type stays without facts."""
    pending = list(model.functions.values())
    while pending:
        ready = [
            function for function in pending if not any(owner in pending for owner, _ in call_sites(model, function))
        ] or pending[
            :1
        ]  # recursion cannot be inferred: take one as it is
        for function in ready:
            pending.remove(function)
            calls = [node for _, node in call_sites(model, function)]
            inputs = _merged_input_types(calls, table, len(function.inputs)) if calls else None
            if inputs is not None:
                table.learn(_infer_function_body(model, function, inputs))
    return table


def _infer_function_body(model: ir.Model, function: ir.Function, inputs) -> dict:
    """Runs ONNX shape inference on a throwaway model whose graph is the function body with typed inputs."""
    body = ir.serde.serialize_function(function)
    graph = onnx.helper.make_graph(
        list(body.node),
        f"{function.name}_body",
        [
            onnx.helper.make_tensor_value_info(
                value.name, int(dtype), None if shape is None else [dim_key(dim) for dim in shape.dims]
            )
            for value, (dtype, shape) in zip(function.inputs, inputs)
        ],
        [onnx.helper.make_empty_tensor_value_info(value.name) for value in function.outputs],
    )
    opsets = [onnx.helper.make_opsetid(domain, version) for domain, version in function.opset_imports.items()]
    others = [ir.serde.serialize_function(other) for other in model.functions.values() if other is not function]
    proto = onnx.helper.make_model(graph, opset_imports=opsets, functions=others, ir_version=model.ir_version)
    names_apart(proto)  # the body's own names stay as they are; those of its subgraphs get no facts here
    try:
        inferred = infer_shapes(proto)
    except Exception as error:  # noqa: BLE001 - the body stays without shapes; rules then say why they skip
        logger.info("shape inference of function %s failed: %s", function.name, error)
        return {}
    by_name = {info.name: info for info in (*inferred.graph.value_info, *inferred.graph.output)}
    facts = {}
    for node in function:
        for value in node.outputs:
            info = by_name.get(value.name)
            if info is not None and info.type.HasField("tensor_type"):
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
