"""The ``onnx`` (RMSNormalization, opset 23) and ``ort`` (SimplifiedLayerNormalization) targets: fused exactly where
their operator can express the norm, skipped with a reason where it cannot."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import ort_rmsnorm
from fusion.norm_graphs import (
    Spelling,
    assert_close_to_unfused,
    assert_matches_float64,
    attribute,
    check_model,
    float64_reference,
    fused_nodes,
    norm_model,
    run_fused,
    run_unfused,
    scale_array,
)
from op_models import skip_unless_runtime_runs

OPS = {"onnx": "RMSNormalization", "ort": "SimplifiedLayerNormalization"}
STATIC = {"shape": (2, 3, 8), "run_shape": (2, 3, 8)}

EXPRESSIBLE = {
    "base": Spelling(),
    "torchscript-opset17": Spelling(opset=17, inverse="div_one", eps="constant_node"),
    "two-axes-scale-broadcast": Spelling(axes=(-2, -1), scale_shape=(3, 1), **STATIC),
    "no-scale-static-hidden": Spelling(scale="none"),
    "no-eps": Spelling(eps="none", inverse="pow_half"),
    "one-plus-w-folded": Spelling(scale="one_plus"),
    "hf-float16": Spelling(dtype="float16", upcast=True, scale="mul_swapped"),
    "hf-float16-no-scale": Spelling(dtype="float16", upcast=True, scale="none"),
    "hf-bfloat16": Spelling(dtype="bfloat16", upcast=True),
    "sum-div": Spelling(mean="sum_div"),
    # tf2onnx: the scale multiplied into the inverse first; at opset 17 the mean as GlobalAveragePool.
    "tf-keras-opset17": Spelling(square="mul", mean="global_average_pool", factor="inverse_first", opset=17),
    "tf-keras-opset18": Spelling(square="mul", factor="inverse_first"),
    "tf-factor-scale-first-x-last": Spelling(factor="scale_first", x_last=True),
    "global-average-pool-two-axes": Spelling(
        mean="global_average_pool", axes=(-2, -1), shape=("B", 2, 3, 8), run_shape=(2, 2, 3, 8)
    ),
}


def _for_target(spelling: Spelling, target: str) -> Spelling:
    return dataclasses.replace(spelling, opset=max(spelling.opset, 23)) if target == "onnx" else spelling


@pytest.mark.parametrize("target", OPS)
@pytest.mark.parametrize("name", EXPRESSIBLE)
def test_target_fuses_exactly(target, name):
    spelling = _for_target(EXPRESSIBLE[name], target)
    case = norm_model(spelling)
    fused, report = ort_rmsnorm.fuse(case.model, target)
    if target == "onnx" and spelling.dtype == "bfloat16":
        # No bfloat16 kernel: only the float32 core between the casts fuses (the bfloat16 scale Mul stays).
        assert any("bfloat16" in entry.reason for entry in report.skipped)
        assert [fusion.input_dtype for fusion in report.fusions] == ["float32"]
        assert [n.op_type for n in fused.graph.node].count("Mul") == 1
        return

    (node,) = fused_nodes(fused, OPS[target])
    assert node.domain == ""
    assert attribute(node, "axis") == -spelling.normalized
    assert attribute(node, "epsilon") == pytest.approx(0.0 if spelling.eps == "none" else spelling.epsilon, rel=1e-6)
    assert attribute(node, "stash_type") == 1
    scale = scale_array(fused, node.input[1])
    assert scale.dtype == spelling.np_dtype  # these ops take the scale in X's type
    expected_scale = case.scale if case.scale is not None else np.ones(8, spelling.np_dtype)
    np.testing.assert_array_equal(scale.astype(np.float64), np.broadcast_to(expected_scale, scale.shape))
    # One scale element per normalized element: onnxruntime before 1.24 does not broadcast these ops' scale.
    normalized = case.feeds["x"].shape[-spelling.normalized :]
    assert scale.size == np.prod(normalized)
    form = {"none": "ones (added)", "one_plus": "folded 1+w"}.get(spelling.scale, "tensor")
    expanded = case.scale is not None and bool(case.scale.size != np.prod(normalized))
    if expanded:
        form += f", broadcast to [{', '.join(map(str, normalized))}]"
    assert report.fusions[0].scale == form
    new_constant = case.scale is None or spelling.scale == "one_plus" or expanded  # ones, 1 + w folded, expanded
    assert sorted(n.op_type for n in fused.graph.node) == sorted(
        ["Identity", "Shape", OPS[target]] + ["Constant"] * new_constant
    )
    check_model(fused, ort_default_ops=target == "ort")
    skip_unless_runtime_runs(target, spelling.dtype)
    fused_out = run_fused(fused, case.feeds)
    if spelling.dtype != "bfloat16":
        assert_close_to_unfused(fused_out[0], run_unfused(case.model, case.feeds)[0], name)
    assert_matches_float64_for_target(case, fused_out[0])
    again, second = ort_rmsnorm.fuse(fused, target)
    assert again == fused and second.fusions == []


def assert_matches_float64_for_target(case, y):
    """onnxruntime's kernels for these ops round differently from ours (float16: the scale product in float16):
    within 2 ulps of T of the float64 value."""
    if y.dtype == np.float32:
        assert_matches_float64(case, y)
        return
    rtol = 2.0**-9 if y.dtype == np.float16 else 2.0**-6
    np.testing.assert_allclose(y.astype(np.float64), float64_reference(case), rtol=rtol, atol=1e-6)


NOT_EXPRESSIBLE = {
    "eps-outside-sqrt": (Spelling(eps="outside"), "epsilon is added outside the sqrt"),
    "no-scale-symbolic-dims": (Spelling(scale="none", axes=(-2, -1)), "needs a scale tensor"),
    "float32-scale-on-float16-not-exact": (
        Spelling(dtype="float16", upcast=True, scale="cast_after"),
        "not exactly representable in float16",
    ),
    "runtime-scale-broadcasts": (
        Spelling(scale="one_plus_runtime", axes=(-2, -1), scale_shape=(3, 1), **STATIC),
        "the scale of shape [3, 1] broadcasts onto the normalized dims of X [2, 3, 8]: {op} needs one scale element per",
    ),
}


@pytest.mark.parametrize("target", OPS)
@pytest.mark.parametrize("name", NOT_EXPRESSIBLE)
def test_target_skips_what_it_cannot_express(target, name):
    spelling, reason = NOT_EXPRESSIBLE[name]
    case = norm_model(_for_target(spelling, target))
    fused, report = ort_rmsnorm.fuse(case.model, target)
    reason = reason.format(op=OPS[target])
    assert any(reason in entry.reason for entry in report.skipped), report.summary()
    skip_unless_runtime_runs(target)
    for got, want in zip(run_fused(fused, case.feeds), run_unfused(case.model, case.feeds)):
        assert_close_to_unfused(got, want, name)


def test_onnx_target_below_opset_23_skips_unless_upgrade_allowed():
    case = norm_model(Spelling(opset=17))
    fused, report = ort_rmsnorm.fuse(case.model, "onnx")
    assert report.fusions == [] and fused.graph.node == case.model.graph.node
    assert report.skipped[0].reason.startswith("the default opset is 17: RMSNormalization needs opset 23")

    upgraded, report = ort_rmsnorm.fuse(case.model, "onnx", allow_opset_upgrade=True)
    assert [(o.domain, o.version) for o in upgraded.opset_import] == [("", 23)]
    assert len(fused_nodes(upgraded, "RMSNormalization")) == 1
    assert report.notes == ["default opset upgraded from 17 to 23 with onnx.version_converter"]
    check_model(upgraded)
    skip_unless_runtime_runs("onnx")
    assert_close_to_unfused(run_fused(upgraded, case.feeds)[0], run_unfused(case.model, case.feeds)[0])
