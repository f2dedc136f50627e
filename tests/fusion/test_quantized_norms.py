"""A norm with QuantizeLinear/DequantizeLinear pairs inside it, as onnxruntime's ``quantize_static`` writes one when it
quantizes every op (uint8 activations, int8 weights, the epsilon quantized too): by default it is never fused; with
``through_qdq`` the pairs inside are dropped, those at its input and output stay, and the fused model computes the
float norm of the dequantized input, quantized at the output as the model does, checked against numpy float64."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ort_rmsnorm
from fusion.norm_graphs import run_fused, run_unfused
from op_models import make_model, skip_unless_runtime_runs
from reference import rmsnorm

D = 16
EPSILON = 1e-5
TARGET_OPS = {"custom": "RMSNorm", "ort": "SimplifiedLayerNormalization", "onnx": "RMSNormalization"}
INSIDE = ("the mean square", "ms + eps", "the inverse rms", "the normalized value")


def _uint8_params(values: np.ndarray) -> tuple[np.float32, np.uint8]:
    """Asymmetric uint8 scale and zero point over the values' range (0 included), as calibration gives them."""
    low, high = min(float(values.min()), 0.0), max(float(values.max()), 0.0)
    scale = np.float32((high - low) / 255 or 1.0)
    return scale, np.uint8(np.clip(np.round(-low / scale), 0, 255))


def _quantize(values, scale, zero) -> np.ndarray:
    return np.clip(np.round(values / np.float64(scale)) + int(zero), 0, 255).astype(np.uint8)


def _dequantize(quantized, scale, zero) -> np.ndarray:
    return (quantized.astype(np.float64) - int(zero)) * np.float64(scale)


class QuantizedNorm:
    """``out = QDQ(QDQ(x * QDQ(1 / sqrt(QDQ(QDQ(mean(x²)) + DQ(eps_q))))) * DQ(w_q))`` with ``x = QDQ(input)``: the pairs
    on the input and the output are the norm's boundaries, the four others are inside it. The uint8 parameters come
    from the float model's own values on ``sample`` (a calibration)."""

    def __init__(self, rng, *, rescaled: bool = False, opset: int = 19):
        self.sample = (rng.standard_normal((2, 3, D)) * 2).astype(np.float32)
        self.weight = (1 + 0.2 * rng.standard_normal(D)).astype(np.float32)
        x = self.sample.astype(np.float64)
        ms = np.mean(x * x, axis=-1, keepdims=True)
        inverse = 1 / np.sqrt(ms + EPSILON)
        normalized = x * inverse
        stages = {"x": x, "ms": ms, "ms_eps": ms + EPSILON, "inv": inverse, "normalized": normalized,
                  "y": normalized * self.weight}
        self.params = {name: _uint8_params(values) for name, values in stages.items()}
        self.w_scale = np.float32(np.abs(self.weight).max() / 127)
        self.w_q = np.round(self.weight / self.w_scale).astype(np.int8)
        self.eps_scale = np.float32(EPSILON / 255)
        self.eps_q = np.uint8(255)

        initializers = [
            numpy_helper.from_array(np.array(2.0, np.float32), "two"),
            numpy_helper.from_array(np.array([-1], np.int64), "axes"),
            numpy_helper.from_array(self.w_q, "w_q"), numpy_helper.from_array(self.w_scale, "w_scale"),
            numpy_helper.from_array(np.array(self.eps_q), "eps_q"),
            numpy_helper.from_array(self.eps_scale, "eps_scale"),
            numpy_helper.from_array(np.uint8(0), "eps_zero"),
        ]
        for name, (scale, zero) in self.params.items():
            initializers += [numpy_helper.from_array(scale, f"{name}_scale"),
                             numpy_helper.from_array(zero, f"{name}_zero")]
        if rescaled:
            initializers.append(numpy_helper.from_array(np.float32(2 * self.params["ms"][0]), "ms_rescaled"))
        nodes = []

        def qdq(value: str, stage: str, dequantize_scale: str | None = None) -> str:
            nodes.append(helper.make_node("QuantizeLinear", [value, f"{stage}_scale", f"{stage}_zero"], [f"{stage}_q"],
                                          name=f"{stage}/QuantizeLinear"))
            nodes.append(helper.make_node("DequantizeLinear",
                                          [f"{stage}_q", dequantize_scale or f"{stage}_scale", f"{stage}_zero"],
                                          [f"{stage}_dq"], name=f"{stage}/DequantizeLinear"))
            return f"{stage}_dq"

        def op(op_type: str, *inputs: str, **attributes) -> str:
            output = f"{op_type.lower()}_{len(nodes)}"
            nodes.append(helper.make_node(op_type, list(inputs), [output], name=f"norm/{op_type}_{len(nodes)}",
                                          **attributes))
            return output

        xd = qdq("input", "x")
        ms = qdq(op("ReduceMean", op("Pow", xd, "two"), "axes"), "ms", "ms_rescaled" if rescaled else None)
        eps = op("DequantizeLinear", "eps_q", "eps_scale", "eps_zero")
        inverse = qdq(op("Reciprocal", op("Sqrt", qdq(op("Add", ms, eps), "ms_eps"))), "inv")
        normalized = qdq(op("Mul", xd, inverse), "normalized")
        nodes.append(helper.make_node("DequantizeLinear", ["w_q", "w_scale"], ["w_dq"], name="w/DequantizeLinear"))
        out = qdq(op("Mul", normalized, "w_dq"), "y")
        nodes.append(helper.make_node("Identity", [out], ["out"], name="out"))
        value = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, ["B", "S", D])  # noqa: E731
        graph = helper.make_graph(nodes, "qdq_norm", [value("input")], [value("out")], initializers)
        self.model = make_model(graph, [helper.make_opsetid("", opset)])

    def expected(self, inputs: np.ndarray) -> np.ndarray:
        """The float norm of the dequantized input, in float64, quantized and dequantized at the output."""
        x = _dequantize(_quantize(inputs, *self.params["x"]), *self.params["x"])
        epsilon = _dequantize(np.array(self.eps_q), self.eps_scale, 0)
        weight = self.w_q.astype(np.float64) * np.float64(self.w_scale)
        y, _ = rmsnorm(x, weight, epsilon=float(epsilon))
        return _dequantize(_quantize(y, *self.params["y"]), *self.params["y"])


def _qdq_nodes(model: onnx.ModelProto) -> list[str]:
    return [node.name for node in model.graph.node if node.op_type in ("QuantizeLinear", "DequantizeLinear")]


def test_refused_by_default(rng):
    case = QuantizedNorm(rng)
    fused, report = ort_rmsnorm.fuse(case.model)
    assert report.fusions == [] and fused.graph.node == case.model.graph.node
    assert {entry.reason for entry in report.skipped} == {
        "a QuantizeLinear/DequantizeLinear pair inside the norm rounds the mean square to its quantized type: the "
        "fused op would not (through_qdq=True, CLI --through-qdq, drops such pairs)"
    }


@pytest.mark.parametrize("target", TARGET_OPS)
def test_fused_through_the_pairs_inside(target, rng):
    case = QuantizedNorm(rng)
    fused, report = ort_rmsnorm.fuse(case.model, target, through_qdq=True, allow_opset_upgrade=target == "onnx")

    (fusion,) = report.fusions
    assert report.skipped == [] and fusion.scale == "tensor", report.summary()
    assert fusion.roundings == [f"{what} is quantized to uint8 by a Q/DQ pair" for what in INSIDE]
    assert fusion.epsilon == pytest.approx(float(case.eps_scale) * 255, rel=1e-6)
    # The boundaries stay: the input's pair, the output's pair, the weight's DequantizeLinear.
    assert _qdq_nodes(fused) == ["x/QuantizeLinear", "x/DequantizeLinear", "w/DequantizeLinear",
                                 "y/QuantizeLinear", "y/DequantizeLinear"]
    (node,) = [node for node in fused.graph.node if node.op_type == TARGET_OPS[target]]
    assert node.input[0] == "x_dq" and node.output[0] in next(
        n.input for n in fused.graph.node if n.name == "y/QuantizeLinear")

    skip_unless_runtime_runs(target)
    inputs = (rng.standard_normal((4, 5, D)) * 2).astype(np.float32)
    step = float(case.params["y"][0])
    expected = case.expected(inputs)
    (got,) = (run_fused if target == "custom" else run_unfused)(fused, {"input": inputs})
    # float32 against float64 may land on the other side of a rounding boundary of the output's pair: one step.
    difference = np.abs(got.astype(np.float64) - expected)
    assert difference.max() <= step * 1.001 and np.mean(difference > step / 2) < 0.02, difference.max() / step
    (unfused,) = run_unfused(case.model, {"input": inputs})
    assert np.mean(np.abs(unfused - expected) > step / 2) > np.mean(difference > step / 2)  # the dropped roundings


def test_a_pair_that_rescales_is_not_dropped(rng):
    case = QuantizedNorm(rng, rescaled=True)
    fused, report = ort_rmsnorm.fuse(case.model, through_qdq=True)
    assert report.fusions == [] and fused.graph.node == case.model.graph.node
    reasons = {entry.reason for entry in report.skipped}
    assert reasons == {
        "the QuantizeLinear/DequantizeLinear pair 'ms/QuantizeLinear'/'ms/DequantizeLinear' on the mean square has "
        "different scales on its two sides: it rescales, not only rounds"
    }, reasons


def test_a_quantized_value_used_elsewhere_stays(rng):
    """The quantized mean square is also a graph output: the pair inside cannot go."""
    case = QuantizedNorm(rng)
    case.model.graph.output.append(helper.make_tensor_value_info("ms_q", TensorProto.UINT8, None))
    fused, report = ort_rmsnorm.fuse(case.model, through_qdq=True)
    assert report.fusions == []
    assert any("'ms_q' (QuantizeLinear output) is a graph output" in entry.reason for entry in report.skipped)


def test_command_line_and_folders_take_the_request(rng, tmp_path):
    """`ort-rmsnorm fuse --through-qdq`, for a file and for a folder of models."""
    import subprocess
    import sys

    case = QuantizedNorm(rng)
    folder = tmp_path / "in"
    folder.mkdir()
    onnx.save(case.model, folder / "model.onnx")
    for source, destination in ((folder / "model.onnx", tmp_path / "out.onnx"), (folder, tmp_path / "out")):
        for extra, fused in (([], 0), (["--through-qdq"], 1)):
            replace = ["--replace"] if source.is_dir() else []  # the second run writes the folder again
            completed = subprocess.run(
                [sys.executable, "-m", "ort_rmsnorm.cli", "fuse", str(source), str(destination), "--quiet", *replace,
                 *extra],
                capture_output=True, text=True, timeout=300)
            assert completed.returncode == 0, completed.stderr
            assert f": {fused} fused" in completed.stdout, completed.stdout
            assert ("quantized to uint8 by a Q/DQ pair" in completed.stdout) == bool(fused)
