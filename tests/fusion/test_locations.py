"""Norms inside If/Loop/Scan bodies (reading outer-scope values) and model-local functions are fused where they are,
with shapes inferred there (function bodies from their call sites), and the report says where."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import ort_rmsnorm
from fusion.norm_graphs import (
    GraphBuilder,
    Spelling,
    add_norm,
    assert_close_to_unfused,
    check_model,
    run_fused,
    run_unfused,
)
from op_models import make_model
from reference import random_array

D = 8
FLOAT = TensorProto.FLOAT


def _norm_body(prefix: str, x: str, spelling: Spelling = Spelling()) -> tuple[GraphBuilder, str]:
    """Nodes computing norm(x) * w with Constant nodes only (as bodies have them)."""
    g = GraphBuilder(18, prefix=prefix, constants="constant")
    y, _ = add_norm(g, x, spelling, np.dtype(np.float32))
    return g, g.op("Mul", y, g.constant(np.linspace(0.5, 1.5, D, dtype=np.float32)))


def _model(nodes, inputs, outputs, functions=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "main", inputs, outputs)
    opsets = [helper.make_opsetid("", 18)] + [helper.make_opsetid("local", 1)] * bool(functions)
    return make_model(graph, opsets, functions=list(functions))


def _value(name, dims, elem=FLOAT):
    return helper.make_tensor_value_info(name, elem, dims)


def if_model() -> onnx.ModelProto:
    """then: norm of the outer x; else: x."""
    body, y = _norm_body("then_", "x")
    then_branch = helper.make_graph(
        body.nodes + [helper.make_node("Identity", [y], ["then_y"])], "then", [], [_value("then_y", ["B", D])]
    )
    else_branch = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["else_y"])], "else", [], [_value("else_y", ["B", D])]
    )
    node = helper.make_node("If", ["cond"], ["y"], name="cond_if", then_branch=then_branch, else_branch=else_branch)
    return _model([node], [_value("cond", [], TensorProto.BOOL), _value("x", ["B", D])], [_value("y", ["B", D])])


def loop_model(nested_if: bool = False) -> onnx.ModelProto:
    """Two iterations of v = norm(v) * w (a loop-carried value); optionally the norm inside an If in the body."""
    body, y = _norm_body("body_", "v_in")
    nodes = body.nodes
    if nested_if:
        then_branch = helper.make_graph(
            nodes + [helper.make_node("Identity", [y], ["inner_y"])], "inner_then", [], [_value("inner_y", ["B", D])]
        )
        else_branch = helper.make_graph(
            [helper.make_node("Identity", ["v_in"], ["inner_else_y"])],
            "inner_else",
            [],
            [_value("inner_else_y", ["B", D])],
        )
        nodes = [
            helper.make_node(
                "If", ["cond_in"], ["branch_y"], name="inner", then_branch=then_branch, else_branch=else_branch
            )
        ]
        y = "branch_y"
    nodes = nodes + [
        helper.make_node("Identity", [y], ["v_out"]),
        helper.make_node("Identity", ["cond_in"], ["cond_out"]),
    ]
    body_graph = helper.make_graph(
        nodes,
        "body",
        [_value("i", [], TensorProto.INT64), _value("cond_in", [], TensorProto.BOOL), _value("v_in", ["B", D])],
        [_value("cond_out", [], TensorProto.BOOL), _value("v_out", ["B", D])],
    )
    loop = helper.make_node("Loop", ["trips", "", "x"], ["y"], name="loop", body=body_graph)
    trips = helper.make_node("Constant", [], ["trips"], value=helper.make_tensor("t", TensorProto.INT64, [], [2]))
    return _model([trips, loop], [_value("x", ["B", D])], [_value("y", ["B", D])])


def scan_model() -> onnx.ModelProto:
    """Scan over the first axis of x [S, B, D]: each slice [B, D] normalized."""
    body, y = _norm_body("scan_", "slice")
    body_graph = helper.make_graph(
        body.nodes + [helper.make_node("Identity", [y], ["slice_out"])],
        "scan_body",
        [_value("slice", ["B", D])],
        [_value("slice_out", ["B", D])],
    )
    scan = helper.make_node("Scan", ["x"], ["y"], name="scan", body=body_graph, num_scan_inputs=1)
    return _model([scan], [_value("x", ["S", "B", D])], [_value("y", ["S", "B", D])])


def function_model(second_shape=("B", D)) -> onnx.ModelProto:
    """A model-local function local::Norm called on two inputs (shapes from the call sites)."""
    body, y = _norm_body("f/", "fx")  # names with "/", as exporters write them
    function = helper.make_function(
        "local",
        "Norm",
        ["fx"],
        ["fy"],
        body.nodes + [helper.make_node("Identity", [y], ["fy"])],
        [helper.make_opsetid("", 18)],
    )
    calls = [
        helper.make_node("Norm", ["x1"], ["y1"], domain="local", name="call1"),
        helper.make_node("Norm", ["x2"], ["y2"], domain="local", name="call2"),
    ]
    return _model(
        calls,
        [_value("x1", ["B", D]), _value("x2", list(second_shape))],
        [_value("y1", ["B", D]), _value("y2", list(second_shape))],
        functions=[function],
    )


def _all_nodes(graph: onnx.GraphProto):
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _all_nodes(attr.g)


CASES = {
    "if-then-branch": (if_model, "If 'cond_if'.then_branch", {"cond": np.array(True)}, (3, D)),
    "if-else-taken": (if_model, "If 'cond_if'.then_branch", {"cond": np.array(False)}, (3, D)),
    "loop-body": (loop_model, "Loop 'loop'.body", {}, (3, D)),
    "if-in-loop-body": (lambda: loop_model(nested_if=True), "Loop 'loop'.body/If 'inner'.then_branch", {}, (3, D)),
    "scan-body": (scan_model, "Scan 'scan'.body", {}, (4, 3, D)),
}


@pytest.mark.parametrize("name", CASES)
def test_norm_in_subgraph(name, rng):
    build, location, extra_feeds, x_shape = CASES[name]
    model = build()
    fused, report = ort_rmsnorm.fuse(model)

    assert [fusion.location for fusion in report.fusions] == [location] and report.skipped == []
    ops = [node.op_type for node in _all_nodes(fused.graph)]
    assert ops.count("RMSNorm") == 1 and not {"ReduceMean", "Sqrt", "Reciprocal", "Pow"} & set(ops)
    assert report.fusions[0].scale == "tensor"
    check_model(fused)
    feeds = {"x": random_array(rng, x_shape, np.float32), **extra_feeds}
    for got, want in zip(run_fused(fused, feeds), run_unfused(model, feeds)):
        assert_close_to_unfused(got, want, name)
    again, second = ort_rmsnorm.fuse(fused)
    assert again == fused and second.fusions == []


@pytest.mark.parametrize("ir_version", [8, 10])
@pytest.mark.parametrize("second_shape", [("B", D), (4, D)], ids=["same-shapes", "merged-shapes"])
def test_norm_in_function(second_shape, ir_version, rng):
    model = function_model(second_shape)
    model.ir_version = ir_version
    fused, report = ort_rmsnorm.fuse(model)

    assert [fusion.location for fusion in report.fusions] == ["function 'local::Norm'"]
    (function,) = fused.functions
    assert [node.op_type for node in function.node] == ["Constant", "RMSNorm", "Identity"]
    assert {(o.domain, o.version) for o in function.opset_import} == {("", 18), ("ort_rmsnorm", 1)}
    assert [node.op_type for node in fused.graph.node] == ["Norm", "Norm"]  # the calls are as they were
    check_model(fused)
    feeds = {"x1": random_array(rng, (3, D), np.float32), "x2": random_array(rng, (4, D), np.float32)}
    for got, want in zip(run_fused(fused, feeds), run_unfused(model, feeds)):
        assert_close_to_unfused(got, want)
    # The fused output is annotated where IR 10 keeps a function's value_info; below it, onnx_ir would write it into
    # the main graph under a name it cannot read back (it has "/"), and a second run would change the model.
    fused_output = function.node[1].output[0]
    assert [info.name for info in function.value_info] == ([fused_output] if ir_version >= 10 else [])
    assert not [info.name for info in fused.graph.value_info if "::" in info.name]
    again, second = ort_rmsnorm.fuse(fused)
    assert again == fused and second.fusions == []


def test_function_without_call_sites_has_no_shapes():
    """Nothing calls the function: no types are known in its body, so nothing there is fused."""
    model = function_model()
    del model.graph.node[:]
    model.graph.node.append(helper.make_node("Identity", ["x1"], ["y1"]))
    model.graph.node.append(helper.make_node("Identity", ["x2"], ["y2"]))
    fused, report = ort_rmsnorm.fuse(model)
    assert report.fusions == [] and fused.functions == model.functions
    assert [entry.location for entry in report.skipped] == ["function 'local::Norm'"]
    assert report.skipped[0].reason.startswith("element types unknown")
