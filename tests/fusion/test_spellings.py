"""Every spelling of a decomposed RMSNorm fuses into one ``ort_rmsnorm.RMSNorm`` with exactly its semantics.

Each case checks the fused node's attributes (axis, epsilon, placement) and scale against the spelling (not against
what the pass says), that nothing of the decomposition is left and the unrelated node is untouched, onnx.checker,
the output against the unfused model in onnxruntime (optimizations off) and against numpy float64, and that a second
run changes nothing.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import ort_rmsnorm
from fusion.norm_graphs import (
    Spelling,
    assert_close_to_unfused,
    assert_matches_float64,
    attribute,
    check_model,
    fused_nodes,
    norm_model,
    run_fused,
    run_unfused,
    scale_array,
)

STATIC = {"shape": (2, 3, 8), "run_shape": (2, 3, 8)}

SPELLINGS = {
    "base": Spelling(),
    "pow-int-exponent": Spelling(square="pow_int"),
    "pow-1-element-exponent": Spelling(square="pow_1elem"),
    "mul-square": Spelling(square="mul"),
    "opset17-axes-attribute": Spelling(opset=17),
    "keepdims-explicit": Spelling(keepdims="explicit"),
    "positive-axis": Spelling(axes=(2,)),
    "two-axes": Spelling(axes=(-2, -1), **STATIC),
    "two-axes-reversed-positive": Spelling(axes=(2, 1), **STATIC),
    "two-axes-opset17": Spelling(axes=(-1, -2), opset=17, **STATIC),
    "all-axes-of-rank-2": Spelling(axes=(0, 1), shape=(3, 8), run_shape=(3, 8)),
    "sum-div": Spelling(mean="sum_div"),
    "sum-mul-reciprocal-count": Spelling(mean="sum_mul"),
    "sum-div-opset12-axes-attribute": Spelling(mean="sum_div", opset=12),
    "sumsquare-div": Spelling(mean="sumsq_div"),
    "sumsquare-mul-two-axes": Spelling(mean="sumsq_mul", axes=(-2, -1), **STATIC),
    "eps-first": Spelling(eps="add_swapped"),
    "eps-constant-node": Spelling(eps="constant_node"),
    "eps-castlike": Spelling(eps="castlike"),
    "eps-outside-sqrt": Spelling(eps="outside"),
    "no-eps": Spelling(eps="none"),
    "div": Spelling(inverse="div"),
    "reciprocal-first": Spelling(inverse="reciprocal_swapped"),
    "mul-div-one": Spelling(inverse="div_one"),
    "pow-minus-half": Spelling(inverse="pow_half"),
    "pow-minus-half-no-eps": Spelling(inverse="pow_half", eps="none"),
    "torchscript-opset17": Spelling(opset=17, inverse="div_one", eps="constant_node", square="pow"),
    "no-scale": Spelling(scale="none"),
    "scale-first": Spelling(scale="mul_swapped"),
    "scale-1-element": Spelling(scale_shape=(1,)),
    "scale-scalar": Spelling(scale_shape=()),
    "scale-leading-ones": Spelling(scale_shape=(1, 1, 8)),
    "scale-two-axes-broadcast": Spelling(axes=(-2, -1), scale_shape=(3, 1), **STATIC),
    "one-plus-w-folded": Spelling(scale="one_plus"),
    "one-plus-w-runtime": Spelling(scale="one_plus_runtime"),
    "scale-cast": Spelling(scale="cast"),
    "hf-float32-no-op-cast": Spelling(upcast=True, scale="mul_swapped"),
    "hf-float16": Spelling(dtype="float16", upcast=True, scale="mul_swapped"),
    "hf-bfloat16": Spelling(dtype="bfloat16", upcast=True, scale="mul_swapped"),
    "hf-float16-cast-scale": Spelling(dtype="float16", upcast=True, scale="cast"),
    "t5-torchscript-two-casts": Spelling(dtype="float16", upcast=True, separate_casts=True, inverse="div_one"),
    "float16-without-upcast": Spelling(dtype="float16"),
    "float16-upcast-output-float32": Spelling(dtype="float16", upcast=True, cast_back=False),
    "float16-upcast-no-scale": Spelling(dtype="float16", upcast=True, scale="none"),
    "gemma-float16-scale-then-cast": Spelling(dtype="float16", upcast=True, scale="cast_after"),
    "gemma-bfloat16-one-plus-then-cast": Spelling(dtype="bfloat16", upcast=True, scale="cast_after"),
    "keepdims-0-single-row": Spelling(keepdims="zero", shape=(1, 8), run_shape=(1, 8)),
    "keepdims-0-rank-1": Spelling(keepdims="zero", shape=(8,), run_shape=(8,)),
    "rank-4": Spelling(shape=("B", 2, 3, 8), run_shape=(2, 2, 3, 8), axes=(-1,)),
    "rank-2": Spelling(shape=("N", 8), run_shape=(5, 8)),
    # TensorFlow (tf2onnx): its graph optimizer multiplies a constant scale into the inverse first, x * (r * w), and
    # tf2onnx writes a last-axis mean of a rank-3 float tensor at opset < 18 as GlobalAveragePool.
    "tf-keras-opset17": Spelling(square="mul", mean="global_average_pool", factor="inverse_first", opset=17),
    "tf-keras-opset18": Spelling(square="mul", factor="inverse_first"),
    "tf-factor-scale-first": Spelling(factor="scale_first"),
    "tf-factor-x-last": Spelling(factor="inverse_first", x_last=True),
    "tf-factor-scale-first-x-last": Spelling(factor="scale_first", x_last=True),
    "tf-factor-scale-graph-input": Spelling(factor="inverse_first", scale="input"),
    "tf-factor-one-plus-w-folded": Spelling(factor="inverse_first", scale="one_plus"),
    "tf-factor-scale-cast": Spelling(factor="inverse_first", scale="cast"),
    "tf-factor-div-one": Spelling(factor="inverse_first", inverse="div_one"),
    "tf-factor-pow-minus-half": Spelling(factor="scale_first", inverse="pow_half"),
    "tf-factor-eps-outside-sqrt": Spelling(factor="inverse_first", eps="outside"),
    "tf-factor-two-axes": Spelling(factor="inverse_first", axes=(-2, -1), **STATIC),
    "tf-factor-float16": Spelling(factor="inverse_first", dtype="float16"),
    "tf-factor-mixed-float16-cast-after": Spelling(factor="inverse_first", dtype="float16", upcast=True),
    "tf-factor-mixed-bfloat16-x-last": Spelling(factor="scale_first", x_last=True, dtype="bfloat16", upcast=True),
    "tf-factor-float32-output": Spelling(factor="inverse_first", dtype="float16", upcast=True, cast_back=False),
    "tf-factor-cast-to-float16": Spelling(factor="inverse_first", dtype="float16", upcast=True, factor_cast=True),
    "global-average-pool-rank-3": Spelling(mean="global_average_pool", opset=17),
    # jax2onnx 0.17: flax's nnx.RMSNorm, and x * jax.lax.rsqrt(jnp.mean(jnp.square(x), -1) + eps) * w (its opset 23
    # spells them as opset 18 does; 18 here, so that the oldest onnxruntime allowed runs them too).
    "jax2onnx-flax-rmsnorm": Spelling(square="mul", eps="castlike_x", inverse="div"),
    "jax2onnx-jnp-rsqrt": Spelling(square="mul", inverse="div_one"),
    "global-average-pool-rank-4-two-axes": Spelling(
        mean="global_average_pool", axes=(-2, -1), shape=("B", 2, 3, 8), run_shape=(2, 2, 3, 8)
    ),
    "global-average-pool-rank-5-three-axes": Spelling(
        mean="global_average_pool", axes=(2, 3, 4), shape=(2, 2, 2, 3, 8), run_shape=(2, 2, 2, 3, 8)
    ),
}


def expected_x_dtype(s: Spelling) -> np.dtype:
    """The fused op's X: the original input, except when the graph's output stayed float32 after an up-cast."""
    return np.dtype(np.float32) if s.upcast and not s.cast_back and not s.factor_cast else s.np_dtype


def expected_ops(s: Spelling) -> list[str]:
    ops = ["Identity", "RMSNorm", "Shape"]  # Identity to the output and the unrelated Shape were there before
    if s.upcast and not s.cast_back and not s.factor_cast:
        ops.append("Cast")  # X is the float32 value: the output was float32
    if s.scale == "one_plus":
        ops.append("Constant")  # 1 + w folded
    if s.scale == "one_plus_runtime":
        ops.append("Add")  # 1 + w of a graph input stays
    if s.scale == "cast":
        ops.append("Cast")  # the scale's cast stays (it rounds, or it is a float32 scale for a float32 Mul)
    return sorted(ops)


@pytest.mark.parametrize("name", SPELLINGS)
def test_spelling_fuses_exactly(name):
    case = norm_model(SPELLINGS[name])
    s = case.spelling
    original = onnx.ModelProto()
    original.CopyFrom(case.model)

    fused, report = ort_rmsnorm.fuse(case.model)

    assert case.model == original, "the input model was modified"
    (node,) = fused_nodes(fused, "RMSNorm")
    assert node.domain == "ort_rmsnorm"
    assert attribute(node, "axis") == -s.normalized
    compute = np.float32 if s.upcast else s.np_dtype
    epsilon = 0.0 if s.eps == "none" else np.float32(np.asarray(s.epsilon, compute))  # as the graph stores it
    assert attribute(node, "epsilon") == epsilon
    assert attribute(node, "eps_outside_sqrt") == int(s.eps == "outside")
    if case.scale is None:
        assert len(node.input) == 1
    elif s.scale == "one_plus_runtime":
        assert len(node.input) == 2  # 1 + w computed at run time, fed as is
    elif s.scale == "input":
        assert list(node.input) == ["x", "w_input"]
    elif s.scale != "cast":
        np.testing.assert_array_equal(
            scale_array(fused, node.input[1]).astype(np.float64), case.scale.astype(np.float64)
        )
    # Structure: nothing of the decomposition is left, the unrelated node is as it was, the op's domain is imported.
    assert sorted(n.op_type for n in fused.graph.node) == expected_ops(s)
    assert [n for n in fused.graph.node if n.name == "unrelated_shape"] == [
        n for n in original.graph.node if n.name == "unrelated_shape"
    ]
    assert {(o.domain, o.version) for o in fused.opset_import} >= {("ort_rmsnorm", 1)}
    if expected_x_dtype(s) == s.np_dtype:
        assert node.input[0] == "x"  # the graph input itself, before any up-cast
    check_model(fused)
    # Report.
    (fusion,) = report.fusions
    assert (fusion.axis, fusion.eps_placement) == (
        -s.normalized,
        {"outside": "outside_sqrt", "none": "none"}.get(s.eps, "inside_sqrt"),
    )
    assert fusion.input_dtype == expected_x_dtype(s).name
    assert report.skipped == []
    # Numerics.
    fused_out = run_fused(fused, case.feeds)
    assert fused_out[0].dtype == expected_x_dtype(s)
    np.testing.assert_array_equal(fused_out[1], case.feeds["x"].shape)
    if s.dtype != "bfloat16":  # onnxruntime's CPU provider has no bfloat16 Mul/Add to run the unfused graph
        unfused = run_unfused(case.model, case.feeds)
        assert_close_to_unfused(fused_out[0], unfused[0], name)
    assert_matches_float64(case, fused_out[0])
    # Idempotent.
    again, second = ort_rmsnorm.fuse(fused)
    assert again == fused and second.fusions == [] and second.skipped == []
