"""``--target onnx --convert-opset`` on models that hold onnxruntime's own ops, as onnxruntime-genai's model builder and
onnxruntime's transformer optimizer write them: the default-domain ``SimplifiedLayerNormalization`` (which onnx's
version converter has no schema for), ``com.microsoft.SkipSimplifiedLayerNormalization`` and other contrib ops. The
model is converted; each norm op is converted to ``RMSNormalization`` where that is exact or reported with its reason,
and the model computes what it did."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ort_rmsnorm
from fusion.norm_graphs import assert_close_to_unfused, fused_nodes, run_unfused
from op_models import make_model, skip_unless_runtime_runs
from reference import random_array

D = 16
FLOAT = TensorProto.FLOAT


def _value(name, dims, elem=FLOAT):
    return helper.make_tensor_value_info(name, elem, dims)


def _sln(x, y, name, **attributes):
    return helper.make_node("SimplifiedLayerNormalization", [x, "gamma"], [y], name=name, axis=-1, epsilon=1e-5,
                            **attributes)


def builder_like_model(opset: int = 17) -> onnx.ModelProto:
    """A genai-builder-like decoder: SimplifiedLayerNormalization first, a MatMul, a com.microsoft FastGelu (a contrib
    op that is no norm), SkipSimplifiedLayerNormalization after the residual add, a norm in float16 stash_type
    (which stays), and an If whose then-branch normalizes the outer value with SimplifiedLayerNormalization."""
    rng = np.random.default_rng(0)
    gamma = numpy_helper.from_array((1 + 0.1 * rng.standard_normal(D)).astype(np.float32), "gamma")
    weight = numpy_helper.from_array((rng.standard_normal((D, D)) / 4).astype(np.float32), "weight")
    then_branch = helper.make_graph(
        [_sln("skip_y", "then_y", "branch/norm")], "then", [], [_value("then_y", ["B", "S", D])]
    )
    else_branch = helper.make_graph(
        [helper.make_node("Identity", ["skip_y"], ["else_y"], name="branch/identity")],
        "else", [], [_value("else_y", ["B", "S", D])],
    )
    nodes = [
        _sln("x", "normed", "layers.0/input_layernorm"),
        helper.make_node("MatMul", ["normed", "weight"], ["projected"], name="layers.0/proj"),
        helper.make_node("FastGelu", ["projected"], ["activated"], name="layers.0/gelu", domain="com.microsoft"),
        helper.make_node("SkipSimplifiedLayerNormalization", ["activated", "x", "gamma"],
                         ["skip_y", "", "", "residual"], name="layers.0/post_layernorm", domain="com.microsoft",
                         epsilon=1e-5),
        _sln("residual", "stashed", "layers.0/float16_stash", stash_type=10),
        helper.make_node("If", ["cond"], ["branched"], name="layers.1/if", then_branch=then_branch,
                         else_branch=else_branch),
    ]
    graph = helper.make_graph(
        nodes, "decoder", [_value("cond", [], TensorProto.BOOL), _value("x", ["B", "S", D])],
        [_value("branched", ["B", "S", D]), _value("stashed", ["B", "S", D]), _value("residual", ["B", "S", D])],
        [gamma, weight],
    )
    return make_model(graph, [helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)])


def test_onnxruntime_ops_are_set_aside_and_the_norms_converted(rng):
    model = builder_like_model()
    # What onnx's converter alone says (onnx 1.18: an IndexError from its C++ map lookup).
    with pytest.raises(Exception, match="SimplifiedLayerNormalization|_Map_base::at"):
        onnx.version_converter.convert_version(model, 23)

    fused, report = ort_rmsnorm.fuse(model, "onnx", allow_opset_upgrade=True)

    assert {(o.domain, o.version) for o in fused.opset_import} == {("", 23), ("com.microsoft", 1)}
    assert report.notes[0] == "default opset upgraded from 17 to 23 with onnx.version_converter"
    assert report.notes[1].startswith(
        "onnx's version converter has no schema for 3 x SimplifiedLayerNormalization (default-domain ops of "
        "onnxruntime, which defines them at every opset): set aside while it converted the model, then restored "
        "unchanged ('layers.0/input_layernorm', 'layers.0/float16_stash', 'branch/norm')"
    ), report.notes
    # Per node: the two float32 norms converted (one in the If branch), the float16-stash one and the skip op left.
    converted = {(f.location, f.converted_from, f.op_type) for f in report.fusions}
    assert converted == {
        ("main graph", "SimplifiedLayerNormalization", "RMSNormalization"),
        ("If 'layers.1/if'.then_branch", "SimplifiedLayerNormalization", "RMSNormalization"),
    }
    reasons = {tuple(s.nodes): s.reason for s in report.skipped}
    assert reasons == {
        ("layers.0/float16_stash",): "SimplifiedLayerNormalization 'layers.0/float16_stash' computes in stash_type "
                                     "10, not float32",
        ("layers.0/post_layernorm",): "com.microsoft.SkipSimplifiedLayerNormalization 'layers.0/post_layernorm' "
                                      "stays: the onnx target has no residual norm op",
    }
    ops = [(node.domain, node.op_type) for node in fused.graph.node]
    assert ops == [("", "RMSNormalization"), ("", "MatMul"), ("com.microsoft", "FastGelu"),
                   ("com.microsoft", "SkipSimplifiedLayerNormalization"), ("", "SimplifiedLayerNormalization"),
                   ("", "If")]
    branches = {attr.name: attr.g for attr in fused.graph.node[-1].attribute}
    assert [n.op_type for n in branches["then_branch"].node] == ["RMSNormalization"]
    assert len(fused_nodes(fused, "SimplifiedLayerNormalization")) == 1

    skip_unless_runtime_runs("onnx")
    for cond in (True, False):
        feeds = {"cond": np.array(cond), "x": random_array(rng, (2, 3, D), np.float32)}
        for got, want in zip(run_unfused(fused, feeds), run_unfused(model, feeds)):
            assert_close_to_unfused(got, want, f"cond={cond}")


def test_a_model_in_the_new_opset_already_is_not_converted():
    model = builder_like_model(opset=23)
    fused, report = ort_rmsnorm.fuse(model, "onnx", allow_opset_upgrade=True)
    assert not any("version converter" in note for note in report.notes)
    assert len(report.fusions) == 2


def test_the_input_model_is_left_as_it_was():
    model = builder_like_model()
    before = model.SerializeToString()
    ort_rmsnorm.fuse(model, "onnx", allow_opset_upgrade=True)
    assert model.SerializeToString() == before


def test_other_converter_failures_still_name_the_model():
    """Only the ops the converter has no schema for are set aside; a model it cannot convert for another reason is
    still refused (model-local functions: it would drop them)."""
    model = builder_like_model()
    model.functions.append(helper.make_function("local", "Unused", ["a"], ["b"],
                                                [helper.make_node("Identity", ["a"], ["b"])],
                                                [helper.make_opsetid("", 17)]))
    with pytest.raises(ValueError, match="model-local functions"):
        ort_rmsnorm.fuse(model, "onnx", allow_opset_upgrade=True)
