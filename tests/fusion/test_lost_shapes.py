"""Residual adds whose operands' stored shapes a tool renamed or dropped (onnxsim, float16 converters write
``[unk__20, unk__21, 64]``): the pass proves from the graph itself (onnxruntime's symbolic shape inference) that the two
operands have one shape, and still refuses an Add that may broadcast."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import ort_rmsnorm
from fusion.norm_graphs import fused_nodes, run_fused, run_unfused
from op_models import make_model
from reference import random_array

HIDDEN = 8


def _model(second: list, renamed: list) -> object:
    """x + second(x) -> SimplifiedLayerNormalization, with ``second``'s stored shape replaced by ``renamed``."""
    weight = numpy_helper.from_array(np.eye(HIDDEN, dtype=np.float32) * 0.5, "W")
    gamma = numpy_helper.from_array((1.0 + 0.1 * np.arange(HIDDEN)).astype(np.float32), "gamma")
    nodes = [*second, helper.make_node("Add", ["x", "second"], ["sum"], name="residual"),
             helper.make_node("SimplifiedLayerNormalization", ["sum", "gamma"], ["y"], name="norm", axis=-1,
                              epsilon=1e-5)]
    graph = helper.make_graph(
        nodes, "lost", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", HIDDEN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [weight, gamma, numpy_helper.from_array(np.array([0], np.int64), "zero"),
         numpy_helper.from_array(np.array([1], np.int64), "one")],
        value_info=[helper.make_tensor_value_info("second", TensorProto.FLOAT, renamed)],
    )
    return make_model(graph, [helper.make_opsetid("", 18)])


def test_renamed_shapes_of_one_shape_fuse(rng):
    model = _model([helper.make_node("MatMul", ["x", "W"], ["second"], name="project")], ["unk__1", "unk__2", HIDDEN])
    fused, report = ort_rmsnorm.fuse(model)
    assert len(fused_nodes(fused, "SkipRMSNorm")) == 1 and not report.skipped, report.summary()
    feeds = {"x": random_array(rng, (2, 3, HIDDEN), np.float32)}
    assert np.allclose(run_fused(fused, feeds)[0], run_unfused(model, feeds)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("renamed", [["unk__1", "unk__2", HIDDEN], None])
def test_an_add_that_broadcasts_stays(renamed):
    """x[:, :1] + x broadcasts over the sequence: whatever the stored shape says, it is no residual add."""
    second = [helper.make_node("Slice", ["x", "zero", "one", "one"], ["second"], name="first_token")]
    model = _model(second, renamed if renamed is not None else ["batch", "sequence", HIDDEN])
    if renamed is None:  # the stored shape dropped altogether
        del model.graph.value_info[:]
    fused, report = ort_rmsnorm.fuse(model)
    assert not fused_nodes(fused, "SkipRMSNorm") and len(fused_nodes(fused, "RMSNorm")) == 1, report.summary()
    (entry,) = report.skipped
    assert "is not known to add two tensors of one shape" in entry.reason, entry.reason
