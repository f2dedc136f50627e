"""Shapes ONNX's inference gets wrong or leaves unknown, and the graph shows: the branches of an ``If`` that use one
name for different values (optimum's merged decoder), a ``Loop`` body's carried values, and a ``Reshape`` whose
shape is computed (a ``-1`` with a symbolic batch, a ``Div`` of dims). With the shapes taken from the outer graph and
the shape computation, every target fuses there what the ``custom`` target fuses, residual adds included, and a norm
whose count the true shape disproves stays unfused."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import ort_rmsnorm
from fusion.norm_graphs import GraphBuilder, Spelling, add_norm, assert_close_to_unfused, run_fused, run_unfused
from op_models import make_model, skip_unless_runtime_runs
from reference import random_array

D = 8
FLOAT = TensorProto.FLOAT
SKIP_OPS = {"custom": "SkipRMSNorm", "ort": "SkipSimplifiedLayerNormalization"}
NORM_OPS = {"custom": "RMSNorm", "ort": "SimplifiedLayerNormalization", "onnx": "RMSNormalization"}


def _value(name, dims, elem=FLOAT):
    return helper.make_tensor_value_info(name, elem, dims)


def _ints(g: GraphBuilder, *values: int) -> str:
    return g.constant(np.array(values, np.int64), "constant")


def _scaled_norm(g: GraphBuilder, x: str, hidden: int, spelling: Spelling = Spelling(epsilon=1e-2)) -> str:
    y, _ = add_norm(g, x, spelling, np.dtype(np.float32))
    return g.op("Mul", y, g.constant(np.linspace(0.5, 1.5, hidden, dtype=np.float32), "constant"))


def _all_nodes(graph: onnx.GraphProto):
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _all_nodes(attr.g)


def _ops(model: onnx.ModelProto) -> list[str]:
    return [node.op_type for node in _all_nodes(model.graph)]


def _fuse(model: onnx.ModelProto, target: str):
    return ort_rmsnorm.fuse(model, target, allow_opset_upgrade=target == "onnx")


def _check_numbers(model, fused, target, feed_sets):
    skip_unless_runtime_runs(target)
    run = run_fused if target == "custom" else run_unfused  # the other targets need no library
    for feeds in feed_sets:
        for got, want in zip(run(fused, feeds), run_unfused(model, feeds)):
            assert_close_to_unfused(got, want, str({name: value.shape for name, value in feeds.items()}))


# ---- If branches that use one name for different values -----------------------------------------------------------


def merged_decoder_like(spelling: Spelling = Spelling(epsilon=1e-2), residual: bool = True) -> onnx.ModelProto:
    """``If(use_cache)``: both branches, like the two exports optimum merges, name their values alike; the then-branch
    reshapes ``a`` [B, S, 8] to [B, S, 2, 4] through a value ``layer/target``, the else-branch computes its own
    ``layer/target`` (= [B, S, 8]) and then ``norm(layer/y + b) * w`` (``norm(layer/y) * w`` without ``residual``).
    ONNX's data propagation keeps computed values by name across subgraphs, so it gives the else-branch's
    ``layer/y`` the then-branch's [B, S, 2, 4]."""

    def branch(tail: list[int]) -> list[onnx.NodeProto]:
        return [
            helper.make_node("Shape", ["a"], ["layer/batch_sequence"], name="layer/shape", end=2),
            helper.make_node("Constant", [], ["layer/tail"], name="layer/tail",
                             value=onnx.numpy_helper.from_array(np.array(tail, np.int64))),
            helper.make_node("Concat", ["layer/batch_sequence", "layer/tail"], ["layer/target"], name="layer/concat",
                             axis=0),
            helper.make_node("Reshape", ["a", "layer/target"], ["layer/y"], name="layer/reshape"),
        ]

    then_nodes = branch([2, 4])
    then_nodes.append(helper.make_node("Reshape", ["layer/y", "layer/batch_sequence_hidden"], ["then_out"],
                                       name="layer/back"))
    then_nodes.insert(0, helper.make_node("Shape", ["a"], ["layer/batch_sequence_hidden"], name="layer/shape_all"))
    else_nodes = branch([D])
    g = GraphBuilder(18, prefix="else/", constants="constant")
    total = g.op("Add", "layer/y", "b") if residual else "layer/y"
    y = _scaled_norm(g, total, D, spelling)
    else_nodes += g.nodes + [helper.make_node("Identity", [y], ["else_out"], name="else/out")]
    then_branch = helper.make_graph(then_nodes, "with_past", [], [_value("then_out", None)])
    else_branch = helper.make_graph(else_nodes, "no_past", [], [_value("else_out", None)])
    node = helper.make_node("If", ["use_cache"], ["out"], name="optimum::if", then_branch=then_branch,
                            else_branch=else_branch)
    inputs = [_value("use_cache", [], TensorProto.BOOL), _value("a", ["B", "S", D]), _value("b", ["B", "S", D])]
    return make_model(helper.make_graph([node], "merged", inputs, [_value("out", None)]),
                      [helper.make_opsetid("", 18)])


@pytest.mark.parametrize("target", ["custom", "ort", "onnx"])
def test_branches_that_reuse_names_get_their_own_shapes(target, rng):
    model = merged_decoder_like()
    fused, report = _fuse(model, target)
    (fusion,) = report.fusions
    assert fusion.location == "If 'optimum::if'.else_branch" and report.skipped == [], report.summary()
    assert (fusion.scale, fusion.skip) == ("tensor", target in SKIP_OPS)
    assert _ops(fused).count(SKIP_OPS.get(target, NORM_OPS[target])) == 1
    feeds = [{"use_cache": np.array(cond), "a": random_array(rng, (2, 3, D), np.float32),
              "b": random_array(rng, (2, 3, D), np.float32)} for cond in (False, True)]
    _check_numbers(model, fused, target, feeds)


@pytest.mark.parametrize("residual", [True, False])
def test_a_sum_divided_by_the_wrong_count_in_a_branch_stays(residual):
    """The else-branch divides the sum of squares over its 8 elements by 4: no mean. With the then-branch's
    [B, S, 2, 4] (ONNX's shape for it, names not apart) it looks like one, and without the residual Add, whose
    inference fails on that shape, it was fused."""
    model = merged_decoder_like(Spelling(epsilon=1e-2, mean="sum_div", divisor=4), residual=residual)
    fused, report = ort_rmsnorm.fuse(model)
    assert report.fusions == [] and "RMSNorm" not in _ops(fused)
    assert any("is not a mean over the 8 reduced elements" in entry.reason for entry in report.skipped)


# ---- Loop-carried values --------------------------------------------------------------------------------------------


def loop_model(grow_axis: int | None = None, spelling: Spelling = Spelling(epsilon=1e-2)) -> onnx.ModelProto:
    """Two iterations over ``v``, carried, starting from ``x`` [B, 8]; the body's carried input and output declare no
    shape. Without ``grow_axis``: ``v = norm(v + x) * w`` (a residual add inside the body). With it: ``v =
    Concat(norm(v) (* w), x)`` along that axis, so that dim differs from one iteration to the next."""
    g = GraphBuilder(18, prefix="body/", constants="constant")
    source = g.op("Add", "v_in", "x") if grow_axis is None else "v_in"
    if spelling.scale == "none":
        y, _ = add_norm(g, source, spelling, np.dtype(np.float32))
    else:
        y = _scaled_norm(g, source, D, spelling)
    if grow_axis is not None:
        y = g.op("Concat", y, "x", axis=grow_axis)
    nodes = g.nodes + [
        helper.make_node("Identity", [y], ["v_out"], name="body/v_out"),
        helper.make_node("Identity", ["cond_in"], ["cond_out"], name="body/cond"),
    ]
    body = helper.make_graph(
        nodes, "body",
        [_value("i", [], TensorProto.INT64), _value("cond_in", [], TensorProto.BOOL), _value("v_in", None)],
        [_value("cond_out", [], TensorProto.BOOL), _value("v_out", None)],
    )
    trips = helper.make_node("Constant", [], ["trips"], value=helper.make_tensor("t", TensorProto.INT64, [], [2]))
    loop = helper.make_node("Loop", ["trips", "", "x"], ["y"], name="loop", body=body)
    return make_model(helper.make_graph([trips, loop], "main", [_value("x", ["B", D])], [_value("y", None)]),
                      [helper.make_opsetid("", 18)])


@pytest.mark.parametrize("target", ["custom", "ort", "onnx"])
def test_loop_carried_value_keeps_the_initial_shape(target, rng):
    model = loop_model()
    fused, report = _fuse(model, target)
    (fusion,) = report.fusions
    assert fusion.location == "Loop 'loop'.body" and report.skipped == [], report.summary()
    assert (fusion.scale, fusion.skip) == ("tensor", target in SKIP_OPS)
    _check_numbers(model, fused, target, [{"x": random_array(rng, (3, D), np.float32)}])


def test_loop_carried_dims_that_change_are_not_assumed(rng):
    """v grows along the batch axis: its last dim stays 8, so the norm and its scale fuse."""
    model = loop_model(grow_axis=0)
    fused, report = ort_rmsnorm.fuse(model)
    (fusion,) = report.fusions
    assert (fusion.location, fusion.scale) == ("Loop 'loop'.body", "tensor") and not report.skipped, report.summary()
    _check_numbers(model, fused, "custom", [{"x": random_array(rng, (3, D), np.float32)}])


def test_loop_carried_normalized_dim_that_changes_stays_unknown():
    """v grows along the normalized axis (8, then 16): a sum divided by 8 is a mean in the first iteration only."""
    model = loop_model(grow_axis=-1, spelling=Spelling(epsilon=1e-2, mean="sum_div", divisor=8, scale="none"))
    fused, report = ort_rmsnorm.fuse(model)
    assert report.fusions == [] and "RMSNorm" not in _ops(fused)
    assert any("are not static" in entry.reason for entry in report.skipped), report.summary()


# ---- Reshape of a computed shape ------------------------------------------------------------------------------------


def flattened_model() -> onnx.ModelProto:
    """``x`` [B, 4, 8] reshaped to ``Concat(Shape(x)[:1], [-1])`` = [B, 32] (ONNX: [B, unk]), added to ``r`` [B, 32]
    and normalized with a scale of 32."""
    g = GraphBuilder(18)
    target = g.op("Concat", g.op("Shape", "x", end=1), _ints(g, -1), axis=0)
    total = g.op("Add", g.op("Reshape", "x", target), "r")
    y = _scaled_norm(g, total, 32)
    g.nodes.append(helper.make_node("Identity", [y], ["y"], name="out"))
    graph = helper.make_graph(g.nodes, "flattened", [_value("x", ["B", 4, D]), _value("r", ["B", 32])],
                              [_value("y", ["B", 32])], g.initializers)
    return make_model(graph, [helper.make_opsetid("", 18)])


def head_norm_model() -> onnx.ModelProto:
    """q/k-norm style: ``x`` [B, S, 64] reshaped to ``[B, S, 4, Shape(x)[2] / 4]`` (ONNX's data propagation has no
    Div: [B, S, 4, unk]) and normalized over the head dim with a scale of 16."""
    g = GraphBuilder(18)
    head_dim = g.op("Div", g.op("Gather", g.op("Shape", "x"), _ints(g, 2), axis=0), _ints(g, 4))
    target = g.op("Concat", g.op("Shape", "x", end=2), _ints(g, 4), head_dim, axis=0)
    y = _scaled_norm(g, g.op("Reshape", "x", target), 16)
    g.nodes.append(helper.make_node("Identity", [y], ["y"], name="out"))
    graph = helper.make_graph(g.nodes, "heads", [_value("x", ["B", "S", 64])], [_value("y", ["B", "S", 4, 16])],
                              g.initializers)
    return make_model(graph, [helper.make_opsetid("", 18)])


RESHAPES = {
    "minus-one-with-symbolic-batch": (flattened_model, {"x": (2, 4, D), "r": (2, 32)}, True),
    "div-of-dims": (head_norm_model, {"x": (2, 3, 64)}, False),
}


@pytest.mark.parametrize("target", ["custom", "ort", "onnx"])
@pytest.mark.parametrize("name", RESHAPES)
def test_reshape_of_a_computed_shape(name, target, rng):
    build, shapes, residual = RESHAPES[name]
    model = build()
    fused, report = _fuse(model, target)
    (fusion,) = report.fusions
    assert report.skipped == [] and fusion.scale == "tensor", report.summary()
    skip = residual and target in SKIP_OPS
    if target == "ort" and name == "div-of-dims":  # rank 4: onnxruntime's skip op takes rank 2 or 3 (no Add here)
        skip = False
    assert fusion.skip == skip
    assert _ops(fused).count(SKIP_OPS[target] if skip else NORM_OPS[target]) == 1
    _check_numbers(model, fused, target, [{n: random_array(rng, s, np.float32) for n, s in shapes.items()}])


def test_inferred_dims_of_a_computed_reshape():
    """What :func:`infer_shapes` gives the Reshape of ``[B, S, 4, Shape(x)[2] / 4]``, and the value after it."""
    from ort_rmsnorm.model.shapes import infer_shapes

    model = head_norm_model()
    inferred = infer_shapes(model)
    infos = {info.name: info for info in (*inferred.graph.value_info, *inferred.graph.output)}
    reshape = next(node for node in model.graph.node if node.op_type == "Reshape")
    after = next(node for node in model.graph.node if reshape.output[0] in node.input and node.op_type == "Pow")
    for name in (reshape.output[0], after.output[0]):
        dims = [d.dim_value or d.dim_param for d in infos[name].type.tensor_type.shape.dim]
        assert dims == ["B", "S", 4, 16], name
