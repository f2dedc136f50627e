"""A norm's scale is fused only where its dims provably match the normalized dims. Where shape inference leaves a
normalized dim unknown, the graph may still prove it: the value's producer (a MatMul by a weight of static dims, a
broadcast with a static operand, a Reshape to a constant shape, ...) or onnxruntime's symbolic shape inference. Where
nothing proves it (a graph input's symbolic dim), the scale stays a Mul after the fused norm: ``Mul(normed,
scale[D])`` alone proves only that the dim is D or 1, and with 1 the graph broadcasts the normalized value to D
columns, which a fused scale would not."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

import ort_rmsnorm
from fusion.norm_graphs import fused_nodes, run_fused, run_unfused
from op_models import ORT_RELEASE, make_model
from ort_rmsnorm.model.types import TypeTable
from ort_rmsnorm.rewrites._facts import Facts, proven_shape
from ort_rmsnorm.runtime import make_session, run
from reference import random_array, rmsnorm

D, K, EPSILON = 64, 32, 1e-6


def _norm_nodes(x: str) -> list[onnx.NodeProto]:
    """The decomposed RMSNorm of x over the last axis, times the [D] scale: x * 1/sqrt(mean(x^2) + eps) * scale."""
    return [
        helper.make_node("Pow", [x, "two"], ["square"], name="square"),
        helper.make_node("ReduceMean", ["square", "last_axis"], ["mean_square"], name="mean", keepdims=1),
        helper.make_node("Add", ["mean_square", "eps"], ["shifted"], name="add_eps"),
        helper.make_node("Sqrt", ["shifted"], ["rms"], name="root"),
        helper.make_node("Reciprocal", ["rms"], ["inverse"], name="inverse"),
        helper.make_node("Mul", [x, "inverse"], ["normed"], name="normalize"),
        helper.make_node("Mul", ["normed", "scale"], ["y"], name="scale_mul"),
    ]


def _norm_constants(rng) -> list[onnx.TensorProto]:
    return [
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        numpy_helper.from_array(np.array([-1], np.int64), "last_axis"),
        numpy_helper.from_array(np.array(EPSILON, np.float32), "eps"),
        numpy_helper.from_array((1.0 + 0.1 * rng.standard_normal(D)).astype(np.float32), "scale"),
    ]


def _projected_model(rng) -> tuple[onnx.ModelProto, np.ndarray]:
    """x [1, 8, K] -> MatMul by a static [K, D] weight -> com.microsoft.FastGelu -> the norm. ONNX's shape inference
    does not know the contrib op: the norm input's shape is only the stored annotation [1, 8, unk__6] (as
    post-processing tools and exporters write it). onnxruntime's symbolic shape inference knows the op and proves
    the last dim D."""
    weight = (rng.standard_normal((K, D)) / np.sqrt(K)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "weight"], ["projected"], name="project"),
        helper.make_node("FastGelu", ["projected"], ["h"], name="activation", domain="com.microsoft"),
        *_norm_nodes("h"),
    ]
    graph = helper.make_graph(
        nodes, "projected", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, D])],
        [numpy_helper.from_array(weight, "weight"), *_norm_constants(rng)],
        value_info=[helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, 8, "unk__6"])],
    )
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]
    return make_model(graph, opsets), weight


@pytest.mark.parametrize("target, op_type", [("custom", "RMSNorm"), ("ort", "SimplifiedLayerNormalization")])
def test_scale_fused_where_the_graph_proves_the_dim(rng, target, op_type):
    if ORT_RELEASE < (1, 21):  # the dim hidden from onnx here is proven by onnxruntime's symbolic inference
        pytest.skip(f"onnxruntime {'.'.join(map(str, ORT_RELEASE))}'s symbolic inference leaves FastGelu's dim unknown")
    model, weight = _projected_model(rng)
    fused, report = ort_rmsnorm.fuse(model, target)

    assert report.skipped == [], report.summary()
    (fusion,) = report.fusions
    assert fusion.scale == "tensor", report.summary()
    (node,) = fused_nodes(fused, op_type)
    assert len(node.input) == 2, "the scale is the fused op's input"
    assert not fused_nodes(fused, "Mul"), "no Mul is left after the fused norm"

    x = random_array(rng, (1, 8, K), np.float32)
    scale = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "scale"))
    p = x.astype(np.float64) @ weight.astype(np.float64)
    h = 0.5 * p * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (p + 0.044715 * p**3)))  # FastGelu's definition
    expected, _ = rmsnorm(h, scale, epsilon=EPSILON)
    (got,) = run_fused(fused, {"x": x})
    # The float32 product and activation round before the norm: their relative error, not only the norm's, counts.
    np.testing.assert_allclose(got.astype(np.float64), expected, rtol=2e-5, atol=1e-6)


def test_scale_stays_where_the_dim_cannot_be_proven(rng):
    """A graph input with a symbolic last dim: fed 1 column, the graph's Mul broadcasts the normalized value to D
    columns, and a fused op taking the scale would not. The norm is fused without its scale, the Mul kept."""
    nodes = _norm_nodes("x")
    graph = helper.make_graph(
        nodes, "open", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, "unk"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], _norm_constants(rng),
    )
    model = make_model(graph, [helper.make_opsetid("", 18)])
    fused, report = ort_rmsnorm.fuse(model)

    (entry,) = report.skipped
    assert entry.reason == (
        "scale of shape [64] on input [1, 8, unk]: cannot prove the scale's dims match the normalized dims"
    )
    (node,) = fused_nodes(fused, "RMSNorm")
    assert len(node.input) == 1 and entry.fused_as == node.name
    assert len(fused_nodes(fused, "Mul")) == 1
    scale = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "scale"))
    for columns in (D, 1):
        x = random_array(rng, (1, 8, columns), np.float32)
        expected, _ = rmsnorm(x, scale, epsilon=EPSILON)  # broadcasts [1, 8, 1] to [1, 8, D]
        (got,) = run_fused(fused, {"x": x})
        assert got.shape == (1, 8, D)
        np.testing.assert_allclose(got.astype(np.float64), expected, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(got, run_unfused(model, {"x": x})[0], rtol=4e-6, atol=1e-7)


# ---- what the graph proves, value by value -----------------------------------------------------------------------

# Values and the positions (from the end) whose size the graph proves; each is checked against the size onnxruntime
# computes when it runs the graph. "a" is [1, 8, K] with K symbolic; "c" is [1, 8, n], n symbolic (fed 1 here: the
# broadcast still has D columns).
PROVEN = {
    "matmul": {1: D, 2: 8},
    "relu_of_matmul": {1: D, 2: 8},
    "gemm_transposed": {1: D},  # N from B [D, K] transposed
    "broadcast_add": {1: D, 2: 8},
    "reshaped": {1: 8, 2: 4, 3: 8, 4: 1},  # Reshape of a to [0, 0, 4, 8]: 0 copies a's dim
    "transposed": {1: 8, 2: 8, 3: 4, 4: 1},  # Transpose(perm [0, 2, 1, 3]) of it
}


def _shapes_model(rng) -> onnx.ModelProto:
    initializers = [
        numpy_helper.from_array(rng.standard_normal((K, D)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal((D, K)).astype(np.float32), "w_t"),
        numpy_helper.from_array(rng.standard_normal(D).astype(np.float32), "bias"),
        numpy_helper.from_array(np.array([0, 0, 4, 8], np.int64), "heads"),
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
    ]
    nodes = [
        helper.make_node("MatMul", ["a", "w"], ["matmul"]),
        helper.make_node("Relu", ["matmul"], ["relu_of_matmul"]),
        helper.make_node("Squeeze", ["a", "zero"], ["rows"]),
        helper.make_node("Gemm", ["rows", "w_t"], ["gemm_transposed"], transB=1),
        helper.make_node("Add", ["c", "bias"], ["broadcast_add"]),
        helper.make_node("Reshape", ["a", "heads"], ["reshaped"]),
        helper.make_node("Transpose", ["reshaped"], ["transposed"], perm=[0, 2, 1, 3]),
        helper.make_node("Mul", ["c", "bias"], ["c_times_scale_input"]),
    ]
    names = [*PROVEN, "c_times_scale_input"]
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in names]
    graph = helper.make_graph(
        nodes, "shapes",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 8, "K"]),
         helper.make_tensor_value_info("c", TensorProto.FLOAT, [1, 8, "n"])],
        outputs, initializers,
    )
    return make_model(graph, [helper.make_opsetid("", 18)])


def test_dims_the_producers_prove_match_the_runtime(rng):
    """Without any inference (the facts are the model's own annotations only), the producers prove each dim; the
    proof agrees with what onnxruntime computes."""
    proto = _shapes_model(rng)
    feeds = {"a": random_array(rng, (1, 8, K), np.float32), "c": random_array(rng, (1, 8, 1), np.float32)}
    names = [output.name for output in proto.graph.output]
    actual = dict(zip(names, run(make_session(proto, custom_ops=False), feeds)))
    model = ir.serde.deserialize_model(proto)
    values = {value.name: value for node in model.graph for value in node.outputs}
    values.update({value.name: value for value in model.graph.inputs})
    facts = Facts(TypeTable())  # no inference: what the proofs themselves find

    for name, proven in PROVEN.items():
        rank = actual[name].ndim
        shape = proven_shape(values[name], ir.Shape([None] * rank), rank, facts)
        for position, size in proven.items():
            assert shape.dims[-position] == size == actual[name].shape[-position], (name, position, shape)
    for name in ("a", "c"):  # graph inputs: their symbolic dims stay
        shape = proven_shape(values[name], facts.shape(values[name]), 1, facts)
        assert not isinstance(shape.dims[-1], int), (name, shape)
    # Mul(c, bias[D]) has D columns (proven), and c is not thereby proven to have D: it was fed 1.
    shape = proven_shape(values["c_times_scale_input"], ir.Shape([None] * 3), 1, facts)
    assert shape.dims[-1] == D and actual["c_times_scale_input"].shape[-1] == D and feeds["c"].shape[-1] == 1
