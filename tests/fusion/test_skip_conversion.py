"""onnxruntime's com.microsoft.SkipSimplifiedLayerNormalization (onnxruntime-genai's model builder, the transformer
optimizer and Olive write it) converted to SkipRMSNorm exactly: the same float32 sum normalized (for 16-bit types
before it is rounded: ``normalize_float32_sum=1``), the same rounded ``sum`` output, its bias and its own epsilon
default; chains of such ops stay exact; what cannot be converted, and every norm op left for another target, is in the
report with the reason."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import ort_rmsnorm
from fusion.norm_graphs import DTYPES, ONNX_TYPES, attribute, fused_nodes, run_fused, run_unfused
from op_models import make_model, tensor_proto
from reference import assert_matches_reference, random_array, rmsnorm

HIDDEN = 32
SHAPE = ["batch", "sequence", HIDDEN]
RUN_SHAPE = (2, 5, HIDDEN)
SSLN = "com.microsoft.SkipSimplifiedLayerNormalization"
ORT_SKIP_DEFAULT_EPSILON = 1e-12


def _ssln(inputs, outputs, name, epsilon):
    attributes = {} if epsilon is None else {"epsilon": epsilon}
    return helper.make_node("SkipSimplifiedLayerNormalization", inputs, outputs, name=name, domain="com.microsoft",
                            **attributes)


def _model(dtype: str, *, bias: bool = False, with_sum: bool = True, epsilon=1e-5, chain: bool = False,
           mean_output: bool = False, skip_shape=None, rng):
    """a, b -> SSLN(a, b, gamma[, bias]) -> y (and sum; with ``chain`` a second SSLN reads the first's sum)."""
    np_dtype = DTYPES[dtype]
    gamma = (1.0 + 0.2 * rng.standard_normal(HIDDEN)).astype(np_dtype)
    initializers = [tensor_proto("gamma", gamma)]
    inputs = ["a", "b", "gamma"]
    values = {"gamma": gamma}
    if bias:
        values["bias"] = (0.5 * rng.standard_normal(HIDDEN)).astype(np_dtype)
        initializers.append(tensor_proto("bias", values["bias"]))
        inputs.append("bias")
    outputs = ["y", "mean" if mean_output else "", "", "sum"] if with_sum or chain else ["y"]
    nodes = [_ssln(inputs, outputs, "/model/layers.0/post_attention_layernorm/SkipLayerNorm", epsilon)]
    graph_outputs = ["y"] + (["sum"] if with_sum and not chain else []) + (["mean"] if mean_output else [])
    if chain:
        nodes.append(_ssln(["y", "sum", "gamma"], ["y2", "", "", "sum2"], "/model/layers.1/input_layernorm/SkipLayerNorm",
                           epsilon))
        graph_outputs = ["y2", "sum2"]
    t = ONNX_TYPES[np_dtype]
    graph = helper.make_graph(
        nodes, "ssln",
        [helper.make_tensor_value_info("a", t, SHAPE),
         helper.make_tensor_value_info("b", t, skip_shape if skip_shape is not None else SHAPE)],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT if name == "mean" else t, None)
         for name in graph_outputs],
        initializers,
    )
    model = make_model(graph, [helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])
    feed_shape = tuple(dim if isinstance(dim, int) else RUN_SHAPE[index] for index, dim in
                       enumerate(skip_shape)) if skip_shape is not None else RUN_SHAPE
    feeds = {"a": random_array(rng, RUN_SHAPE, np_dtype), "b": random_array(rng, feed_shape, np_dtype)}
    return model, values, feeds


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("with_sum", [True, False], ids=["with-sum", "without-sum"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_converted_exactly(dtype, with_sum, bias, rng):
    model, values, feeds = _model(dtype, bias=bias, with_sum=with_sum, rng=rng)
    fused, report = ort_rmsnorm.fuse(model)
    (node,) = fused_nodes(fused, "SkipRMSNorm")
    assert not fused_nodes(fused, "SkipSimplifiedLayerNormalization") and not report.skipped, report.summary()
    (fusion,) = report.fusions
    assert fusion.converted_from == SSLN and fusion.skip and fusion.roundings == []
    assert fusion.op_type == "ort_rmsnorm.SkipRMSNorm" and fusion.epsilon == pytest.approx(1e-5)
    assert node.name == "/model/layers.0/post_attention_layernorm/SkipRMSNorm"
    sixteen_bit = dtype != "float32"
    assert attribute(node, "normalize_float32_sum") == (1 if sixteen_bit else None)
    assert len(node.input) == (4 if bias else 3) and len(node.output) == (2 if with_sum else 1)

    outputs = run_fused(fused, feeds)
    expected, h = rmsnorm(feeds["a"], values["gamma"], epsilon=np.float32(1e-5), skip=feeds["b"],
                          bias=values.get("bias"), normalize_float32_sum=True)
    assert_matches_reference(outputs[0], expected, DTYPES[dtype])
    originals = run_unfused(model, feeds)  # onnxruntime's own op
    if with_sum:
        assert np.array_equal(outputs[1], h) and np.array_equal(outputs[1], originals[1])  # bit for bit
    # onnxruntime rounds its products in another order: a rounding or two of T apart, never more.
    ulp = {"float32": 2.0**-23, "float16": 2.0**-10}[dtype]
    assert np.allclose(outputs[0].astype(np.float64), originals[0].astype(np.float64), rtol=2 * ulp, atol=2 * ulp)


def test_chain_of_converted_ops_matches_onnxruntime(rng):
    """The first op's sum is the second's skip: both convert, and the chain computes what onnxruntime's does."""
    model, values, feeds = _model("float16", chain=True, rng=rng)
    fused, report = ort_rmsnorm.fuse(model)
    assert len(fused_nodes(fused, "SkipRMSNorm")) == 2 and len(report.fusions) == 2, report.summary()
    y2, sum2 = run_fused(fused, feeds)
    want_y2, want_sum2 = run_unfused(model, feeds)
    assert np.array_equal(sum2, want_sum2)
    assert np.allclose(y2.astype(np.float64), want_y2.astype(np.float64), rtol=2.0**-9, atol=2.0**-9)


def test_default_epsilon_is_the_ops_own(rng):
    model, values, feeds = _model("float32", epsilon=None, rng=rng)
    fused, report = ort_rmsnorm.fuse(model)
    (node,) = fused_nodes(fused, "SkipRMSNorm")
    assert attribute(node, "epsilon") == pytest.approx(ORT_SKIP_DEFAULT_EPSILON)
    expected, _ = rmsnorm(feeds["a"], values["gamma"], epsilon=np.float32(ORT_SKIP_DEFAULT_EPSILON), skip=feeds["b"])
    assert_matches_reference(run_fused(fused, feeds)[0], expected, np.float32)


def test_statistics_in_use_stay(rng):
    model, _, _ = _model("float32", mean_output=True, rng=rng)
    fused, report = ort_rmsnorm.fuse(model)
    assert not fused_nodes(fused, "SkipRMSNorm") and len(fused_nodes(fused, "SkipSimplifiedLayerNormalization")) == 1
    (entry,) = report.skipped
    assert entry.rule == f"Convert[{SSLN}]" and "mean or inv_std_var output is in use" in entry.reason


def test_bias_with_a_gamma_of_ones_stays(rng):
    """A gamma of ones (ConstantOfShape) is dropped from a converted norm; with a bias that would leave SkipRMSNorm's
    scale empty before its bias, a node onnxruntime 1.20-1.23 crash on (docs/ops.md): not converted, and said so."""
    model, _, _ = _model("float32", bias=True, rng=rng)
    graph = model.graph
    del graph.initializer[0]  # gamma
    one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
    graph.node.insert(0, helper.make_node("Shape", ["a"], ["a_shape"]))
    graph.node.insert(1, helper.make_node("ConstantOfShape", ["a_shape"], ["gamma"], value=one))
    fused, report = ort_rmsnorm.fuse(model)
    assert not fused_nodes(fused, "SkipRMSNorm") and len(fused_nodes(fused, "SkipSimplifiedLayerNormalization")) == 1
    (entry,) = report.skipped
    assert "a bias with a gamma of ones" in entry.reason and "1.20 to 1.23" in entry.reason, entry.reason


def test_broadcast_skip_stays(rng):
    model, _, _ = _model("float32", skip_shape=[1, "sequence", HIDDEN], rng=rng)
    fused, report = ort_rmsnorm.fuse(model)
    assert not fused_nodes(fused, "SkipRMSNorm")
    (entry,) = report.skipped
    assert "is not known to have the input's shape" in entry.reason, entry.reason


@pytest.mark.parametrize("target, reason", [("onnx", "stays: the onnx target has no residual norm op"), ("ort", None)])
def test_other_targets_leave_it_and_say_so(target, reason, rng):
    model, _, _ = _model("float32", rng=rng)
    model.opset_import[0].version = 23
    fused, report = ort_rmsnorm.fuse(model, target)
    assert len(fused_nodes(fused, "SkipSimplifiedLayerNormalization")) == 1 and not report.fusions
    if reason is None:  # the ort target's own op: nothing to say
        assert not report.skipped, report.summary()
    else:
        (entry,) = report.skipped
        assert reason in entry.reason and entry.nodes == ["/model/layers.0/post_attention_layernorm/SkipLayerNorm"]
