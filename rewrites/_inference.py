"""Shape inference for the pass, without leaving its results in the model.

ONNX shape inference (symbolic dims) runs on the main graph and its subgraphs through onnx_ir's ShapeInferencePass
(which detaches large initializers first, so external weights are never loaded). Model-local function bodies get no
shapes from it, so each function is inferred on its own from the types at its call sites. The results go into a
:class:`TypeTable`; the model's own annotations are restored, and so are the value and node names that onnxscript's
rewriter renames on its way out.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import onnx
import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from ._facts import TypeTable, dim_key, same_dim

logger = logging.getLogger(__name__)


def graph_likes(model: ir.Model) -> Iterator[ir.Graph | ir.Function]:
    """The main graph, every model-local function and every subgraph (If/Loop/Scan bodies) inside any of them."""
    for top in (model.graph, *model.functions.values()):
        yield top
        yield from top.subgraphs()


def values_of(graph_like: ir.Graph | ir.Function) -> Iterator[ir.Value]:
    """Inputs, initializers and node outputs of one graph (not of its subgraphs)."""
    yield from graph_like.inputs
    if isinstance(graph_like, ir.Graph):
        yield from graph_like.initializers.values()
    for node in graph_like:
        yield from node.outputs


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


def infer_types(model: ir.Model) -> TypeTable:
    """Types and shapes of the values in ``model`` (main graph, subgraphs, functions); the model is left as it was."""
    annotations = Annotations(model)
    small_external = _small_external_initializers(model)
    try:
        # ONNX inference reads constant inputs (axes, shapes) only from in-memory data: give it the small external
        # ones (onnx_ir's pass detaches the larger initializers, so weights are not read).
        for value, tensor in small_external.items():
            value.const_value = ir.Tensor(tensor.numpy(), name=tensor.name)
        common_passes.ShapeInferencePass(check_type=False, strict_mode=False, data_prop=True)(model)
        inferred = {
            value: (value.dtype, value.shape)
            for graph in (model.graph, *model.graph.subgraphs())
            for value in values_of(graph)
        }
    finally:
        for value, tensor in small_external.items():
            value.const_value = tensor
        annotations.restore_types()
    return _infer_functions(model, TypeTable(inferred))


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


SMALL_TENSOR_BYTES = 1000  # onnx_ir's ShapeInferencePass detaches initializers above this size


def _small_external_initializers(model: ir.Model) -> dict[ir.Value, ir.TensorProtocol]:
    return {
        value: value.const_value
        for value in model.graph.initializers.values()
        if isinstance(value.const_value, ir.ExternalTensor) and value.const_value.nbytes <= SMALL_TENSOR_BYTES
    }


def call_sites(model: ir.Model, function: ir.Function) -> list[tuple[ir.Graph | ir.Function, ir.Node]]:
    """Nodes calling ``function``, each with the main graph or function it lies in (possibly inside a subgraph)."""
    identifier = function.identifier()
    return [
        (top, node)
        for top in (model.graph, *model.functions.values())
        for graph in (top, *top.subgraphs())
        for node in graph
        if node.op_identifier() == identifier
    ]


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
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, check_type=False, strict_mode=False, data_prop=True)
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
