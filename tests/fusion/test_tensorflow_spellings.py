"""The graphs tf2onnx writes for TensorFlow and Keras norms, built with onnx.helper node for node (so that they run
without TensorFlow; tests/export/test_tensorflow_models.py exports the real thing).

What tf2onnx 1.17 writes for ``keras.layers.RMSNormalization`` and for ``x * tf.math.rsqrt(tf.reduce_mean(
tf.square(x), -1, keepdims=True) + eps) * w`` in float32 (TensorFlow's graph optimizer multiplies the constant scale
into the inverse first)::

    Mul(x, x) -> GlobalAveragePool (opset 17, rank 3) | ReduceMean(axes=[-1], noop_with_empty_axes=1) (opset 18)
      -> Add(., eps) -> Sqrt -> Reciprocal -> Mul(., w) -> Mul(x, .)

Keras' ``LayerNormalization`` (``x * (rsqrt(var + eps) * gamma) + (beta - mean * rsqrt(var + eps) * gamma)``) and its
deprecated ``rms_scaling=True`` (``x * rsqrt(var + eps) * gamma``, var about the mean) share that shape with a centered
statistic: never fused. Every candidate is either fused or in the report with its reason.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import ort_rmsnorm
from fusion.norm_graphs import (
    assert_close_after_layers,
    check_model,
    fused_nodes,
    run_fused,
    run_unfused,
)
from op_models import make_model, skip_unless_runtime_runs, tensor_proto

D = 16
EPS = 1e-6
TARGETS = {
    "custom": ("RMSNorm", "SkipRMSNorm"),
    "ort": ("SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization"),
    "onnx": ("RMSNormalization", None),
}
STATISTIC_OPS = ("GlobalAveragePool", "ReduceMean", "Sqrt", "Reciprocal")


class TfGraph:
    """Nodes and initializers named as tf2onnx names them (``scope/op:0``)."""

    def __init__(self, opset: int) -> None:
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []

    def constant(self, name: str, array) -> str:
        self.initializers.append(tensor_proto(f"{name}:0", np.asarray(array)))
        return f"{name}:0"

    def op(self, op_type: str, name: str, *inputs: str, **attributes) -> str:
        self.nodes.append(helper.make_node(op_type, list(inputs), [f"{name}:0"], name=name, **attributes))
        return f"{name}:0"

    def mean_last_axis(self, scope: str, value: str) -> str:
        """tf.reduce_mean(value, -1, keepdims=True) of a rank-3 float tensor, as tf2onnx writes it."""
        if self.opset < 18:
            return self.op("GlobalAveragePool", f"{scope}/Mean", value)
        axes = self.constant(f"{scope}/Mean/reduction_indices", np.array([-1], np.int64))
        return self.op("ReduceMean", f"{scope}/Mean", value, axes, keepdims=1, noop_with_empty_axes=1)

    def rms_norm(self, scope: str, x: str, weights: np.ndarray, spelling: str = "keras") -> str:
        """x * (Reciprocal(Sqrt(mean(x*x) + eps)) * w); ``scale_first``: (w * inverse), ``x_last``: (...) * x."""
        squared = self.op("Mul", f"{scope}/Square", x, x)
        mean = self.mean_last_axis(scope, squared)
        shifted = self.op("Add", f"{scope}/add", mean, self.constant(f"{scope}/add/y", np.float32(EPS)))
        rsqrt = self.op("Reciprocal", f"{scope}/Rsqrt__1", self.op("Sqrt", f"{scope}/Rsqrt", shifted))
        w = self.constant(f"{scope}/Mul_1/ReadVariableOp", weights)
        factor = self.op("Mul", f"{scope}/Mul", *((w, rsqrt) if spelling == "scale_first" else (rsqrt, w)))
        return self.op("Mul", f"{scope}/Mul_1", *((factor, x) if spelling == "x_last" else (x, factor)))

    def layer_norm(self, scope: str, x: str, gamma: np.ndarray, beta: np.ndarray | None) -> str:
        """Keras' LayerNormalization (``beta`` None: ``rms_scaling=True``) as tf2onnx writes it."""
        mean = self.mean_last_axis(f"{scope}/moments/mean", x)
        centered = self.op("Sub", f"{scope}/moments/SquaredDifference", x, mean)
        squared = self.op("Mul", f"{scope}/moments/SquaredDifference__1", centered, centered)
        variance = self.mean_last_axis(f"{scope}/moments/variance", squared)
        shifted = self.op("Add", f"{scope}/add", variance, self.constant(f"{scope}/add/y", np.float32(1e-3)))
        rsqrt = self.op("Reciprocal", f"{scope}/Rsqrt__1", self.op("Sqrt", f"{scope}/Rsqrt", shifted))
        gamma_name = self.constant(f"{scope}/Reshape", gamma.reshape(1, 1, D))
        if beta is None:  # rms_scaling=True: gamma first, as tf2onnx writes it
            return self.op("Mul", f"{scope}/mul_1", x, self.op("Mul", f"{scope}/mul", gamma_name, rsqrt))
        factor = self.op("Mul", f"{scope}/mul", rsqrt, gamma_name)
        scaled = self.op("Mul", f"{scope}/mul_2", x, factor)
        shift = self.op("Mul", f"{scope}/mul_1", self.op("Neg", f"{scope}/Neg", mean), factor)
        shift = self.op("Add", f"{scope}/add_1", shift, self.constant(f"{scope}/Reshape_1", beta.reshape(1, 1, D)))
        return self.op("Add", f"{scope}/add_2", scaled, shift)

    def dense(self, scope: str, x: str, kernel: np.ndarray, bias: np.ndarray) -> str:
        """keras.layers.Dense on [batch, sequence, D]: tf2onnx's Tensordot (Reshape to 2-D, MatMul, Reshape back to a
        shape computed from Shape(x)), then the bias."""
        shape = self.op("Cast", f"{scope}/Tensordot/Shape__1", self.op("Shape", f"{scope}/Tensordot/Shape", x), to=6)
        free = self.op("Gather", f"{scope}/Tensordot/GatherV2", shape,
                       self.constant(f"{scope}/Tensordot/free", np.array([0, 1], np.int32)), axis=0)
        out_shape = self.op("Concat", f"{scope}/Tensordot/concat_1", free,
                            self.constant(f"{scope}/Tensordot/Const_2", np.array([D], np.int32)), axis=0)
        out_shape = self.op("Cast", f"{scope}/Tensordot__1", out_shape, to=7)
        flat = self.op("Reshape", f"{scope}/Tensordot/Reshape", x,
                       self.constant(f"{scope}/Tensordot/Reshape_shape", np.array([-1, D], np.int64)))
        product = self.op("MatMul", f"{scope}/Tensordot/MatMul", flat, self.constant(f"{scope}/kernel", kernel))
        product = self.op("Reshape", f"{scope}/Tensordot", product, out_shape)
        return self.op("Add", f"{scope}/BiasAdd", product, self.constant(f"{scope}/bias", bias))

    def model(self, output: str) -> onnx.ModelProto:
        self.nodes.append(helper.make_node("Identity", [output], ["y"], name="Identity"))
        graph = helper.make_graph(
            self.nodes,
            "tf2onnx",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["unk__1", "unk__2", D])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["unk__3", "unk__4", D])],
            self.initializers,
        )
        return make_model(graph, [helper.make_opsetid("", self.opset), helper.make_opsetid("ai.onnx.ml", 2)])


@dataclasses.dataclass
class Block:
    """Two residual blocks ``h = h + Dense(norm(h))`` and a final norm, as a Keras functional model writes them."""

    model: onnx.ModelProto
    norm_weights: list[np.ndarray]
    dense: list[tuple[np.ndarray, np.ndarray]]


def residual_blocks(opset: int, norm: str = "rms", spelling: str = "keras", layers: int = 2, seed: int = 0) -> Block:
    rng = np.random.default_rng(seed)
    g = TfGraph(opset)
    weights = [(1 + 0.2 * rng.standard_normal(D)).astype(np.float32) for _ in range(layers + 1)]
    dense = [
        (rng.standard_normal((D, D)).astype(np.float32) / 4, (0.1 * rng.standard_normal(D)).astype(np.float32))
        for _ in range(layers)
    ]

    def normed(scope: str, h: str, w: np.ndarray) -> str:
        if norm == "rms":
            return g.rms_norm(scope, h, w, spelling)
        beta = (0.1 * rng.standard_normal(D)).astype(np.float32) if norm == "layer" else None
        return g.layer_norm(scope, h, w, beta)

    h = "x"
    for index in range(layers):
        n = normed(f"functional/norm_{index}", h, weights[index])
        h = g.op("Add", f"functional/add_{index}/Add", h, g.dense(f"functional/dense_{index}", n, *dense[index]))
    return Block(g.model(normed(f"functional/norm_{layers}", h, weights[layers])), weights, dense)


def reference(block: Block, x: np.ndarray) -> np.ndarray:
    """The RMSNorm blocks in numpy float64."""

    def rms_norm(h, w):
        return h / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + np.float64(np.float32(EPS))) * w

    h = x.astype(np.float64)
    for w, (kernel, bias) in zip(block.norm_weights, block.dense):
        h = h + rms_norm(h, w) @ kernel.astype(np.float64) + bias
    return rms_norm(h, block.norm_weights[-1])


def _fuse(model: onnx.ModelProto, target: str):
    return ort_rmsnorm.fuse(model, target, allow_opset_upgrade=target == "onnx")


@pytest.mark.parametrize("spelling", ["keras", "scale_first", "x_last"])
@pytest.mark.parametrize("opset", [17, 18])
@pytest.mark.parametrize("target", TARGETS)
def test_residual_blocks_fuse_on_every_target(target, opset, spelling, rng):
    block = residual_blocks(opset, spelling=spelling)
    fused, report = _fuse(block.model, target)
    norm_op, skip_op = TARGETS[target]

    assert report.skipped == [], report.summary()
    assert len(report.fusions) == 3, report.summary()
    skips = 2 if skip_op is not None else 0  # the two norms of a residual sum
    assert [fusion.skip for fusion in report.fusions].count(True) == skips
    assert len(fused_nodes(fused, norm_op)) == 3 - skips
    if skip_op is not None:
        assert len(fused_nodes(fused, skip_op)) == skips
    assert not [node for node in fused.graph.node if node.op_type in STATISTIC_OPS]
    assert {(fusion.axis, fusion.eps_placement, fusion.scale) for fusion in report.fusions} == {
        (-1, "inside_sqrt", "tensor")
    }
    assert all(fusion.epsilon == pytest.approx(EPS, rel=1e-6) and fusion.roundings == [] for fusion in report.fusions)
    check_model(fused, ort_default_ops=target == "ort")
    skip_unless_runtime_runs(target)
    x = rng.standard_normal((2, 5, D)).astype(np.float32)
    (got,) = run_fused(fused, {"x": x})
    assert_close_after_layers(got, run_unfused(block.model, {"x": x})[0])
    assert_close_after_layers(got, reference(block, x).astype(np.float32))
    again, second = _fuse(fused, target)
    assert second.fusions == [] and second.skipped == []


@pytest.mark.parametrize("norm", ["layer", "layer_rms_scaling"])
@pytest.mark.parametrize("opset", [17, 18])
@pytest.mark.parametrize("target", TARGETS)
def test_keras_layer_norms_stay_and_are_reported(target, opset, norm):
    block = residual_blocks(opset, norm=norm)
    fused, report = _fuse(block.model, target)

    assert report.fusions == []
    if target != "onnx":  # the onnx target converts the model to opset 23 first
        assert fused.graph.node == block.model.graph.node
    reasons = [entry.reason for entry in report.skipped]
    assert reasons == ["the input is x - mean(x) over the normalized axes: a LayerNorm, not an RMSNorm"] * 3
    assert len({entry.nodes[0] for entry in report.skipped}) == 3  # one entry per LayerNorm


# ---- every spelling: fused, or a reason -------------------------------------------------------------------------


def _single_norm(opset: int, build) -> onnx.ModelProto:
    g = TfGraph(opset)
    return g.model(build(g))


def _weights(seed=0, shape=(D,)):
    return (1 + 0.2 * np.random.default_rng(seed).standard_normal(shape)).astype(np.float32)


def _inverse(g: TfGraph, x: str, mean_axes=None) -> str:
    squared = g.op("Mul", "n/Square", x, x)
    if mean_axes is None:
        mean = g.mean_last_axis("n", squared)
    else:
        mean = g.op("ReduceMean", "n/Mean", squared, g.constant("n/axes", np.array(mean_axes, np.int64)))
    shifted = g.op("Add", "n/add", mean, g.constant("n/add/y", np.float32(EPS)))
    return g.op("Reciprocal", "n/Rsqrt__1", g.op("Sqrt", "n/Rsqrt", shifted))


def _factor_norm(scale_of=lambda g: g.constant("n/w", _weights()), x="x", statistic_of="x", mean_axes=None):
    def build(g):
        factor = g.op("Mul", "n/Mul", _inverse(g, statistic_of, mean_axes), scale_of(g))
        return g.op("Mul", "n/Mul_1", x, factor)

    return build


def _with_second_input(model: onnx.ModelProto, name: str, shape) -> onnx.ModelProto:
    model.graph.input.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, shape))
    return model


# name -> (model, None for fused, or the reason)
CANDIDATES = {
    "keras-opset17": (lambda: _single_norm(17, _factor_norm()), None),
    "keras-opset18": (lambda: _single_norm(18, _factor_norm()), None),
    # from_function makes a captured constant a graph input: the scale is then fed at run time
    "scale-graph-input": (
        lambda: _with_second_input(_single_norm(17, _factor_norm(lambda g: "mul_1/y:0")), "mul_1/y:0", [D]),
        None,
    ),
    "scale-varies-along-rows": (
        lambda: _single_norm(17, _factor_norm(lambda g: g.constant("n/w", _weights(shape=(1, 3, D))))),
        "varies along non-normalized axes",
    ),
    "scale-graph-input-varies-along-rows": (
        lambda: _with_second_input(_single_norm(18, _factor_norm(lambda g: "w:0")), "w:0", [3, D]),
        "varies along non-normalized axes",
    ),
    "another-value-times-the-factor": (
        lambda: _with_second_input(_single_norm(18, _factor_norm(x="other:0")), "other:0", ["unk__1", "unk__2", D]),
        "multiplies 'other:0' by the inverse rms of another value, 'x', times 'n/w:0': not a norm of either",
    ),
    "mean-over-the-middle-axis": (
        lambda: _single_norm(18, _factor_norm(mean_axes=[1])),
        "reduction over axes [1] (rank 3) is not over the trailing axes",
    ),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", CANDIDATES)
def test_every_candidate_is_fused_or_reported(name, target, rng):
    build, reason = CANDIDATES[name]
    model = build()
    fused, report = _fuse(model, target)
    if reason is None:
        assert len(report.fusions) == 1 and report.skipped == [], report.summary()
        assert not [node for node in fused.graph.node if node.op_type in STATISTIC_OPS]
    else:
        assert report.fusions == [], report.summary()
        assert [entry.reason for entry in report.skipped] == [reason] or (
            len(report.skipped) == 1 and reason in report.skipped[0].reason
        ), report.summary()
    skip_unless_runtime_runs(target)
    feeds = {}
    for value in model.graph.input:
        dims = [dim.dim_value or (2 if index == 0 else 3) for index, dim in enumerate(value.type.tensor_type.shape.dim)]
        feeds[value.name] = rng.standard_normal(dims).astype(np.float32)
    for got, want in zip(run_fused(fused, feeds), run_unfused(model, feeds)):
        assert_close_after_layers(got, want, name)
