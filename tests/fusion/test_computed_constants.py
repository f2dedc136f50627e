"""Constants the pass reads (reduction axes, exponent, epsilon, 1/D, a scale, 1 + w) computed by small constant-only
subexpressions, as dynamo's raw translation (optimize=False) and other tools write them: each such norm fuses as the
folded one does, the rest of the model is left as it is, and what is computed at run time stays a near miss."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import ort_rmsnorm
from fusion.norm_graphs import GraphBuilder, attribute, fused_nodes, run_fused, run_unfused
from op_models import make_model, skip_unless_runtime_runs
from reference import assert_matches_reference, random_array, rmsnorm

HIDDEN = 8
SHAPE = ["B", "S", HIDDEN]
RUN_SHAPE = (2, 3, HIDDEN)


def _i64(*values) -> np.ndarray:
    return np.array(values, np.int64)


def _norm(g: GraphBuilder, axes: str, exponent: str, epsilon: str, scale: str | None = None) -> str:
    square = g.op("Pow", "x", exponent)
    mean = g.op("ReduceMean", square, axes)
    inverse = g.op("Reciprocal", g.op("Sqrt", g.op("Add", mean, epsilon)))
    normalized = g.op("Mul", "x", inverse)
    return g.op("Mul", normalized, scale) if scale is not None else normalized


def _model(g: GraphBuilder, y: str, extra_inputs=()) -> onnx.ModelProto:
    g.nodes.append(helper.make_node("Identity", [y], ["y"], name="to_output"))
    graph = helper.make_graph(
        g.nodes,
        "computed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE), *extra_inputs],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)],
        g.initializers,
    )
    return make_model(graph, [helper.make_opsetid("", 18)])


def _constant(g: GraphBuilder, array) -> str:
    return g.constant(np.asarray(array), "constant")


# Each spelling: (axes, exponent, epsilon) built from constants through one of the ops the pass evaluates.
def _dynamo_raw(g):
    axes = g.op("Reshape", _constant(g, _i64(-1)), _constant(g, _i64(1)))
    return axes, _constant(g, np.float32(2.0)), _constant(g, np.float32(1e-6))


def _casts(g):
    exponent = g.op("Cast", _constant(g, _i64(2)), to=TensorProto.FLOAT)
    epsilon = g.op("Cast", _constant(g, np.float64(1e-6)), to=TensorProto.FLOAT)
    return g.op("Cast", _constant(g, np.int32([-1])), to=TensorProto.INT64), exponent, epsilon


def _shape_arithmetic(g):
    """axes = [rank(x) - 1] computed from Shape(Shape(x)), which needs only x's static rank."""
    rank = g.op("Shape", g.op("Shape", "x"))
    axes = g.op("Sub", rank, _constant(g, _i64(1)))
    return axes, _constant(g, np.float32(2.0)), _constant(g, np.float32(1e-6))


def _unsqueeze_concat(g):
    axes = g.op("Concat", g.op("Unsqueeze", _constant(g, np.int64(-1)), _constant(g, _i64(0))), axis=0)
    epsilon = g.op("Squeeze", _constant(g, np.float32([1e-6])), _constant(g, _i64(0)))
    return axes, g.op("Identity", _constant(g, np.float32(2.0))), epsilon


SPELLINGS = {"dynamo-raw": _dynamo_raw, "casts": _casts, "shape-arithmetic": _shape_arithmetic,
             "unsqueeze-concat-squeeze": _unsqueeze_concat}


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_computed_axes_exponent_and_epsilon(spelling, rng):
    g = GraphBuilder(18)
    axes, exponent, epsilon = SPELLINGS[spelling](g)
    weight = (1.0 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32)
    model = _model(g, _norm(g, axes, exponent, epsilon, g.constant(weight)))
    fused, report = ort_rmsnorm.fuse(model)
    assert not report.skipped, report.summary()
    (node,) = fused_nodes(fused, "RMSNorm")
    assert attribute(node, "axis") == -1 and attribute(node, "epsilon") == pytest.approx(1e-6)
    # Only the norm's own nodes went: nothing else of the model was folded or rewritten.
    assert [n.op_type for n in fused.graph.node] == ["RMSNorm", "Identity"]
    x = random_array(rng, RUN_SHAPE, np.float32)
    (y,) = run_fused(fused, {"x": x})
    expected, _ = rmsnorm(x, weight, epsilon=np.float32(1e-6))
    assert_matches_reference(y, expected, np.float32)


def test_computed_divisor_and_one_plus_w(rng):
    """ReduceSum / D with D = Cast(Gather(Shape(x), -1)) (a static dim), and Gemma's 1 + w with w reshaped."""
    g = GraphBuilder(18)
    count = g.op("Cast", g.op("Gather", g.op("Shape", "x"), _constant(g, np.int64(-1))), to=TensorProto.FLOAT)
    mean = g.op("Div", g.op("ReduceSum", g.op("Mul", "x", "x"), g.constant(_i64(-1))), count)
    inverse = g.op("Reciprocal", g.op("Sqrt", g.op("Add", mean, g.constant(np.float32(1e-5)))))
    w = (0.1 * rng.standard_normal(HIDDEN)).astype(np.float32)
    reshaped = g.op("Reshape", g.constant(w.reshape(2, HIDDEN // 2)), g.constant(_i64(HIDDEN)))
    scale = g.op("Add", _constant(g, np.float32(1.0)), reshaped)
    model = _model(g, g.op("Mul", g.op("Mul", "x", inverse), scale))
    fused, report = ort_rmsnorm.fuse(model)
    (fusion,) = report.fusions
    assert fusion.scale == "folded 1+w" and not report.skipped, report.summary()
    x = random_array(rng, RUN_SHAPE, np.float32)
    (y,) = run_fused(fused, {"x": x})
    expected, _ = rmsnorm(x, (np.float32(1.0) + w).astype(np.float32), epsilon=np.float32(1e-5))
    assert_matches_reference(y, expected, np.float32)


def test_reshaped_scale_is_converted_for_the_onnx_target(rng):
    """The onnx target needs the scale's elements: a Reshape of an initializer is evaluated for it."""
    g = GraphBuilder(23)
    weight = (1.0 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32)
    scale = g.op("Reshape", g.constant(weight.reshape(1, HIDDEN)), g.constant(_i64(1, 1, HIDDEN)))
    axes, exponent, epsilon = _dynamo_raw(g)
    model = _model(g, _norm(g, axes, exponent, epsilon, scale))
    model.opset_import[0].version = 23
    fused, report = ort_rmsnorm.fuse(model, "onnx")
    assert len(fused_nodes(fused, "RMSNormalization")) == 1, report.summary()
    skip_unless_runtime_runs("onnx")
    x = random_array(rng, RUN_SHAPE, np.float32)
    assert np.allclose(run_unfused(fused, {"x": x})[0], run_unfused(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_axes_from_an_input_stay_unfused():
    g = GraphBuilder(18)
    model = _model(g, _norm(g, "axes_input", _constant(g, np.float32(2.0)), _constant(g, np.float32(1e-6))),
                   [helper.make_tensor_value_info("axes_input", TensorProto.INT64, [1])])
    fused, report = ort_rmsnorm.fuse(model)
    assert not report.fusions and not fused_nodes(fused, "RMSNorm")
    assert report.skipped[0].reason.endswith("axes are not constant"), report.summary()


def test_large_computations_are_not_evaluated():
    """A scale computed from a weight of 64 KiB and more stays a run-time value: the onnx target, which needs its
    elements in float16 for a float16 norm, says so, while the custom target reads the float32 scale as it is."""
    hidden = 1 << 15  # 128 KiB of float32
    g = GraphBuilder(23)
    x32 = g.op("Cast", "x", to=TensorProto.FLOAT)
    axes, exponent, epsilon = _dynamo_raw(g)
    inverse = g.op("Reciprocal", g.op("Sqrt", g.op("Add", g.op("ReduceMean", g.op("Pow", x32, exponent), axes), epsilon)))
    scale = g.op("Mul", g.constant(np.ones(hidden, np.float32)), _constant(g, np.float32(1.0)))
    y = g.op("Cast", g.op("Mul", g.op("Mul", x32, inverse), scale), to=TensorProto.FLOAT16)
    g.nodes.append(helper.make_node("Identity", [y], ["y"], name="to_output"))
    graph = helper.make_graph(g.nodes, "large", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2, hidden])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [2, hidden])], g.initializers)
    model = make_model(graph, [helper.make_opsetid("", 23)])
    _, report = ort_rmsnorm.fuse(model, "custom")
    assert report.fusions[0].scale == "tensor", report.summary()
    _, report = ort_rmsnorm.fuse(model, "onnx")
    assert any("computed at run time" in entry.reason for entry in report.skipped), report.summary()
