"""onnxruntime's symbolic shape inference saves a model it cannot complete as sym_shape_infer_temp.onnx in the working
directory before raising: run through the package (the pass's second opinion on shapes, infer_symbolic_shapes), it
leaves nothing there, and a file of that name that was there before is left alone."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

import ort_rmsnorm
from ort_rmsnorm.model import types as model_types

pytest.importorskip("onnxruntime.tools.symbolic_shape_infer")


def _incomplete_model() -> onnx.ModelProto:
    """An op no inference knows feeds the output: symbolic inference cannot complete the shapes."""
    graph = helper.make_graph(
        [helper.make_node("Unknown", ["x"], ["u"], domain="test.unknown"), helper.make_node("Relu", ["u"], ["y"])],
        "incomplete", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("test.unknown", 1)])


def test_the_pass_leaves_no_temporary(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shapes, why = model_types._symbolic_shapes(_incomplete_model(), {})
    assert shapes == {} and "Incomplete symbolic shape inference" in why, why
    assert list(tmp_path.iterdir()) == []


def test_infer_symbolic_shapes_leaves_no_temporary(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(Exception, match="Incomplete symbolic shape inference"):
        ort_rmsnorm.infer_symbolic_shapes(_incomplete_model())
    assert list(tmp_path.iterdir()) == []


def test_a_file_there_before_is_not_removed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / model_types.SYMBOLIC_LEFTOVERS[0]).write_text("the user's")
    model_types._symbolic_shapes(_incomplete_model(), {})
    assert [path.name for path in tmp_path.iterdir()] == [model_types.SYMBOLIC_LEFTOVERS[0]]
