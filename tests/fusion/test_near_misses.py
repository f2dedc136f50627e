"""What must not be fused stays as it was (or is fused only as far as it is exact), and the report says why.

Each case checks the near miss's reason in the report, what is left of the graph, and that the outputs still match
the original model run unfused (so a value used elsewhere was kept alive).
"""

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
    fused_nodes,
    norm_model,
    run_fused,
    run_unfused,
)
from op_models import make_model
from reference import random_array

STATIC = {"shape": (2, 3, 8), "run_shape": (2, 3, 8)}

# name -> (spelling, reason fragment, whether the norm itself is fused (without the part named))
SPELLING_NEAR_MISSES = {
    "exponent-3": (Spelling(exponent=3.0), "exponent 3 is not 2", False),
    "keepdims-0-broadcasts-along-rows": (
        Spelling(keepdims="zero", shape=(8, 8), run_shape=(8, 8), scale="none"),
        "keepdims=0",
        False,
    ),
    "non-trailing-axis": (Spelling(axes=(1,), scale="none", **STATIC), "is not over the trailing axes", False),
    "non-trailing-axis-set": (Spelling(axes=(0, 2), scale="none", **STATIC), "is not over the trailing axes", False),
    "epsilon-not-constant": (Spelling(eps="input"), "epsilon is not a constant", False),
    "epsilon-negative": (Spelling(epsilon=-1e-3), "is not finite and >= 0", False),
    "sum-divided-by-wrong-count": (Spelling(mean="sum_div", divisor=7.0), "is not a mean over the 8", False),
    "sum-dims-not-static": (Spelling(mean="sum_div", axes=(-2, -1), scale="none"), "are not static", False),
    "div-two-by-rms": (Spelling(inverse="div_one", numerator=2.0), "c != 1", False),
    "pow-minus-quarter": (Spelling(inverse="pow_half", inverse_exponent=-0.25), "p != -0.5", False),
    "rank-unknown-positive-axis": (Spelling(axes=(2,), shape=None, scale="none"), "rank unknown", False),
    "float64": (Spelling(dtype="float64"), "computed in float64", False),
    "scale-varies-along-rows": (Spelling(scale_shape=(3, 8), **STATIC), "varies along non-normalized axes", True),
    "scale-enlarges-output": (Spelling(scale_shape=(2, 1, 1, 8), **STATIC), "would enlarge the output", True),
    "scale-dims-unknown": (Spelling(shape=None), "input shape unknown", True),
    "two-axes-scale-on-symbolic-dim": (Spelling(axes=(-2, -1)), "cannot prove the scale's dims", True),
    # x * (inverse * w): the scale is multiplied in before x, so a scale that does not qualify keeps the whole norm.
    "factor-scale-varies-along-rows": (
        Spelling(factor="inverse_first", scale_shape=(3, 8), **STATIC),
        "scale of shape [3, 8] on input [2, 3, 8] varies along non-normalized axes",
        False,
    ),
    "factor-scale-graph-input-varies-along-rows": (
        Spelling(factor="scale_first", x_last=True, scale="input", scale_shape=(3, 8), **STATIC),
        "scale of shape [3, 8] on input [2, 3, 8] varies along non-normalized axes",
        False,
    ),
    "factor-exponent-3": (Spelling(factor="inverse_first", exponent=3.0), "exponent 3 is not 2", False),
    "factor-float64": (Spelling(factor="inverse_first", dtype="float64"), "computed in float64", False),
    "global-average-pool-rank-unknown": (
        Spelling(mean="global_average_pool", shape=None, scale="none"),
        "rank unknown: GlobalAveragePool 'GlobalAveragePool_",
        False,
    ),
    "global-average-pool-rank-unknown-factor": (
        Spelling(mean="global_average_pool", shape=None, factor="inverse_first"),
        "averages every axis after the second, and its input's rank is unknown",
        False,
    ),
}

ONE_REASON = [name for name in SPELLING_NEAR_MISSES if name.startswith(("factor-", "global-average-pool-"))]


@pytest.mark.parametrize("name", ONE_REASON)
def test_factor_and_pool_near_misses_give_one_true_reason(name):
    """The factor-times-scale form also looks like ``Mul(scale, normalized)`` with x for the scale and w for the
    numerator: only the factor rule's reason is reported, never ``divides 'w' by the rms of another value, 'x'``."""
    spelling, reason, _ = SPELLING_NEAR_MISSES[name]
    for target in ("custom", "onnx", "ort"):
        _, report = ort_rmsnorm.fuse(norm_model(spelling).model, target)
        assert len(report.skipped) == 1 and reason in report.skipped[0].reason, (target, report.summary())
        assert report.fusions == []


@pytest.mark.parametrize("name", SPELLING_NEAR_MISSES)
def test_spelling_near_miss(name):
    spelling, reason, norm_fused = SPELLING_NEAR_MISSES[name]
    case = norm_model(spelling)
    fused, report = ort_rmsnorm.fuse(case.model)

    assert any(reason in entry.reason for entry in report.skipped), report.summary()
    entry = next(entry for entry in report.skipped if reason in entry.reason)
    assert entry.location == "main graph" and entry.nodes
    if norm_fused:
        (node,) = fused_nodes(fused, "RMSNorm")
        assert len(node.input) == 1, "the scale that does not qualify must stay a separate Mul"
        assert entry.fused_as == node.name
        assert len(fused_nodes(fused, "Mul")) == 1
    else:
        assert not fused_nodes(fused, "RMSNorm") and report.fusions == []
        assert sorted(n.op_type for n in fused.graph.node) == sorted(n.op_type for n in case.model.graph.node)
    if spelling.shape is not None:
        check_model(fused)
    for got, want in zip(run_fused(fused, case.feeds), run_unfused(case.model, case.feeds)):
        assert_close_to_unfused(got, want, name)


def test_unknown_rank_with_negative_axis_still_fuses():
    """Negative axes are trailing whatever the rank: no shape needed when there is no scale to check."""
    case = norm_model(Spelling(shape=None, scale="none"))
    fused, report = ort_rmsnorm.fuse(case.model)
    (node,) = fused_nodes(fused, "RMSNorm")
    assert report.fusions[0].axis == -1 and report.skipped == []
    assert_close_to_unfused(run_fused(fused, case.feeds)[0], run_unfused(case.model, case.feeds)[0])


# ---- intermediates used elsewhere --------------------------------------------------------------------------------


def _norm_with_extra_output(op_type: str, as_graph_output: bool) -> onnx.ModelProto:
    """A norm whose intermediate (first output of ``op_type``) is also used elsewhere, or is a graph output."""
    g = GraphBuilder(18)
    y, _ = add_norm(g, "x", Spelling(), np.dtype(np.float32))
    y = g.op("Mul", y, g.constant(np.linspace(0.5, 1.5, 8, dtype=np.float32)))
    intermediate = next(node.output[0] for node in g.nodes if node.op_type == op_type)
    outputs = [helper.make_tensor_value_info(y, TensorProto.FLOAT, ["B", "S", 8])]
    if as_graph_output:
        outputs.append(helper.make_tensor_value_info(intermediate, TensorProto.FLOAT, ["B", "S", 1]))
    else:
        g.nodes.append(helper.make_node("Neg", [intermediate], ["other"], name="other_user"))
        outputs.append(helper.make_tensor_value_info("other", TensorProto.FLOAT, None))
    graph = helper.make_graph(
        g.nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", 8])], outputs, g.initializers
    )
    return make_model(graph, [helper.make_opsetid("", 18)])


@pytest.mark.parametrize("op_type", ["ReduceMean", "Add", "Sqrt", "Reciprocal"])
@pytest.mark.parametrize("as_graph_output", [False, True], ids=["used-elsewhere", "graph-output"])
def test_intermediate_used_elsewhere_keeps_the_norm(op_type, as_graph_output, rng):
    model = _norm_with_extra_output(op_type, as_graph_output)
    fused, report = ort_rmsnorm.fuse(model)

    assert report.fusions == [] and not fused_nodes(fused, "RMSNorm")
    expected = "is a graph output" if as_graph_output else "is also used by Neg 'other_user'"
    assert [entry.reason.split(") ", 1)[1] for entry in report.skipped] == [expected]
    assert f"({op_type} output)" in report.skipped[0].reason
    feeds = {"x": random_array(rng, (2, 3, 8), np.float32)}
    for got, want in zip(run_fused(fused, feeds), run_unfused(model, feeds)):
        np.testing.assert_array_equal(got, want)


def test_normalized_value_used_elsewhere_fuses_without_the_scale(rng):
    """The normalized value (before the scale) read by another node: the norm is its own output, so the norm fuses
    and the scale stays a Mul."""
    g = GraphBuilder(18)
    y, _ = add_norm(g, "x", Spelling(), np.dtype(np.float32))
    scaled = g.op("Mul", y, g.constant(np.linspace(0.5, 1.5, 8, dtype=np.float32)))
    g.nodes.append(helper.make_node("Neg", [y], ["other"], name="other_user"))
    graph = helper.make_graph(
        g.nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", 8])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["B", "S", 8]) for name in (scaled, "other")],
        g.initializers,
    )
    model = make_model(graph, [helper.make_opsetid("", 18)])
    fused, report = ort_rmsnorm.fuse(model)
    (node,) = fused_nodes(fused, "RMSNorm")
    assert len(node.input) == 1 and [n.op_type for n in fused.graph.node] == ["RMSNorm", "Mul", "Neg"]
    assert any("is also used by Neg" in entry.reason and entry.fused_as == node.name for entry in report.skipped)
    feeds = {"x": random_array(rng, (2, 3, 8), np.float32)}
    for got, want in zip(run_fused(fused, feeds), run_unfused(model, feeds)):
        assert_close_to_unfused(got, want)


# ---- LayerNorm ---------------------------------------------------------------------------------------------------


def _centered_norm(center_axes, cast: bool, pooled: bool = False) -> onnx.ModelProto:
    """(x - mean(x)) normalized by its RMS: a LayerNorm when the mean is over the normalized axes. ``pooled``: the
    mean written as GlobalAveragePool (tf2onnx, rank 3: the last axis)."""
    g = GraphBuilder(18)
    source = g.op("Cast", "x", to=TensorProto.FLOAT) if cast else "x"
    if pooled:
        mean = g.op("GlobalAveragePool", source)
    else:
        mean = g.op("ReduceMean", source, g.constant(np.array(center_axes, np.int64)))
    centered = g.op("Sub", source, mean)
    y, _ = add_norm(g, centered, Spelling(inverse="div"), np.dtype(np.float32))
    y = g.op(
        "Add", g.op("Mul", y, g.constant(np.linspace(0.5, 1.5, 8, dtype=np.float32))), g.constant(np.float32(0.25))
    )
    graph = helper.make_graph(
        g.nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT if not cast else TensorProto.FLOAT16, [2, 3, 8])],
        [helper.make_tensor_value_info(y, TensorProto.FLOAT, [2, 3, 8])],
        g.initializers,
    )
    return make_model(graph, [helper.make_opsetid("", 18)])


@pytest.mark.parametrize("pooled", [False, True], ids=["reduce-mean", "global-average-pool"])
@pytest.mark.parametrize("cast", [False, True], ids=["float32", "float16-upcast"])
def test_layernorm_is_left_alone(cast, pooled):
    model = _centered_norm([-1], cast, pooled)
    fused, report = ort_rmsnorm.fuse(model)
    assert report.fusions == [] and fused.graph.node == model.graph.node
    assert {entry.reason for entry in report.skipped} == {
        "the input is x - mean(x) over the normalized axes: a LayerNorm, not an RMSNorm"
    }


def test_centering_over_other_axes_is_not_a_layernorm(rng):
    model = _centered_norm([0], cast=False)
    fused, report = ort_rmsnorm.fuse(model)
    assert len(report.fusions) == 1 and report.skipped == []
    feeds = {"x": random_array(rng, (2, 3, 8), np.float32)}
    assert_close_to_unfused(run_fused(fused, feeds)[0], run_unfused(model, feeds)[0])


# ---- types -------------------------------------------------------------------------------------------------------


def test_lossy_input_cast_is_not_skipped_over(rng):
    """x (float32) cast to float16 before the norm: X must be the float16 value (the cast rounds), the float16
    output cast back to float32 stays."""
    g = GraphBuilder(18)
    half = g.op("Cast", "x", to=TensorProto.FLOAT16)
    y, _ = add_norm(g, half, Spelling(), np.dtype(np.float16))
    y = g.op("Cast", y, to=TensorProto.FLOAT)
    graph = helper.make_graph(
        g.nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 8])],
        [helper.make_tensor_value_info(y, TensorProto.FLOAT, ["B", 8])],
        g.initializers,
    )
    model = make_model(graph, [helper.make_opsetid("", 18)])
    fused, report = ort_rmsnorm.fuse(model)
    (node,) = fused_nodes(fused, "RMSNorm")
    assert node.input[0] == half and [n.op_type for n in fused.graph.node] == ["Cast", "RMSNorm", "Cast"]
    assert report.fusions[0].input_dtype == "float16"
    assert any("the output is float32 but the input is float16" in entry.reason for entry in report.skipped)
    feeds = {"x": random_array(rng, (4, 8), np.float32)}
    np.testing.assert_allclose(run_fused(fused, feeds)[0], run_unfused(model, feeds)[0], rtol=2.0**-9)


def test_rounded_to_another_type_before_the_scale(rng):
    """float16 rounding inside a float32 norm (normalized value cast to float16, scaled in float16, cast back to
    float32): one rounding to float32 would not be the same, so only the norm up to the rounding is fused."""
    case = norm_model(Spelling(dtype="float16", upcast=True, scale_dtype="float16"))
    model = case.model
    out = model.graph.node[-3].output[0]  # the float16 scale Mul, before Identity and Shape
    model.graph.node.insert(len(model.graph.node) - 2, helper.make_node("Cast", [out], ["out32"], to=TensorProto.FLOAT))
    model.graph.node[-2].input[0] = "out32"
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT
    fused, report = ort_rmsnorm.fuse(model)
    # Cast(f16 → f32) after the scale is not absorbed: the fused op's output would be float16.
    (node,) = fused_nodes(fused, "RMSNorm")
    assert node.input[0] == "x" and fused.graph.node[-3].op_type == "Cast"
    assert any(entry.fused_as == node.name for entry in report.skipped)
    got, want = run_fused(fused, case.feeds)[0], run_unfused(model, case.feeds)[0]
    np.testing.assert_allclose(got, want, rtol=2.0**-9)
