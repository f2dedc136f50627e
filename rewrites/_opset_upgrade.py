"""The ``onnx`` target's opset upgrade: onnx's version converter, with the ops it has no schema for set aside.

onnx's converter fails on a default-domain node whose op ONNX does not define (``Op 'SimplifiedLayerNormalization'
has no registered schema``): onnxruntime registers ``SimplifiedLayerNormalization`` in the default domain, and
onnxruntime-genai's model builder and onnxruntime's transformer optimizer write it in every model. Nodes of other
domains (``com.microsoft``'s ``SkipSimplifiedLayerNormalization``, ``MatMulNBits``, ``GroupQueryAttention``, ...) it
passes through as they are. So the default-domain nodes without an ONNX schema at the model's opset are moved into a
private domain while the converter runs, and put back unchanged afterwards: onnxruntime defines its default-domain
ops from version 1 on, so they mean the same at the new opset. The rules then convert the norm ops among them to the
target's op where that is exact, and report the others with their reason, per node.
"""

from __future__ import annotations

import collections

import onnx
import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from ort_rmsnorm.contract import ONNX_DOMAINS, OP_DOMAIN
from ort_rmsnorm.model.graphs import values_of, walk

from ._emit import default_opset
from ._facts import label

# A node set aside is in one of these while the converter runs (one per spelling of the default domain, so that each
# node gets its own spelling back).
_ASIDE = {domain: f"{OP_DOMAIN}.set_aside{'.' if domain else ''}{domain}" for domain in ONNX_DOMAINS}
_BACK = {aside: domain for domain, aside in _ASIDE.items()}


def upgrade_default_opset(model: ir.Model, version: int) -> list[str]:
    """Converts ``model`` (in place) to default-opset ``version`` with onnx's version converter; returns the notes
    for the report (what was converted, what was set aside).

    The converter works on a ModelProto; the main graph's initializers are detached while it runs (passed as typed
    graph inputs) and re-attached afterwards, so external or large weights are never loaded or copied. Default-domain
    nodes it has no schema for are set aside meanwhile (see the module doc). It drops model-local functions
    (onnx 1.23), so a model that has any is refused.
    """
    if model.functions:
        names = ", ".join(f"{function.domain}::{function.name}" for function in model.functions.values())
        raise ValueError(
            f"onnx's version converter cannot convert a model with model-local functions ({names}): it drops them; "
            f"convert the model to opset {version} yourself first"
        )
    current = default_opset(model.graph, model)
    aside = _without_schema(model, current)
    annotated = [{value.name for value in values_of(graph) if value.type is not None} for graph in model.graphs()]
    graph = model.graph
    weights = dict(graph.initializers)
    also_inputs = {name for name, value in weights.items() if value.is_graph_input()}
    for name, value in weights.items():
        tensor = value.const_value
        if tensor is not None:
            value.dtype = value.dtype or tensor.dtype
            value.shape = value.shape or ir.Shape(tensor.shape)
        graph.initializers.pop(name)
        if name not in also_inputs:
            graph.inputs.append(value)
    for node in aside:
        node.domain = _ASIDE[node.domain]
    imports = dict(model.opset_imports)
    model.opset_imports.update({domain: 1 for domain in _BACK})
    try:
        proto = ir.serde.serialize_model(model)
    finally:
        for node in aside:
            node.domain = _BACK[node.domain]
        model.opset_imports.clear()
        model.opset_imports.update(imports)
        for name, value in weights.items():
            if name not in also_inputs:
                graph.inputs.remove(value)
            graph.register_initializer(value)
    try:
        converted = ir.serde.deserialize_model(onnx.version_converter.convert_version(proto, version))
    except Exception as error:
        raise ValueError(f"onnx's version converter could not convert the model to opset {version}: {error}") from error
    for _, node in walk(converted):
        if node.domain in _BACK:
            node.domain = _BACK[node.domain]
    # The converter runs ONNX's shape inference and stores what it found (symbols it invents, unk__N, included): the
    # model keeps only its own annotations.
    for graph, names in zip(converted.graphs(), annotated):
        for node in graph:
            for value in node.outputs:
                if value.name not in names:
                    value.type, value.shape = None, None
    for domain in _BACK:
        converted.opset_imports.pop(domain, None)
    # The converter names the values it adds (_v_N) per graph, so that a subgraph may repeat a name of its parent,
    # which breaks single assignment (onnx 1.23): make the names unique again (graph inputs and outputs keep theirs).
    common_passes.NameFixPass()(converted)
    placeholders = {value.name: value for value in converted.graph.inputs}
    for name, value in weights.items():
        placeholder = placeholders[name]
        if name not in also_inputs:
            converted.graph.inputs.remove(placeholder)
        placeholder.const_value = value.const_value
        converted.graph.register_initializer(placeholder)
    model.graph = converted.graph  # with its opset imports
    minimum = onnx.helper.find_min_ir_version_for([onnx.helper.make_opsetid("", version)])
    model.ir_version = max(model.ir_version or 0, minimum)
    notes = [f"default opset upgraded from {current} to {version} with onnx.version_converter"]
    if aside:
        counts = collections.Counter(node.op_type for node in aside)
        ops = ", ".join(f"{count} x {op_type}" for op_type, count in counts.items())
        names = ", ".join(label(node) for node in aside[:8]) + (", ..." if len(aside) > 8 else "")
        notes.append(
            f"onnx's version converter has no schema for {ops} (default-domain ops of onnxruntime, which defines them "
            f"at every opset): set aside while it converted the model, then restored unchanged ({names})"
        )
    return notes


def _without_schema(model: ir.Model, opset: int) -> list[ir.Node]:
    """The default-domain nodes (main graph and subgraphs) whose op has no ONNX schema at ``opset``."""
    return [
        node
        for _, node in walk(model)
        if node.domain in ONNX_DOMAINS and not onnx.defs.has(node.op_type, opset, "")
    ]
