"""Norm ops already in a model (torch's opset-23 RMSNormalization, onnxruntime's SimplifiedLayerNormalization, our
RMSNorm) converted to the target's op where it computes the same thing, and left, with the reason in the report,
where it does not."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from onnx import TensorProto, helper

import ort_rmsnorm
from fusion.norm_graphs import ONNX_TYPES, DTYPES, attribute, check_model, fused_nodes, run_fused, scale_array
from op_models import make_model, skip_unless_runtime_runs, tensor_proto
from reference import assert_matches_reference, random_array, rmsnorm

SOURCES = {  # op → domain
    "RMSNormalization": "",
    "SimplifiedLayerNormalization": "",
    "RMSNorm": "ort_rmsnorm",
}
TARGET_OPS = {"custom": "RMSNorm", "onnx": "RMSNormalization", "ort": "SimplifiedLayerNormalization"}
SKIP_OPS = {"custom": "SkipRMSNorm", "ort": "SkipSimplifiedLayerNormalization"}
PAIRS = [(source, target) for source in SOURCES for target, op in TARGET_OPS.items() if op != source]


@dataclasses.dataclass(frozen=True)
class NormOp:
    """One norm node ``x -> y`` (or ``a + b -> h -> y`` with ``residual``, h also an output) and its parameters."""

    source: str
    dtype: str = "float32"
    shape: tuple = ("B", 3, 8)
    run_shape: tuple = (2, 3, 8)
    axis: int = -1
    epsilon: float = 1e-3
    scale_shape: tuple | None = (8,)
    scale_dtype: str | None = None  # default: X's type
    opset: int = 23
    residual: bool = False
    attributes: tuple = ()  # further (name, value) attributes
    extra_output: bool = False  # SimplifiedLayerNormalization's inv_std_var, as a graph output

    def build(self, rng):
        dtype = DTYPES[self.dtype]
        scale = None
        if self.scale_shape is not None:
            scale = (1.0 + 0.5 * rng.standard_normal(self.scale_shape)).astype(DTYPES[self.scale_dtype or self.dtype])
        x_name = "h" if self.residual else "x"
        inputs = [x_name] + (["scale"] if scale is not None else [])
        outputs = ["y"] + (["inv_std_var"] if self.extra_output else [])
        attributes = {"axis": self.axis, "epsilon": self.epsilon, **dict(self.attributes)}
        nodes = [helper.make_node(self.source, inputs, outputs, name="model/norm/op", domain=SOURCES[self.source],
                                  **attributes)]
        feeds_names = ["x"]
        if self.residual:
            nodes.insert(0, helper.make_node("Add", ["a", "b"], ["h"], name="model/residual"))
            feeds_names = ["a", "b"]
        y_type = ONNX_TYPES[DTYPES[self.scale_dtype or self.dtype]] if self.source != "RMSNorm" else ONNX_TYPES[dtype]
        shape = list(self.shape) if self.shape is not None else None
        graph_outputs = [helper.make_tensor_value_info("y", y_type, shape)]
        if self.residual:
            graph_outputs.append(helper.make_tensor_value_info("h", ONNX_TYPES[dtype], shape))
        if self.extra_output:
            graph_outputs.append(helper.make_tensor_value_info("inv_std_var", TensorProto.FLOAT, None))
        graph = helper.make_graph(
            nodes,
            "g",
            [helper.make_tensor_value_info(name, ONNX_TYPES[dtype], shape) for name in feeds_names],
            graph_outputs,
            initializer=[tensor_proto("scale", scale)] if scale is not None else [],
        )
        imports = [helper.make_opsetid("", self.opset)] + (
            [helper.make_opsetid("ort_rmsnorm", 1)] if SOURCES[self.source] else []
        )
        feeds = {name: random_array(rng, self.run_shape, dtype) for name in feeds_names}
        return make_model(graph, imports), scale, feeds

    def expected(self, feeds, scale):
        """y (and h) in float64, from the parameters of the node built (not from what the pass emitted)."""
        skip = feeds.get("b")
        x = feeds["a"] if skip is not None else feeds["x"]
        placement = dict(self.attributes).get("eps_outside_sqrt", 0) == 1
        return rmsnorm(x, scale, axis=self.axis, epsilon=self.epsilon, eps_outside_sqrt=placement, skip=skip)


def _nodes(model) -> list[tuple]:
    return [(node.op_type, node.domain, list(node.input), list(node.output)) for node in model.graph.node]


def _source_case(source: str, target: str, **changes) -> NormOp:
    """Opset 23 where the model holds RMSNormalization or the target emits it; 18 elsewhere (older onnxruntime)."""
    opset = 23 if "RMSNormalization" in (source, TARGET_OPS[target]) else 18
    return NormOp(source, opset=opset, **changes)


VARIANTS = {
    "float32": {},
    "float16-positive-axis": {"dtype": "float16", "axis": 2},
    "bfloat16-two-axes-broadcast-scale": {"dtype": "bfloat16", "axis": -2, "scale_shape": (1, 8)},
    "residual-add": {"residual": True},
}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize(("source", "target"), PAIRS)
def test_norm_op_converted_exactly(source, target, variant, rng):
    case = _source_case(source, target, **VARIANTS[variant])
    model, scale, feeds = case.build(rng)
    fused, report = ort_rmsnorm.fuse(model, target)
    if target == "onnx" and case.dtype == "bfloat16":  # onnxruntime has no bfloat16 RMSNormalization kernel on CPU
        assert report.fusions == [] and _nodes(fused) == _nodes(model)
        assert "bfloat16 input: onnxruntime has no RMSNormalization kernel" in report.skipped[0].reason
        return

    skip_fused = case.residual and target != "onnx"  # the onnx target has no residual op
    op_type = SKIP_OPS[target] if skip_fused else TARGET_OPS[target]
    (node,) = fused_nodes(fused, op_type)
    kept = {"Add"} if case.residual and not skip_fused else set()
    assert {n.op_type for n in fused.graph.node} - {"Constant"} == {op_type, *kept}  # Constant: an expanded scale
    rank = len(case.run_shape)
    assert attribute(node, "axis", -1) == case.axis - rank * (case.axis >= 0)
    assert attribute(node, "epsilon") == pytest.approx(case.epsilon, rel=1e-7)
    (fusion,) = report.fusions
    assert fusion.converted_from == (f"ort_rmsnorm.{source}" if SOURCES[source] else source)
    assert (fusion.skip, fusion.axis, fusion.eps_placement) == (skip_fused, attribute(node, "axis", -1), "inside_sqrt")
    assert f"(from {fusion.converted_from})" in report.summary()
    applied = scale_array(fused, node.input[-1])
    np.testing.assert_array_equal(applied.astype(np.float64), np.broadcast_to(scale, applied.shape).astype(np.float64))
    if target != "custom":
        check_model(fused, ort_default_ops=target == "ort")
    if case.opset >= 23:
        skip_unless_runtime_runs("onnx")
    skip_unless_runtime_runs(target, case.dtype)
    outputs = run_fused(fused, feeds)
    expected, h = case.expected(feeds, scale)
    dtype = DTYPES[case.dtype]
    if target == "custom":
        assert_matches_reference(outputs[0], expected, dtype, what=f"{source} -> {target}")
    else:  # onnxruntime's kernels round differently from ours: within 2 ulps of T
        rtol = {np.float32: 4e-6, np.float16: 2.0**-9}.get(dtype.type, 2.0**-6)
        np.testing.assert_allclose(outputs[0].astype(np.float64), expected, rtol=rtol, atol=1e-6)
    if case.residual:
        np.testing.assert_array_equal(outputs[1], h)
    again, second = ort_rmsnorm.fuse(fused, target)
    assert again == fused and second.fusions == []


def test_eps_outside_sqrt_stays_ours_for_other_targets(rng):
    case = NormOp("RMSNorm", attributes=(("eps_outside_sqrt", 1),))
    model, _, _ = case.build(rng)
    for target in ("onnx", "ort"):
        fused, report = ort_rmsnorm.fuse(model, target)
        assert _nodes(fused) == _nodes(model) and report.fusions == []
        (skipped,) = report.skipped
        assert (skipped.rule, skipped.nodes) == ("Convert[ort_rmsnorm.RMSNorm]", ["model/norm/op"])
        assert skipped.reason == f"epsilon is added outside the sqrt: {TARGET_OPS[target]} adds it inside"


NOT_CONVERTED = {
    "stash-type-float16": (
        NormOp("SimplifiedLayerNormalization", "float16", opset=18, attributes=(("stash_type", 10),)),
        "SimplifiedLayerNormalization 'model/norm/op' computes in stash_type 10, not float32",
    ),
    "float32-scale-float16-x": (
        NormOp("RMSNormalization", "float16", scale_dtype="float32"),
        "RMSNormalization 'model/norm/op' gives Y its scale's type (float32) and X is float16: the fused ops give Y "
        "X's type",
    ),
    "inv-std-var-used": (
        NormOp("SimplifiedLayerNormalization", opset=18, extra_output=True),
        "its inv_std_var output is in use",
    ),
    "rmsnormalization-below-opset-23": (
        NormOp("RMSNormalization", opset=18),
        "RMSNormalization 'model/norm/op' at default opset 18: the op exists from opset 23",
    ),
    "negative-epsilon": (NormOp("RMSNormalization", epsilon=-1e-3), "epsilon -0.001"),
    "positive-axis-unknown-rank": (
        NormOp("RMSNormalization", shape=None, axis=1),
        "rank unknown, so axis 1 names no known number of trailing dims",
    ),
    "scale-along-rows": (
        NormOp("SimplifiedLayerNormalization", opset=18, shape=("B", 3, 8), scale_shape=(3, 8)),
        "scale of shape [3, 8] on input [B, 3, 8] varies along non-normalized axes",
    ),
    "float64": (NormOp("RMSNormalization", "float64"), "float64 input"),
}


@pytest.mark.parametrize("name", NOT_CONVERTED)
def test_norm_op_left_with_reason(name, rng):
    case, reason = NOT_CONVERTED[name]
    model, _, _ = case.build(rng)
    fused, report = ort_rmsnorm.fuse(model)
    assert report.fusions == [] and _nodes(fused) == _nodes(model)
    (skipped,) = report.skipped
    assert skipped.rule == f"Convert[{case.source}]" and reason in skipped.reason, skipped.reason


@pytest.mark.parametrize("fill", [1.0, 2.0])
def test_ones_of_x_shape_are_no_scale(fill, rng):
    """torch's opset-23 export of nn.RMSNorm without weight: RMSNormalization(x, ConstantOfShape(Shape(x), 1))."""
    value = helper.make_tensor("value", TensorProto.FLOAT, [1], [fill])
    graph = helper.make_graph(
        [
            helper.make_node("Shape", ["x"], ["x_shape"], name="shape"),
            helper.make_node("ConstantOfShape", ["x_shape"], ["ones"], name="ones", value=value),
            helper.make_node("RMSNormalization", ["x", "ones"], ["y"], name="norm", epsilon=1e-3),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 3, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 3, 8])],
    )
    model = make_model(graph, [helper.make_opsetid("", 23)])
    fused, report = ort_rmsnorm.fuse(model)
    if fill != 1.0:  # a scale of X's shape that is not ones varies along the rows: no RMSNorm scale
        assert _nodes(fused) == _nodes(model)
        assert "varies along non-normalized axes" in report.skipped[0].reason
        return
    (node,) = fused.graph.node  # Shape and ConstantOfShape went with the norm
    assert (node.op_type, list(node.input), report.fusions[0].scale) == ("RMSNorm", ["x"], "none")
    skip_unless_runtime_runs("onnx")
    x = random_array(rng, (2, 3, 8), np.float32)
    expected, _ = rmsnorm(x, None, epsilon=1e-3)
    assert_matches_reference(run_fused(fused, {"x": x})[0], expected, np.float32)
