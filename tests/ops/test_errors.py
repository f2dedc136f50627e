"""Every error of the operator contract: clear, naming the op, the node and the problem; never a crash."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from op_models import RUNS_EMPTY_MIDDLE_INPUTS, norm_model
from ort_rmsnorm.runtime import make_session, run

# A SkipRMSNorm with a bias and no scale: onnxruntime 1.20-1.23 crash creating its session (op_models).
needs_empty_middle_inputs = pytest.mark.skipif(
    not RUNS_EMPTY_MIDDLE_INPUTS, reason="onnxruntime 1.20-1.23 crash on an empty-named scale before a bias (1.24 does not)")


def _creation_error(model) -> str:
    with pytest.raises(Exception) as info:
        make_session(model)
    return str(info.value)


def _run_error(model, feeds) -> str:
    session = make_session(model)
    with pytest.raises(Exception) as info:
        run(session, feeds)
    return str(info.value)


@pytest.mark.parametrize("skip", [False, True])
def test_axis_out_of_range_at_creation_when_rank_is_static(skip):
    message = _creation_error(norm_model(np.float32, skip=skip, x_shape=("r", 8), attributes={"axis": 2}))
    op = "SkipRMSNorm" if skip else "RMSNorm"
    assert f"{op} node 'norm0': axis 2 is out of range" in message
    assert "valid: -2 to 1" in message


def test_axis_out_of_range_at_run_time_when_rank_is_dynamic():
    message = _run_error(norm_model(np.float32, x_shape=None, attributes={"axis": -3}), {"x": np.ones((2, 4), np.float32)})
    assert "RMSNorm node 'norm0': axis -3 is out of range for X of shape [2, 4]" in message


def test_scalar_input_has_no_axis():
    message = _run_error(norm_model(np.float32, x_shape=None), {"x": np.array(1.0, np.float32)})
    assert "RMSNorm node 'norm0': X is a scalar; it needs at least one dim to normalize" in message


def test_constant_scale_not_broadcastable_at_creation():
    scale = np.ones(5, np.float32)
    message = _creation_error(norm_model(np.float32, np.float32, x_shape=(2, 8), constant_scale=scale))
    assert "RMSNorm node 'norm0': scale of shape [5] does not broadcast onto the normalized dims [8] of X [2, 8]" in message


@pytest.mark.parametrize(
    "scale_shape,x_shape",
    [((5,), (2, 8)), ((2, 8), (2, 8)), ((3, 1, 8), (2, 8)), ((1, 1, 1, 8), (2, 3, 8))],
    ids=["wrong-dim", "varies-along-rows", "enlarges-rows", "rank-above-x"],
)
def test_input_scale_not_broadcastable_at_run_time(scale_shape, x_shape):
    model = norm_model(np.float32, np.float32, x_shape=None, scale_shape=None)
    # a graph input scale of unknown shape: the check can only happen at run time
    model.graph.input.append(helper.make_tensor_value_info("scale", TensorProto.FLOAT, None))
    model.graph.node[0].input.append("scale")
    message = _run_error(model, {"x": np.ones(x_shape, np.float32), "scale": np.ones(scale_shape, np.float32)})
    shape_text = "[" + ", ".join(map(str, scale_shape)) + "]"
    assert f"RMSNorm node 'norm0': scale of shape {shape_text} does not broadcast" in message
    assert "of X [" + ", ".join(map(str, x_shape)) + "]" in message


def test_skip_of_another_shape():
    model = norm_model(np.float32, skip=True, x_shape=None)
    message = _run_error(model, {"x": np.ones((2, 8), np.float32), "skip": np.ones((1, 8), np.float32)})
    assert "SkipRMSNorm node 'norm0': skip of shape [1, 8] must have the shape of X [2, 8]" in message


@pytest.mark.parametrize("epsilon", [-1e-5, float("nan"), float("inf")], ids=["negative", "nan", "inf"])
def test_invalid_epsilon(epsilon):
    message = _creation_error(norm_model(np.float32, x_shape=(2, 8), attributes={"epsilon": epsilon}))
    assert "RMSNorm node 'norm0': attribute 'epsilon' must be finite and >= 0" in message


def test_eps_outside_sqrt_must_be_0_or_1():
    message = _creation_error(norm_model(np.float32, x_shape=(2, 8), attributes={"eps_outside_sqrt": 2}))
    assert "attribute 'eps_outside_sqrt' must be 0 or 1, got 2" in message


@pytest.mark.parametrize("value", [2, -1])
def test_normalize_float32_sum_must_be_0_or_1(value):
    model = norm_model(np.float16, skip=True, x_shape=(2, 8), attributes={"normalize_float32_sum": value})
    message = _creation_error(model)
    assert f"SkipRMSNorm node 'norm0': attribute 'normalize_float32_sum' must be 0 or 1, got {value}" in message


def test_normalize_float32_sum_is_skiprmsnorms():
    message = _creation_error(norm_model(np.float32, x_shape=(2, 8), attributes={"normalize_float32_sum": 1}))
    assert "RMSNorm node 'norm0': attribute 'normalize_float32_sum' is SkipRMSNorm's" in message


@needs_empty_middle_inputs
def test_constant_bias_not_broadcastable_at_creation():
    model = norm_model(np.float32, skip=True, x_shape=(2, 8), constant_bias=np.ones(5, np.float32))
    message = _creation_error(model)
    assert ("SkipRMSNorm node 'norm0': bias of shape [5] does not broadcast onto the normalized dims [8] of X [2, 8]"
            in message)


@needs_empty_middle_inputs
@pytest.mark.parametrize("bias_shape", [(5,), (2, 8), (1, 1, 8)], ids=["wrong-dim", "varies-along-rows", "rank-above-x"])
def test_input_bias_not_broadcastable_at_run_time(bias_shape):
    model = norm_model(np.float32, skip=True, x_shape=None)
    model.graph.input.append(helper.make_tensor_value_info("bias", TensorProto.FLOAT, None))
    model.graph.node[0].input.extend(["", "bias"])
    x = np.ones((2, 8), np.float32)
    message = _run_error(model, {"x": x, "skip": x, "bias": np.ones(bias_shape, np.float32)})
    shape_text = "[" + ", ".join(map(str, bias_shape)) + "]"
    assert f"SkipRMSNorm node 'norm0': bias of shape {shape_text} does not broadcast" in message
    assert "of X [2, 8]" in message


@needs_empty_middle_inputs
@pytest.mark.parametrize("bias_type", [TensorProto.FLOAT, TensorProto.BFLOAT16], ids=["float32", "bfloat16"])
def test_bias_of_another_type_than_x_names_the_node(bias_type):
    """The bias has X's type (no float32 overload, unlike the scale): onnxruntime refuses others at creation."""
    model = norm_model(np.float16, skip=True, x_shape=(2, 8))
    model.graph.input.append(helper.make_tensor_value_info("bias", bias_type, [8]))
    model.graph.node[0].input.extend(["", "bias"])
    message = _creation_error(model)
    assert "norm0" in message and "no kernel def matches node inputs for Op: SkipRMSNorm" in message


@pytest.mark.parametrize(
    "attributes,expected",
    [
        ({"axis": -1.0}, "attribute 'axis' must be an int, got a float"),
        ({"epsilon": 1}, "attribute 'epsilon' must be a float, got an int"),
        ({"eps_outside_sqrt": 1.0}, "attribute 'eps_outside_sqrt' must be an int (0 or 1), got a float"),
        ({"axis": [1, 2]}, "attribute 'axis' must be an int, got another type"),
        ({"epsilon": "1e-5"}, "attribute 'epsilon' must be a float, got another type"),
        ({"normalize_float32_sum": 1.0}, "attribute 'normalize_float32_sum' must be an int (0 or 1), got a float"),
    ],
)
def test_attribute_of_the_wrong_type(attributes, expected):
    skip = "normalize_float32_sum" in attributes  # SkipRMSNorm's
    assert expected in _creation_error(norm_model(np.float32, skip=skip, x_shape=(2, 8), attributes=attributes))


def test_unsupported_type_pair_names_the_node():
    """float16 X with a bfloat16 scale is no overload: onnxruntime refuses it at session creation."""
    model = norm_model(np.float16, x_shape=(2, 8))
    model.graph.input.append(helper.make_tensor_value_info("scale", TensorProto.BFLOAT16, [8]))
    model.graph.node[0].input.append("scale")
    message = _creation_error(model)
    assert "norm0" in message and "no kernel def matches node inputs for Op: RMSNorm" in message


def test_unnamed_node():
    model = norm_model(np.float32, x_shape=(2, 8), attributes={"axis": 5}, node_name="")
    assert "RMSNorm node (unnamed): axis 5 is out of range" in _creation_error(model)


def test_errors_do_not_poison_the_session():
    """A failed run leaves the session usable."""
    model = norm_model(np.float32, skip=True, x_shape=None)
    session = make_session(model)
    with pytest.raises(Exception):
        run(session, {"x": np.ones((2, 8), np.float32), "skip": np.ones((3, 8), np.float32)})
    y, = run(session, {"x": np.ones((2, 8), np.float32), "skip": np.ones((2, 8), np.float32)})
    np.testing.assert_allclose(y, 1.0, rtol=1e-5)
