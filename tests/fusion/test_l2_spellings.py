"""The L2-norm family: norms written with a sum of squares or its root (``tf.norm``, ``ReduceL2``, torch's
``x * rsqrt(sum(x²) + eps)``), built with onnx.helper in every spelling, fused where the fused op expresses them
exactly and reported with the reason where not.

- ``x / (norm / sqrt(d) [+ eps]) * w``: the rms (``norm / sqrt(d)`` or ``norm * d**-0.5``), epsilon 0 or outside the
  sqrt, the scale as it is;
- ``x / sqrt(sum + eps) * w``: an RMSNorm with epsilon eps/d times 1/sqrt(d), fused where 1/sqrt(d) is a power of two
  (d a power of 4), folded into the scale exactly;
- refused, each in the report: a clamp ``x / max(norm, eps)`` (torch's ``F.normalize``), a sum over a d that is not
  a power of 4, a root scaled by the wrong constant, a reduction of squares that nothing divides.

Every fused output is compared with numpy float64 computing the graph's own formula.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import ort_rmsnorm
from fusion.norm_graphs import GraphBuilder, check_model, fused_nodes, run_fused, run_unfused
from op_models import make_model, skip_unless_runtime_runs
from reference import assert_matches_reference, random_array

EPS = 1e-3


def l2_norm_model(
    form: str,
    *,
    d: int = 64,
    opset: int = 18,
    square: str = "mul",
    reduce: str = "sum",
    inverse: str = "div",
    eps: bool = True,
    scale: str = "constant",
    root_count: float | None = None,
) -> tuple[onnx.ModelProto, dict, np.ndarray | None]:
    """``form``: ``root`` (x / (norm / sqrt(d) [+ eps])), ``root_mul`` (x / (norm * d**-0.5 [+ eps])), ``sum``
    (x / sqrt(sum + eps) or x * rsqrt(...)), ``clamp`` (x / max(norm, eps)). ``reduce``: ``sum`` (ReduceSum of the
    square; axes as attribute below opset 13), ``l2`` (ReduceL2 of x), ``sumsq`` (ReduceSumSquare). ``inverse``:
    ``div`` (x / rms), ``reciprocal`` (x * Reciprocal(rms)), ``pow`` (sum form: x * Pow(sum + eps, -0.5)). ``scale``:
    ``constant``, ``input`` (fed at run time), ``none``. Returns the model, its feeds and the scale."""
    g = GraphBuilder(opset)
    axes = {"axes": [-1]} if opset < 13 else {}
    axes_input = [] if opset < 13 else [g.constant(np.array([-1], np.int64))]
    l2_opset_attr = opset < 18
    if reduce == "l2":
        root = g.op("ReduceL2", "x", *([] if l2_opset_attr else axes_input), **({"axes": [-1]} if l2_opset_attr else {}))
        total = None
    else:
        if reduce == "sumsq":
            sumsq_attr = opset < 18
            total = g.op("ReduceSumSquare", "x", *([] if sumsq_attr else axes_input),
                         **({"axes": [-1]} if sumsq_attr else {}))
        else:
            squared = g.op("Mul", "x", "x") if square == "mul" else g.op("Pow", "x", g.constant(np.array(2.0, np.float32)))
            total = g.op("ReduceSum", squared, *axes_input, **axes)
        root = None
    epsilon = g.constant(np.array(EPS, np.float32))
    if form in ("root", "root_mul", "clamp"):
        root = root if root is not None else g.op("Sqrt", total)
        if form == "clamp":
            rms = g.op("Max", root, epsilon)
        else:
            count = root_count if root_count is not None else (np.sqrt(d) if form == "root" else d**-0.5)
            rms = g.op("Div" if form == "root" else "Mul", root, g.constant(np.array(count, np.float32)))
            if eps:
                rms = g.op("Add", rms, epsilon)
        normalized = g.op("Div", "x", rms) if inverse == "div" else g.op("Mul", "x", g.op("Reciprocal", rms))
    else:
        inside = g.op("Add", total, epsilon) if eps else total
        if inverse == "pow":
            normalized = g.op("Mul", "x", g.op("Pow", inside, g.constant(np.array(-0.5, np.float32))))
        elif inverse == "reciprocal":
            normalized = g.op("Mul", "x", g.op("Reciprocal", g.op("Sqrt", inside)))
        else:
            normalized = g.op("Div", "x", g.op("Sqrt", inside))
    rng = np.random.default_rng(d + opset)
    weights = (rng.random(d) + 0.5).astype(np.float32) if scale != "none" else None
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", d])]
    feeds = {"x": random_array(rng, (2, 3, d), np.float32)}
    y = normalized
    if scale == "constant":
        y = g.op("Mul", normalized, g.constant(weights))
    elif scale == "input":
        inputs.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [d]))
        feeds["w"] = weights
        y = g.op("Mul", normalized, "w")
    graph = helper.make_graph(
        g.nodes, "l2", inputs, [helper.make_tensor_value_info(y, TensorProto.FLOAT, ["B", "S", d])], g.initializers
    )
    return make_model(graph, [helper.make_opsetid("", opset)]), feeds, weights


def reference(form: str, x: np.ndarray, weights: np.ndarray | None, eps: bool, root_count=None) -> np.ndarray:
    """The graph's own formula in float64."""
    x = x.astype(np.float64)
    d = x.shape[-1]
    total = np.sum(x * x, axis=-1, keepdims=True)
    epsilon = float(np.float32(EPS)) if eps else 0.0
    if form == "root":
        y = x / (np.sqrt(total) / float(np.float32(root_count or np.sqrt(d))) + epsilon)
    elif form == "root_mul":
        y = x / (np.sqrt(total) * float(np.float32(root_count or d**-0.5)) + epsilon)
    else:
        y = x / np.sqrt(total + epsilon)
    return y * weights.astype(np.float64) if weights is not None else y


SPELLINGS = {
    # name: (form, keyword arguments)
    "tf.norm / sqrt(d)": ("root", {"eps": False}),
    "tf.norm / sqrt(d) + eps": ("root", {}),
    "tf.norm * d**-0.5 + eps": ("root_mul", {}),
    "tf.norm * d**-0.5, no scale": ("root_mul", {"eps": False, "scale": "none"}),
    "tf.norm, Pow(x, 2)": ("root", {"square": "pow"}),
    "tf.norm, reciprocal": ("root", {"inverse": "reciprocal"}),
    "tf.norm, opset 11 (axes attribute)": ("root", {"opset": 11}),
    "tf.norm, opset 13 (axes input)": ("root", {"opset": 13}),
    "ReduceL2 / sqrt(d)": ("root", {"reduce": "l2", "eps": False}),
    "ReduceL2 * d**-0.5 + eps, opset 13": ("root_mul", {"reduce": "l2", "opset": 13}),
    "ReduceL2 / sqrt(d), d=128 (constant rounded)": ("root", {"reduce": "l2", "d": 128}),
    "rsqrt(sum + eps)": ("sum", {"inverse": "reciprocal"}),
    "rsqrt(sum + eps), no scale": ("sum", {"inverse": "reciprocal", "scale": "none"}),
    "x / sqrt(sum + eps)": ("sum", {}),
    "Pow(sum + eps, -0.5)": ("sum", {"inverse": "pow"}),
    "rsqrt(sum), no eps": ("sum", {"inverse": "reciprocal", "eps": False}),
    "rsqrt(sum + eps), Pow(x, 2), opset 11": ("sum", {"inverse": "reciprocal", "square": "pow", "opset": 11}),
    "rsqrt(ReduceSumSquare + eps)": ("sum", {"inverse": "reciprocal", "reduce": "sumsq"}),
    "rsqrt(sum + eps), d=16": ("sum", {"inverse": "reciprocal", "d": 16}),
    "rsqrt(sum + eps), d=256, no scale": ("sum", {"inverse": "reciprocal", "d": 256, "scale": "none"}),
}


@pytest.mark.parametrize("target", ["custom", "ort", "onnx"])
@pytest.mark.parametrize("name", SPELLINGS)
def test_l2_spellings_fuse_and_match_float64(name, target):
    skip_unless_runtime_runs(target)
    form, kwargs = SPELLINGS[name]
    model, feeds, weights = l2_norm_model(form, **kwargs)
    eps = kwargs.get("eps", True)
    fused, report = ort_rmsnorm.fuse(model, target, allow_opset_upgrade=True)
    if form != "sum" and eps and target != "custom":  # the standard ops add epsilon inside the sqrt only
        assert report.fusions == [] and len(report.skipped) == 1, report.summary()
        assert "epsilon is added outside the sqrt" in report.skipped[0].reason
        return
    (fusion,) = report.fusions
    assert report.skipped == [], report.summary()
    op = {"custom": "RMSNorm", "ort": "SimplifiedLayerNormalization", "onnx": "RMSNormalization"}[target]
    assert len(fused_nodes(fused, op)) == 1
    assert {node.op_type for node in fused.graph.node} <= {op, "Constant"}, [n.op_type for n in fused.graph.node]
    check_model(fused, ort_default_ops=target == "ort")
    d = feeds["x"].shape[-1]
    # How epsilon and the scale were derived is in the report.
    if form == "sum":
        assert fusion.derivation.startswith(f"the sum of squares over {d} elements is {d} x their mean")
        assert fusion.eps_placement == ("inside_sqrt" if eps else "none")
        assert fusion.epsilon == pytest.approx(float(np.float32(EPS)) / d if eps else 0.0, rel=1e-7)
        assert f"scale 1/sqrt({d})" in fusion.derivation
    else:
        assert fusion.derivation.startswith(f"the root of the sum of squares over {d} elements")
        assert fusion.eps_placement == ("outside_sqrt" if eps else "none")
    (y,) = run_fused(fused, feeds)
    assert_matches_reference(y, reference(form, feeds["x"], weights, eps), np.float32, name)
    (unfused,) = run_unfused(model, feeds)
    assert_matches_reference(unfused, reference(form, feeds["x"], weights, eps), np.float32, f"{name}, unfused")


def test_sum_form_keeps_its_derived_constants_exact():
    """1/sqrt(64) = 0.125 folded into the constant scale and epsilon/64 are exact in float32."""
    model, _, weights = l2_norm_model("sum", inverse="reciprocal")
    fused, report = ort_rmsnorm.fuse(model)
    (node,) = fused_nodes(fused, "RMSNorm")
    (fusion,) = report.fusions
    assert fusion.scale == "folded tensor/sqrt(d)" and "folded into the scale (exact)" in fusion.derivation
    epsilon = next(attr.f for attr in node.attribute if attr.name == "epsilon")
    assert epsilon == np.float32(EPS) / np.float32(64)
    constants = {init.name: onnx.numpy_helper.to_array(init) for init in fused.graph.initializer}
    constants |= {n.output[0]: onnx.numpy_helper.to_array(n.attribute[0].t) for n in fused.graph.node
                  if n.op_type == "Constant"}
    np.testing.assert_array_equal(constants[node.input[1]], weights * np.float32(0.125))


def test_sum_form_with_a_runtime_scale_fuses_without_it():
    """A scale computed at run time cannot take 1/sqrt(d): the norm is fused with 1/sqrt(d) as its own scale and the
    graph's Mul stays after it."""
    model, feeds, weights = l2_norm_model("sum", inverse="reciprocal", scale="input")
    fused, report = ort_rmsnorm.fuse(model)
    assert [node.op_type for node in fused.graph.node if node.op_type != "Constant"] == ["RMSNorm", "Mul"]
    (entry,) = report.skipped
    assert "computed at run time: the 1/sqrt(d) = 0.125 of a sum of squares cannot be folded" in entry.reason
    assert entry.fused_as is not None
    (y,) = run_fused(fused, feeds)
    assert_matches_reference(y, reference("sum", feeds["x"], weights, True), np.float32)


REFUSED = {
    # name: (form, keyword arguments, reason fragment)
    "F.normalize: x / max(norm, eps)": ("clamp", {}, "is clamped by Max 'Max_"),
    "F.normalize with ReduceL2": ("clamp", {"reduce": "l2"}, "a clamp, not an additive epsilon"),
    "rsqrt(sum + eps), d=128": (
        "sum", {"inverse": "reciprocal", "d": 128},
        "sums the squares of 128 elements: the norm is an RMSNorm times 1/sqrt(128), which no float holds exactly",
    ),
    "rsqrt(sum + eps), d=32, no scale": ("sum", {"inverse": "reciprocal", "d": 32, "scale": "none"}, "1/sqrt(32)"),
    "tf.norm / 4 over 64 elements": (
        "root", {"root_count": 4.0},
        "the root of the sum of squares divided by 4 is not the rms of the 64 reduced elements",
    ),
}


@pytest.mark.parametrize("name", REFUSED)
def test_refused_spellings_are_reported(name):
    form, kwargs, reason = REFUSED[name]
    model, feeds, _ = l2_norm_model(form, **kwargs)
    fused, report = ort_rmsnorm.fuse(model)
    assert report.fusions == [], report.summary()
    (entry,) = report.skipped
    assert reason in entry.reason, entry.reason
    assert [node.op_type for node in fused.graph.node] == [node.op_type for node in model.graph.node]
    np.testing.assert_array_equal(run_fused(fused, feeds)[0], run_unfused(model, feeds)[0])


def test_a_reduction_of_squares_that_nothing_divides_is_reported():
    """A sum of squares used for something else (a penalty added to the output) is reported with where it goes;
    a ReduceMean of a centered square is reported as a LayerNorm's."""
    g = GraphBuilder(18)
    axes = g.constant(np.array([-1], np.int64))
    total = g.op("ReduceSum", g.op("Mul", "x", "x"), axes)
    centered = g.op("Sub", "x", g.op("ReduceMean", "x", axes))
    variance = g.op("ReduceMean", g.op("Pow", centered, g.constant(np.array(2.0, np.float32))), axes)
    y = g.op("Add", g.op("Add", "x", total), variance)
    graph = helper.make_graph(
        g.nodes, "penalty", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 8])],
        [helper.make_tensor_value_info(y, TensorProto.FLOAT, ["B", 8])], g.initializers,
    )
    _, report = ort_rmsnorm.fuse(make_model(graph, [helper.make_opsetid("", 18)]))
    reasons = sorted(entry.reason for entry in report.skipped)
    assert len(reasons) == 2 and report.fusions == [], report.summary()
    assert "no norm of a spelling the pass recognizes follows (its value goes to Add 'Add_" in reasons[0]
    assert reasons[1] == "the input is x - mean(x) over the normalized axes: a LayerNorm, not an RMSNorm"
    assert {entry.rule for entry in report.skipped} == {"Reduction[ReduceSum]", "Reduction[ReduceMean]"}
