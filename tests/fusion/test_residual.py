"""The residual Add before a norm fuses into SkipRMSNorm (custom) / SkipSimplifiedLayerNormalization (ort); its sum
output replaces the Add's output for the other consumers. A broadcast Add (a bias) is not a residual."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir
import pytest
from onnx import TensorProto, helper

import ort_rmsnorm
from ort_rmsnorm.rewrites import infer_types
from fusion.norm_graphs import (
    BFLOAT16,
    ONNX_TYPES,
    GraphBuilder,
    Spelling,
    add_norm,
    assert_close_after_layers,
    assert_close_to_unfused,
    attribute,
    check_model,
    fused_nodes,
    run_fused,
    run_unfused,
)
from op_models import make_model
from reference import assert_matches_reference, random_array, rmsnorm

D = 8


def _scaled_norm(g: GraphBuilder, x: str, dtype: np.dtype, weights: np.ndarray, upcast: bool) -> str:
    """Hugging Face style when ``upcast``: Cast to float32, norm, Cast back, then w * normalized."""
    compute = np.dtype(np.float32) if upcast else dtype
    source = g.op("Cast", x, to=TensorProto.FLOAT) if upcast else x
    y, _ = add_norm(g, source, Spelling(epsilon=1e-2), compute)
    if upcast:
        y = g.op("Cast", y, to=ONNX_TYPES[dtype])
    return g.op("Mul", g.constant(weights.astype(dtype)), y)


def residual_model(
    dtype=np.float32, *, sum_use="node", bias=False, upcast=False, rank=3, weights=np.linspace(0.5, 1.5, D)
) -> onnx.ModelProto:
    """y = norm(a + b) * w, with the sum also read by a Neg (``node``), a graph output, or nothing."""
    dtype = np.dtype(dtype)
    shape = ["B", "S", D][-rank:] if rank <= 3 else ["B", 2, "S", D]
    g = GraphBuilder(18)
    other = g.constant(np.linspace(-1, 1, D).astype(dtype)) if bias else "b"
    total = g.op("Add", "a", other)
    y = _scaled_norm(g, total, dtype, weights, upcast)
    outputs = [helper.make_tensor_value_info(y, ONNX_TYPES[dtype], shape)]
    if sum_use == "node":
        g.nodes.append(helper.make_node("Neg", [total], ["other"], name="sum_user"))
        outputs.append(helper.make_tensor_value_info("other", ONNX_TYPES[dtype], shape))
    elif sum_use == "graph_output":
        outputs.append(helper.make_tensor_value_info(total, ONNX_TYPES[dtype], shape))
    inputs = [helper.make_tensor_value_info("a", ONNX_TYPES[dtype], shape)]
    if not bias:
        inputs.append(helper.make_tensor_value_info("b", ONNX_TYPES[dtype], shape))
    graph = helper.make_graph(g.nodes, "g", inputs, outputs, g.initializers)
    return make_model(graph, [helper.make_opsetid("", 18)])


def _feeds(model, rng, run_shape=(2, 3, D)):
    dtype = {ONNX_TYPES[t]: t for t in ONNX_TYPES}
    return {
        value.name: random_array(
            rng, run_shape[-len(value.type.tensor_type.shape.dim) :], dtype[value.type.tensor_type.elem_type]
        )
        for value in model.graph.input
    }


@pytest.mark.parametrize("sum_use", ["node", "graph_output", "none"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["float32", "float16"])
def test_residual_add_fuses(dtype, sum_use, rng):
    model = residual_model(dtype, sum_use=sum_use, upcast=dtype == np.float16)
    fused, report = ort_rmsnorm.fuse(model)

    (node,) = fused_nodes(fused, "SkipRMSNorm")
    assert list(node.input[:2]) == ["a", "b"] and len(node.input) == 3
    assert (attribute(node, "axis"), attribute(node, "eps_outside_sqrt")) == (-1, 0)
    assert attribute(node, "epsilon") == pytest.approx(1e-2)
    assert len(node.output) == (1 if sum_use == "none" else 2)
    assert [n.op_type for n in fused.graph.node] == ["SkipRMSNorm"] + (["Neg"] if sum_use == "node" else [])
    if sum_use == "graph_output":
        assert node.output[1] == fused.graph.output[1].name
    (fusion,) = report.fusions
    assert fusion.skip and fusion.op_type == "ort_rmsnorm.SkipRMSNorm" and report.skipped == []
    assert next(n.name for n in model.graph.node if n.op_type == "Add" and n.input[0] == "a") in fusion.replaced_nodes
    check_model(fused)
    feeds = _feeds(model, rng)
    got, want = run_fused(fused, feeds), run_unfused(model, feeds)
    for fused_out, unfused_out in zip(got, want):
        assert_close_to_unfused(fused_out, unfused_out)
    expected, total = rmsnorm(feeds["a"], np.linspace(0.5, 1.5, D).astype(dtype), epsilon=1e-2, skip=feeds["b"])
    assert_matches_reference(got[0], expected, np.dtype(dtype), "y vs float64")
    if sum_use != "none":
        np.testing.assert_array_equal(got[1], -total if sum_use == "node" else total)
    again, second = ort_rmsnorm.fuse(fused)
    assert again == fused and second.fusions == []


def test_residual_bfloat16_against_float64(rng):
    model = residual_model(BFLOAT16, sum_use="graph_output", upcast=True)
    fused, _ = ort_rmsnorm.fuse(model)
    assert len(fused_nodes(fused, "SkipRMSNorm")) == 1
    feeds = _feeds(model, rng)
    y, total = run_fused(fused, feeds)
    expected, expected_total = rmsnorm(
        feeds["a"], np.linspace(0.5, 1.5, D).astype(BFLOAT16), epsilon=1e-2, skip=feeds["b"]
    )
    assert_matches_reference(y, expected, BFLOAT16, "y vs float64")
    np.testing.assert_array_equal(total, expected_total)


def test_bias_add_is_not_a_residual(rng):
    model = residual_model(bias=True)
    fused, report = ort_rmsnorm.fuse(model)
    assert not fused_nodes(fused, "SkipRMSNorm") and len(fused_nodes(fused, "RMSNorm")) == 1
    assert len(fused_nodes(fused, "Add")) == 1
    (entry,) = report.skipped
    assert "shapes [B, S, 8] and [8] is not known to add two tensors of one shape" in entry.reason
    feeds = _feeds(model, rng)
    for got, want in zip(run_fused(fused, feeds), run_unfused(model, feeds)):
        assert_close_to_unfused(got, want)


def test_add_of_unknown_shapes_is_not_fused():
    model = residual_model()
    for value in model.graph.input:
        value.type.tensor_type.ClearField("shape")
    for value in model.graph.output:
        value.type.tensor_type.ClearField("shape")
    fused, report = ort_rmsnorm.fuse(model)
    assert not fused_nodes(fused, "SkipRMSNorm")
    assert any("shapes unknown and unknown" in entry.reason for entry in report.skipped)


def test_add_before_an_already_fused_norm(rng):
    """A model fused by hand (or by an earlier run without the Add) gets the Add fused in."""
    node = helper.make_node("RMSNorm", ["h"], ["y"], domain="ort_rmsnorm", name="norm", axis=-1, epsilon=1e-3)
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["a", "b"], ["h"], name="add"),
            node,
            helper.make_node("Neg", ["h"], ["z"], name="neg"),
        ],
        "g",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["B", D]) for name in "ab"],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["B", D]) for name in "yz"],
    )
    model = make_model(graph, [helper.make_opsetid("", 18), helper.make_opsetid("ort_rmsnorm", 1)])
    fused, report = ort_rmsnorm.fuse(model)
    (skip,) = fused_nodes(fused, "SkipRMSNorm")
    assert list(skip.input) == ["a", "b"] and list(skip.output) == ["y", "h"]
    assert (attribute(skip, "axis"), attribute(skip, "epsilon")) == (-1, pytest.approx(1e-3))
    (fusion,) = report.fusions
    assert fusion.replaced_nodes == ["norm", "add"] and fusion.rule.startswith("(fused before this run)")
    feeds = _feeds(model, rng, (4, D))
    expected = run_fused(model, feeds)
    for got, want in zip(run_fused(fused, feeds), expected):
        np.testing.assert_array_equal(got, want)


def llama_block(dtype=np.float32, upcast=False, layers=2, hidden=D) -> onnx.ModelProto:
    """Pre-norm decoder layers (sublayers are MatMuls): norm, sublayer, residual add, norm, ..., final norm."""
    dtype = np.dtype(dtype)
    g = GraphBuilder(18)
    rng = np.random.default_rng(7)
    stream = "x"
    for _ in range(2 * layers):
        normed = _scaled_norm(g, stream, dtype, rng.random(hidden) + 0.5, upcast)
        sublayer = g.op("MatMul", normed, g.constant((rng.standard_normal((hidden, hidden)) / 3).astype(dtype)))
        stream = g.op("Add", stream, sublayer)
    y = _scaled_norm(g, stream, dtype, rng.random(hidden) + 0.5, upcast)
    graph = helper.make_graph(
        g.nodes,
        "llama",
        [helper.make_tensor_value_info("x", ONNX_TYPES[dtype], ["B", "S", hidden])],
        [helper.make_tensor_value_info(y, ONNX_TYPES[dtype], ["B", "S", hidden])],
        g.initializers,
    )
    return make_model(graph, [helper.make_opsetid("", 18)])


@pytest.mark.parametrize("target", ["custom", "ort"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["float32", "float16"])
def test_llama_layers(dtype, target, rng):
    model = llama_block(dtype, upcast=dtype == np.float16)
    fused, report = ort_rmsnorm.fuse(model, target)
    norm, skip = {
        "custom": ("RMSNorm", "SkipRMSNorm"),
        "ort": ("SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization"),
    }[target]
    assert len(fused_nodes(fused, norm)) == 1 and len(fused_nodes(fused, skip)) == 4
    assert {n.op_type for n in fused.graph.node} == {norm, skip, "MatMul"}
    skips = fused_nodes(fused, skip)
    sum_index = 1 if target == "custom" else 3
    # Each sum feeds the next residual Add (now the next skip op); the last one's sum is read by nobody.
    assert [len(node.output) > sum_index and node.output[sum_index] != "" for node in skips] == [
        True,
        True,
        True,
        False,
    ]
    assert report.skipped == [] and sum(f.skip for f in report.fusions) == 4
    check_model(fused, ort_default_ops=target == "ort")
    feeds = {"x": random_array(rng, (2, 3, D), dtype)}
    assert_close_after_layers(run_fused(fused, feeds)[0], run_unfused(model, feeds)[0], target)
    again, second = ort_rmsnorm.fuse(fused, target)
    assert again == fused and second.fusions == [] and second.skipped == []


def sliced_mlp_layers(layers=3, sliced_axis=-1, constant_axes=True, in_function=False) -> onnx.ModelProto:
    """Pre-norm layers whose sublayer is Phi-3's MLP as TorchScript exports it: gate and up split from one projection
    by Slices whose ends are computed from `Shape` (ONNX infers only their rank), over ``sliced_axis``; with
    ``in_function``, the layers are the body of a model-local function local::Layers that the main graph calls."""
    g = GraphBuilder(18, constants="constant" if in_function else "initializer")
    rng = np.random.default_rng(3)

    def ints(*values: int) -> str:
        return g.constant(np.array(values, np.int64))

    stream = "x"
    for _ in range(layers):
        normed = _scaled_norm(g, stream, np.dtype(np.float32), rng.random(D) + 0.5, False)
        both = g.op("MatMul", normed, g.constant((rng.standard_normal((D, 4 * D)) / 3).astype(np.float32)))
        width = g.op("Gather", g.op("Shape", both), g.constant(np.array(sliced_axis, np.int64)), axis=0)
        half = g.op("Unsqueeze", g.op("Div", width, g.constant(np.array(2, np.int64))), ints(0))
        axes = ints(sliced_axis) if constant_axes else g.op("Identity", "axes")
        gate = g.op("Slice", both, ints(0), half, axes)
        up = g.op("Slice", both, half, ints(2**62), axes)
        hidden = g.op("Mul", g.op("Mul", gate, g.op("Sigmoid", gate)), up)
        # Over the batch axis, half the batch is added back onto the whole: a broadcast Add when B is 2.
        down = (rng.standard_normal(((2 if sliced_axis == -1 else 4) * D, D)) / 3).astype(np.float32)
        stream = g.op("Add", stream, g.op("MatMul", hidden, g.constant(down)))
    y = _scaled_norm(g, stream, np.dtype(np.float32), rng.random(D) + 0.5, False)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", D])]
    if not constant_axes:
        inputs.append(helper.make_tensor_value_info("axes", TensorProto.INT64, [1]))
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", "S", D])]
    nodes, functions = g.nodes + [helper.make_node("Identity", [y], ["y"])], []
    if in_function:
        functions = [helper.make_function("local", "Layers", ["x"], ["y"], nodes, [helper.make_opsetid("", 18)])]
        nodes = [helper.make_node("Layers", ["x"], ["y"], domain="local", name="layers")]
    graph = helper.make_graph(nodes, "sliced_mlp", inputs, outputs, g.initializers)
    opsets = [helper.make_opsetid("", 18)] + [helper.make_opsetid("local", 1)] * in_function
    return make_model(graph, opsets, functions=functions)


def test_residual_after_slices_with_computed_ends(rng):
    """ONNX shape inference gives such a Slice only its rank; the pass puts back the input's dims on the axes the
    slice does not touch, layer after layer, so every residual Add is shown to add two [B, S, D] tensors."""
    model = sliced_mlp_layers()
    unaided = onnx.shape_inference.infer_shapes(model, data_prop=True)
    gate = next(n.output[0] for n in model.graph.node if n.op_type == "Slice")
    (info,) = [v for v in unaided.graph.value_info if v.name == gate]
    assert [d.dim_param or d.dim_value for d in info.type.tensor_type.shape.dim][:2] != ["B", "S"]

    ir_model = onnx_ir.serde.deserialize_model(model)
    types = infer_types(ir_model)
    gate_value = next(node.outputs[0] for node in ir_model.graph if node.op_type == "Slice")
    assert [getattr(dim, "value", dim) for dim in types.shape(gate_value).dims][:2] == ["B", "S"]
    fused, report = ort_rmsnorm.fuse(model)
    assert len(fused_nodes(fused, "SkipRMSNorm")) == 3 and len(fused_nodes(fused, "RMSNorm")) == 1
    assert report.skipped == []
    check_model(fused)
    feeds = {"x": random_array(rng, (2, 5, D), np.float32)}
    assert_close_after_layers(run_fused(fused, feeds)[0], run_unfused(model, feeds)[0])


def test_residual_after_slices_with_computed_ends_in_a_function(rng):
    """The same layers as a model-local function's body, inferred from its call site's types."""
    model = sliced_mlp_layers(in_function=True)
    fused, report = ort_rmsnorm.fuse(model)
    (function,) = fused.functions
    ops = [node.op_type for node in function.node]
    assert ops.count("SkipRMSNorm") == 3 and ops.count("RMSNorm") == 1 and report.skipped == []
    check_model(fused)
    feeds = {"x": random_array(rng, (2, 5, D), np.float32)}
    assert_close_after_layers(run_fused(fused, feeds)[0], run_unfused(model, feeds)[0])


@pytest.mark.parametrize(
    "variant", [{"sliced_axis": 0}, {"constant_axes": False}], ids=["slice_of_the_batch", "computed_axes"]
)
def test_slices_that_may_touch_the_leading_dims_stay_unknown(variant, rng):
    """A slice over the batch axis, or over axes not known, may change B: the Add after it could broadcast."""
    model = sliced_mlp_layers(layers=1, **variant)
    fused, report = ort_rmsnorm.fuse(model)
    assert not fused_nodes(fused, "SkipRMSNorm") and len(fused_nodes(fused, "RMSNorm")) == 2
    assert any("is not known to add two tensors of one shape" in entry.reason for entry in report.skipped)
    feeds = {"x": random_array(rng, (2, 5, D), np.float32)}
    if "constant_axes" in variant:
        feeds["axes"] = np.array([-1], np.int64)
    assert_close_after_layers(run_fused(fused, feeds)[0], run_unfused(model, feeds)[0])


def test_ort_skip_needs_rank_2_or_3(rng):
    model = residual_model(rank=4)
    fused, report = ort_rmsnorm.fuse(model, "ort")
    assert not fused_nodes(fused, "SkipSimplifiedLayerNormalization")
    assert len(fused_nodes(fused, "SimplifiedLayerNormalization")) == 1
    assert any("rank-2 or rank-3" in entry.reason for entry in report.skipped)
    feeds = _feeds(model, rng, (2, 2, 3, D))
    for got, want in zip(run_fused(fused, feeds), run_unfused(model, feeds)):
        assert_close_to_unfused(got, want)


def test_onnx_target_fuses_only_the_norm():
    fused, report = ort_rmsnorm.fuse(residual_model(), "onnx", allow_opset_upgrade=True)
    assert len(fused_nodes(fused, "RMSNormalization")) == 1 and len(fused_nodes(fused, "Add")) == 1
    assert not report.fusions[0].skip


def test_ort_skip_expands_a_broadcast_gamma(rng):
    """A one-element scale: SkipSimplifiedLayerNormalization needs gamma of the hidden size, a constant expands."""
    model = residual_model(weights=np.array([1.25]))
    fused, report = ort_rmsnorm.fuse(model, "ort")
    (node,) = fused_nodes(fused, "SkipSimplifiedLayerNormalization")
    (gamma,) = [n for n in fused.graph.node if n.op_type == "Constant" and n.output[0] == node.input[2]]
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(gamma.attribute[0].t), np.full(D, 1.25, np.float32))
    feeds = _feeds(model, rng)
    for got, want in zip(run_fused(fused, feeds), run_unfused(model, feeds)):
        assert_close_to_unfused(got, want)


def test_residual_through_a_no_op_cast(rng):
    """TorchScript exports of Hugging Face float32 models: the norm's `.to(float32)` is a Cast float32 → float32,
    and the next residual Add reads that Cast's output. The no-op cast is looked through; it stays for its reader."""
    g = GraphBuilder(17)
    total = g.op("Add", "a", "b")
    cast = g.op("Cast", total, to=TensorProto.FLOAT)
    y, _ = add_norm(g, cast, Spelling(opset=17, inverse="div_one"), np.dtype(np.float32))
    y = g.op("Mul", g.constant(np.linspace(0.5, 1.5, D).astype(np.float32)), y)
    g.nodes.append(helper.make_node("Add", [cast, y], ["next_residual"], name="next_add"))
    graph = helper.make_graph(
        g.nodes,
        "g",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["B", "S", D]) for name in "ab"],
        [helper.make_tensor_value_info("next_residual", TensorProto.FLOAT, ["B", "S", D])],
        g.initializers,
    )
    model = make_model(graph, [helper.make_opsetid("", 17)])
    fused, report = ort_rmsnorm.fuse(model)
    assert [n.op_type for n in fused.graph.node] == ["SkipRMSNorm", "Cast", "Add"]
    (skip,) = fused_nodes(fused, "SkipRMSNorm")
    assert fused.graph.node[1].input[0] == skip.output[1] and report.skipped == []
    feeds = _feeds(model, rng)
    assert_close_to_unfused(run_fused(fused, feeds)[0], run_unfused(model, feeds)[0])
