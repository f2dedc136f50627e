"""Hostile shapes found by the adversarial harness (tests/adversarial, docs/robustness.md): element counts that
overflow, empty tensors with huge dims, declared rows too large to expand at creation. Each gets a clean error
naming the node, or the contract's result; never an allocation sized from an unchecked product."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto

from op_models import RUNS_EMPTY_MIDDLE_INPUTS, norm_model
from ort_rmsnorm.runtime import make_session, run
from reference import assert_matches_reference, random_array, rmsnorm


def _creation_error(model) -> str:
    with pytest.raises(Exception) as info:
        make_session(model)
    return str(info.value)


def _run_empty(session, shapes: dict) -> list:
    """Runs `session` on uninitialized empty tensors of `shapes` (numpy cannot make them: the other dims overflow)."""
    feeds = {name: ort.OrtValue.ortvalue_from_shape_and_type(list(shape), TensorProto.FLOAT)
             for name, shape in shapes.items()}
    return [value.shape() for value in session.run_with_ort_values(None, feeds)]


@pytest.mark.parametrize("skip", [False, True])
@pytest.mark.parametrize("x_shape", [(2**32, 2**32), (3, 2**62, 4), (2**63 - 1, 2)], ids=["2^64", "3*2^64", "2^64-2"])
def test_declared_element_count_beyond_int64_at_creation(skip, x_shape):
    message = _creation_error(norm_model(np.float32, skip=skip, x_shape=x_shape, attributes={"axis": -1}))
    op = "SkipRMSNorm" if skip else "RMSNorm"
    shape_text = "[" + ", ".join(map(str, x_shape)) + "]"
    assert f"{op} node 'norm0': X of shape {shape_text} has more elements than a 64-bit count holds" in message


@pytest.mark.parametrize("axis", [-1, -2, 1])
def test_declared_dynamic_rows_with_huge_normalized_dims_create(axis):
    """With a dynamic dim the count is unknown (it may be 0 at run time): no error, and no overflow."""
    model = norm_model(np.float32, x_shape=("rows", 2**62, 3), attributes={"axis": axis})
    assert _run_empty(make_session(model), {"x": (0, 2**62, 3)}) == [[0, 2**62, 3]]


@pytest.mark.parametrize("x_shape", [(0, 2**40), (0, 2**62, 3), (2**61, 3, 0)], ids=["2^40", "3*2^62", "zero-last"])
@pytest.mark.parametrize("constant", [False, True], ids=["scale-input", "scale-constant"])
def test_empty_x_with_huge_dims_and_a_broadcast_scale(x_shape, constant):
    """An empty X reads no scale: nothing is sized from its (possibly overflowing) normalized dims."""
    scale = np.full((1, 1), 2.0, np.float32)
    if constant:
        model = norm_model(np.float32, np.float32, x_shape=None, constant_scale=scale, attributes={"axis": 1})
    else:
        model = norm_model(np.float32, np.float32, x_shape=None, scale_shape=(1, 1), attributes={"axis": 1})
    feeds = {"x": ort.OrtValue.ortvalue_from_shape_and_type(list(x_shape), TensorProto.FLOAT)}
    if not constant:
        feeds["scale"] = ort.OrtValue.ortvalue_from_numpy(scale)
    outputs = make_session(model).run_with_ort_values(None, feeds)
    assert [value.shape() for value in outputs] == [list(x_shape)]


@pytest.mark.skipif(not RUNS_EMPTY_MIDDLE_INPUTS,
                    reason="onnxruntime 1.20-1.23 crash on an empty-named scale before a bias (1.24 does not)")
def test_empty_skiprmsnorm_with_huge_dims_and_a_broadcast_bias():
    model = norm_model(np.float32, skip=True, sum_output=True, x_shape=None, constant_bias=np.ones(1, np.float32),
                       attributes={"axis": -2})
    shape = (0, 2**62, 3)
    assert _run_empty(make_session(model), {"x": shape, "skip": shape}) == [list(shape), list(shape)]


@pytest.mark.parametrize("cols", [2**40, 2**62])
def test_constant_scale_over_huge_declared_rows_is_not_expanded_at_creation(cols):
    """The declared shape is not a tensor: a broadcast constant is expanded per call for rows this large."""
    model = norm_model(np.float32, np.float32, x_shape=("rows", cols), constant_scale=np.ones(1, np.float32))
    assert _run_empty(make_session(model), {"x": (0, cols)}) == [[0, cols]]


def test_constant_scale_broadcast_after_a_declared_shape_still_matches_the_reference(rng):
    """The same model with a row the size of a real tensor: the broadcast constant is applied."""
    scale = random_array(rng, (1, 1), np.float32)
    model = norm_model(np.float32, np.float32, x_shape=("rows", 3, 5), constant_scale=scale, attributes={"axis": -2})
    x = random_array(rng, (4, 3, 5), np.float32)
    y, = run(make_session(model), {"x": x})
    expected, _ = rmsnorm(x, scale, axis=-2)
    assert_matches_reference(y, expected, np.float32, "y")
