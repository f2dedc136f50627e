"""Norms that float16 converters leave with casts between their own ops: the statistic kept in float32 but its mean
(or its squares) rounded to float16 on the way, the division in float16 of x itself, a residual Add in float32 of
widened float16 values. They fuse; the fused op keeps the statistic in float32 and rounds once, and every fusion
lists in ``roundings`` where the graph rounded instead. A cast of the statistic to another type stays unfused."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnx.reference import ReferenceEvaluator

import ort_rmsnorm
from fusion.norm_graphs import GraphBuilder, attribute, fused_nodes, run_fused, run_unfused
from op_models import make_model
from reference import assert_matches_reference, random_array, rmsnorm

HIDDEN = 16
SHAPE = ["B", "S", HIDDEN]
RUN_SHAPE = (2, 3, HIDDEN)
EPSILON = np.float16(1e-5)  # the graph's float16 constant; the fused op reads its value exactly
F16, F32, F64 = TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE


def _blocked_statistic(g: GraphBuilder, x: str, weight: str, statistic_to=F16, round_squares=False) -> str:
    """onnxconverter-common's float16 model with Pow and ReduceMean in its block list: x^2 and the mean in float32
    from an exact cast of x, the mean cast to float16, the rest in float16 (onnxruntime's converter also rounds the
    squares to float16 between Pow and ReduceMean)."""
    square = g.op("Pow", g.op("Cast", x, to=F32), g.constant(np.float32(2.0), "constant"))
    if round_squares:
        square = g.op("Cast", g.op("Cast", square, to=F16), to=F32)
    mean = g.op("Cast", g.op("ReduceMean", square, g.constant(np.array([-1], np.int64))), to=statistic_to)
    epsilon = g.constant(np.array(EPSILON, onnx.helper.tensor_dtype_to_np_dtype(statistic_to)))
    inverse = g.op("Reciprocal", g.op("Sqrt", g.op("Add", mean, epsilon)))
    if statistic_to != F16:
        inverse = g.op("Cast", inverse, to=F16)
    return g.op("Mul", weight, g.op("Mul", x, inverse))


def _model(g: GraphBuilder, y: str, inputs=("x",), output_type=F16) -> onnx.ModelProto:
    g.nodes.append(helper.make_node("Identity", [y], ["y"], name="to_output"))
    graph = helper.make_graph(
        g.nodes,
        "mixed",
        [helper.make_tensor_value_info(name, F16, SHAPE) for name in inputs],
        [helper.make_tensor_value_info("y", output_type, SHAPE)],
        g.initializers,
    )
    return make_model(graph, [helper.make_opsetid("", 18)])


@pytest.mark.parametrize("round_squares", [False, True], ids=["mean-rounded", "squares-and-mean-rounded"])
def test_statistic_rounded_to_float16_fuses_and_says_so(round_squares, rng):
    g = GraphBuilder(18)
    weight = (1.0 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float16)
    model = _model(g, _blocked_statistic(g, "x", g.constant(weight), round_squares=round_squares))
    fused, report = ort_rmsnorm.fuse(model)
    (fusion,) = report.fusions
    assert not report.skipped and fusion.input_dtype == "float16", report.summary()
    expected_roundings = ["the statistic is rounded to float16", "the normalized value is rounded to float16 before the scale"]
    if round_squares:
        expected_roundings.insert(0, "the squares are rounded to float16")
    assert fusion.roundings == expected_roundings
    assert "the graph rounds: the" in report.summary()
    (node,) = fused_nodes(fused, "RMSNorm")
    assert list(node.input)[0] == "x"  # the float16 input itself, not its float32 cast

    x = random_array(rng, RUN_SHAPE, np.float16)
    (y,) = run_fused(fused, {"x": x})
    expected, _ = rmsnorm(x, weight, epsilon=EPSILON)
    assert_matches_reference(y, expected, np.float16)
    # The graph's extra roundings are a few float16 units in the last place away from it.
    (unfused,) = run_unfused(model, {"x": x})
    assert np.allclose(unfused.astype(np.float64), expected, rtol=8 * 2.0**-10, atol=1e-3)


def test_where_the_written_graph_overflows_the_fused_op_does_not(rng):
    """The decision behind fusing: with an rms above 256 the graph's float16 mean is infinite as written (ONNX's
    reference evaluator) and its output zero. onnxruntime's CPU provider, which has no float16 Add, Sqrt or
    Reciprocal, computes them in float32 and drops the mean's rounding: as it runs the graph, it gives the norm, and
    so does the fused op, whose statistic is float32."""
    g = GraphBuilder(18)
    weight = np.ones(HIDDEN, np.float16)
    model = _model(g, _blocked_statistic(g, "x", g.constant(weight)))
    fused, _ = ort_rmsnorm.fuse(model)
    x = (1000.0 * random_array(rng, RUN_SHAPE, np.float16).astype(np.float32)).astype(np.float16)
    (written,) = ReferenceEvaluator(model).run(None, {"x": x})
    assert not np.any(written)
    expected, _ = rmsnorm(x, weight, epsilon=EPSILON)
    (y,) = run_fused(fused, {"x": x})
    assert_matches_reference(y, expected, np.float16)
    (unfused,) = run_unfused(model, {"x": x})
    assert np.allclose(unfused.astype(np.float64), expected, rtol=8 * 2.0**-10, atol=1e-3)


def test_statistic_cast_to_float64_stays(rng):
    g = GraphBuilder(18)
    model = _model(g, _blocked_statistic(g, "x", g.constant(np.ones(HIDDEN, np.float16)), statistic_to=F64))
    fused, report = ort_rmsnorm.fuse(model)
    assert not fused_nodes(fused, "RMSNorm"), report.summary()
    assert any("the statistic is cast to float64" in entry.reason for entry in report.skipped), report.summary()


def _residual(g: GraphBuilder, widened: bool, back_to=F16) -> str:
    if not widened:
        return g.op("Add", "a", "b")
    return g.op("Cast", g.op("Add", g.op("Cast", "a", to=F32), g.op("Cast", "b", to=F32)), to=back_to)


def test_float32_add_of_widened_float16_values_is_the_residual(rng):
    """Cast(Add(Cast(a), Cast(b))) to float16 is float16's own Add: exactly what SkipRMSNorm's sum computes."""
    g = GraphBuilder(18)
    weight = (1.0 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float16)
    total = _residual(g, widened=True)
    g.nodes.append(helper.make_node("Identity", [total], ["h"], name="sum_out"))
    model = _model(g, _blocked_statistic(g, total, g.constant(weight)), inputs=("a", "b"))
    model.graph.output.append(helper.make_tensor_value_info("h", F16, SHAPE))
    fused, report = ort_rmsnorm.fuse(model)
    (node,) = fused_nodes(fused, "SkipRMSNorm")
    assert report.fusions[0].skip and not report.skipped, report.summary()
    assert attribute(node, "normalize_float32_sum") is None  # the graph normalizes the rounded sum, as does the op
    feeds = {"a": random_array(rng, RUN_SHAPE, np.float16), "b": random_array(rng, RUN_SHAPE, np.float16)}
    y, h = run_fused(fused, feeds)
    _, h_unfused = run_unfused(model, feeds)
    assert np.array_equal(h.view(np.uint16), h_unfused.view(np.uint16))  # the sum bit for bit
    expected, _ = rmsnorm(feeds["a"], weight, epsilon=EPSILON, skip=feeds["b"])
    assert_matches_reference(y, expected, np.float16)


def test_float32_add_cast_to_another_type_is_no_residual(rng):
    g = GraphBuilder(18)
    total = _residual(g, widened=True, back_to=TensorProto.BFLOAT16)
    y = g.op("Cast", total, to=F16)
    model = _model(g, _blocked_statistic(g, y, g.constant(np.ones(HIDDEN, np.float16))), inputs=("a", "b"))
    fused, report = ort_rmsnorm.fuse(model)
    assert len(fused_nodes(fused, "RMSNorm")) == 1 and not fused_nodes(fused, "SkipRMSNorm"), report.summary()
