"""SkipRMSNorm with normalize_float32_sum = 1 computes what onnxruntime's own com.microsoft.SkipSimplifiedLayerNormalization
computes, with and without its bias: run side by side on the same data, for several hidden sizes, with skips small
against x so that rounding the sum to T first would change many outputs.

Both are measured against the float64 reference of the float32-sum semantics (tests/reference.py) with the op's
documented tolerance; their `sum` outputs (round_T(x + skip + bias)) must be the same bits. With
normalize_float32_sum = 0 the same data must leave that tolerance: the attribute is what makes the two agree.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

from op_models import ONNX_TYPE, make_model, norm_model, tensor_proto
from ort_rmsnorm.runtime import make_session, run
from reference import BFLOAT16, assert_matches_reference, random_array, rmsnorm, tolerance

DTYPES = [np.dtype(np.float32), np.dtype(np.float16), BFLOAT16]
EPSILON = 1e-5


def _onnxruntime_model(dtype, hidden, gamma, bias):
    """SkipSimplifiedLayerNormalization(x, skip, gamma[, bias]) -> (y, mean, inv_std_var, sum), mean and inv_std_var
    omitted, as onnxruntime's transformer optimizer and onnxruntime-genai write it."""
    elem = ONNX_TYPE[dtype]
    initializers = [tensor_proto("gamma", gamma)] + ([tensor_proto("bias", bias)] if bias is not None else [])
    node = helper.make_node(
        "SkipSimplifiedLayerNormalization", ["x", "skip", "gamma"] + (["bias"] if bias is not None else []),
        ["y", "", "", "sum"], domain="com.microsoft", epsilon=EPSILON, name="ort_norm",
    )
    graph = helper.make_graph(
        [node], "ort_skip", [helper.make_tensor_value_info(name, elem, ["r", hidden]) for name in ("x", "skip")],
        [helper.make_tensor_value_info(name, elem, ["r", hidden]) for name in ("y", "sum")], initializer=initializers,
    )
    return make_model(graph, [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])


def _onnxruntime_session(model):
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    try:
        return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as error:  # an older onnxruntime without this type's CPU kernel, or (1.20) in its schema
        text = str(error)
        if "NOT_IMPLEMENTED" in text or "Could not find an implementation" in text or (
                "INVALID_GRAPH" in text and "Type 'tensor(bfloat16)'" in text):
            pytest.skip(f"onnxruntime {ort.__version__} has no CPU SkipSimplifiedLayerNormalization for this type")
        raise


def _ours(dtype, gamma, bias, float32_sum):
    model = norm_model(dtype, skip=True, sum_output=True, x_shape=("r", gamma.shape[0]), constant_scale=gamma,
                       constant_bias=bias, attributes={"epsilon": EPSILON, "normalize_float32_sum": float32_sum})
    return make_session(model)


# float32 up to 4096: onnxruntime sums the squares in a single float32 accumulator, whose error grows with the row
# (at 16384 it leaves the op's float32 tolerance; ours adds float32 partial sums of at most 32 terms in float64).
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("hidden", [64, 1000, 4096])
@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
def test_matches_onnxruntime_skip_simplified_layer_normalization(rng, dtype, hidden, with_bias):
    gamma = rng.uniform(0.5, 1.5, hidden).astype(np.float32).astype(dtype)
    bias = rng.standard_normal(hidden).astype(np.float32).astype(dtype) if with_bias else None
    theirs = _onnxruntime_session(_onnxruntime_model(dtype, hidden, gamma, bias))
    ours = _ours(dtype, gamma, bias, 1)
    x = random_array(rng, (6, hidden), dtype)
    skip = random_array(rng, (6, hidden), dtype, magnitude=1 / 64)
    feeds = {"x": x, "skip": skip}
    their_y, their_sum = run(theirs, feeds)
    our_y, our_sum = run(ours, feeds)

    expected, expected_sum = rmsnorm(x, gamma, epsilon=EPSILON, skip=skip, bias=bias, normalize_float32_sum=True)
    np.testing.assert_array_equal(our_sum.view(np.uint8), their_sum.view(np.uint8), err_msg="sum outputs")
    np.testing.assert_array_equal(our_sum.view(np.uint8), expected_sum.view(np.uint8), err_msg="sum = round_T(s)")
    assert_matches_reference(our_y, expected, dtype, "SkipRMSNorm(normalize_float32_sum=1)")
    assert_matches_reference(their_y, expected, dtype, "SkipSimplifiedLayerNormalization")
    # Each within the tolerance of the reference, so within twice it of each other; mostly the same bits.
    rtol, atol = tolerance(dtype)
    ours64, theirs64 = our_y.astype(np.float64), their_y.astype(np.float64)
    assert np.all(np.abs(ours64 - theirs64) <= 2 * (atol + rtol * np.abs(theirs64)))

    if dtype != np.float32:  # for float32 the two settings are the same computation
        rounded_y, _ = run(_ours(dtype, gamma, bias, 0), feeds)
        rounded_expected, _ = rmsnorm(x, gamma, epsilon=EPSILON, skip=skip, bias=bias)
        assert_matches_reference(rounded_y, rounded_expected, dtype, "SkipRMSNorm(normalize_float32_sum=0)")
        with pytest.raises(AssertionError, match="outside tolerance"):
            assert_matches_reference(rounded_y, expected, dtype, "normalize_float32_sum=0 vs the float32 sum")
        with pytest.raises(AssertionError, match="outside tolerance"):
            assert_matches_reference(their_y, rounded_expected, dtype, "onnxruntime vs the rounded sum")
