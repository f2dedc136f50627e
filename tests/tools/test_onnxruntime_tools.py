"""The tools users run after fusing, each on the fused demo Llama (float32 and int4) and on the unfused one, the two
results compared.

Tools that open their own onnxruntime sessions or run onnxruntime's symbolic shape inference run inside
``ort_rmsnorm.everywhere()`` (on the command line: ``ort-rmsnorm tool MODULE ARGS``); without it each fails with the
message docs/deploy.md names. The others need nothing. How results are compared:

- float tools (optimizers, pre-processing, converters, format changes): ``ort_rmsnorm.verify`` between the tool's
  result on the unfused and on the fused model, with its tolerances (float16 where the tool converts to float16);
- int8 quantizers: the fused result may differ from the unfused one where a float32 rounding moves an activation
  across a quantization step, so the bound is a control: the two differ by no more than the unfused result differs
  from the float model. ``quantize_static`` with only MatMuls quantized (the usual recipe) must also place the same
  Q/DQ nodes with the same scales.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

import ort_rmsnorm
from ort_rmsnorm import runtime, verify
from ort_rmsnorm.model.write import save_model
from tools.tool_models import our_nodes

quantization = pytest.importorskip("onnxruntime.quantization")

NOT_REGISTERED = re.escape("ort_rmsnorm:RMSNorm(-1) is not a registered function/op")


def _both(pair, tmp_path: Path, tool, suffix: str) -> tuple[Path, Path]:
    """Runs ``tool(source, destination)`` on the unfused and the fused model; returns the two results."""
    results = []
    for kind, source in (("unfused", pair.unfused), ("fused", pair.fused)):
        destination = tmp_path / f"{kind}.{suffix}.onnx"
        tool(str(source), str(destination))
        results.append(destination)
    return results[0], results[1]


def _assert_verified(original: Path, fused: Path) -> None:
    result = verify.verify(original, fused, dims={"batch": 2, "sequence": 7})
    assert result.ok, result.describe()


def _assert_keeps_our_ops(path: Path) -> None:
    assert Counter(node.op_type for node in our_nodes(path)) == {"SkipRMSNorm": 4, "RMSNorm": 1}


def _outputs(path: Path, pair) -> np.ndarray:
    return runtime.run(runtime.make_session(str(path)), pair.feeds())[0].astype(np.float64)


def _assert_within_control(unfused: Path, fused: Path, pair) -> tuple[float, float]:
    reference = _outputs(pair.unfused, pair)
    got_unfused, got_fused = _outputs(unfused, pair), _outputs(fused, pair)
    difference = float(np.max(np.abs(got_fused - got_unfused)))
    control = float(np.max(np.abs(got_unfused - reference)))
    assert control > 0, "the quantizer changed nothing"
    assert difference <= control, f"fused vs unfused after the tool: {difference:.3g}; its own error {control:.3g}"
    return difference, control


class _Tokens(quantization.CalibrationDataReader):
    def __init__(self, vocabulary: int, batches: int = 3):
        rng = np.random.default_rng(0)
        self.batches = iter([{"input_ids": rng.integers(0, vocabulary, (1, 8))} for _ in range(batches)])

    def get_next(self):
        return next(self.batches, None)


@pytest.fixture(autouse=True)
def _quiet_quantizer():
    logger = logging.getLogger("onnxruntime.quantization")
    level = logger.level
    logger.setLevel(logging.ERROR)  # "consider pre-processing" notes
    yield
    logger.setLevel(level)


def _qdq_nodes(path: Path) -> list[tuple[str, tuple]]:
    """(op type, its scale's value) of each Q/DQ node, in graph order."""
    model = onnx.load(str(path))
    constants = {tensor.name: onnx.numpy_helper.to_array(tensor) for tensor in model.graph.initializer}
    return [(node.op_type, tuple(np.ravel(constants.get(node.input[1], [])).tolist()))
            for node in model.graph.node if node.op_type in ("QuantizeLinear", "DequantizeLinear")]


# ---- tools that open their own sessions ------------------------------------------------------------------------


def test_quantize_static_qdq_matmuls(llama, tmp_path):
    def tool(source, destination):
        quantization.quantize_static(source, destination, _Tokens(128), quant_format=quantization.QuantFormat.QDQ,
                                     op_types_to_quantize=["MatMul"])

    with pytest.raises(Exception, match=NOT_REGISTERED):
        tool(str(llama.fused), str(tmp_path / "outside.onnx"))
    with ort_rmsnorm.everywhere():
        unfused, fused = _both(llama, tmp_path, tool, "qdq")
    _assert_keeps_our_ops(fused)
    expected, got = _qdq_nodes(unfused), _qdq_nodes(fused)
    assert len(got) == len(expected) > 0
    for (op, scale), (want_op, want_scale) in zip(got, expected):
        assert op == want_op
        np.testing.assert_allclose(scale, want_scale, rtol=1e-5)
    _assert_within_control(unfused, fused, llama)


@pytest.mark.parametrize("quant_format", ["QDQ", "QOperator"])
def test_quantize_static_every_op(llama, tmp_path, quant_format):
    """The default: every op it can quantize. The unfused norms get Q/DQ inside them; the fused norm stays float."""

    def tool(source, destination):
        quantization.quantize_static(source, destination, _Tokens(128),
                                     quant_format=getattr(quantization.QuantFormat, quant_format))

    with ort_rmsnorm.everywhere():
        unfused, fused = _both(llama, tmp_path, tool, quant_format)
    _assert_keeps_our_ops(fused)
    _assert_within_control(unfused, fused, llama)


def test_quantize_dynamic_needs_nothing(llama, tmp_path):
    unfused, fused = _both(llama, tmp_path, lambda s, d: quantization.quantize_dynamic(s, d), "dynamic")
    _assert_keeps_our_ops(fused)
    _assert_within_control(unfused, fused, llama)


@pytest.mark.parametrize("opt_level", [None, 1, 2, 99])
def test_transformer_optimizer(llama, tmp_path, opt_level):
    from onnxruntime.transformers.optimizer import optimize_model

    def tool(source, destination):
        optimize_model(source, opt_level=opt_level).save_model_to_file(destination)

    with pytest.raises(Exception, match=NOT_REGISTERED):  # None: the model type's default level (bert: 1)
        tool(str(llama.fused), str(tmp_path / "outside.onnx"))
    with ort_rmsnorm.everywhere():
        unfused, fused = _both(llama, tmp_path, tool, f"opt{opt_level}")
    _assert_keeps_our_ops(fused)
    _assert_verified(unfused, fused)


def test_a_model_onnxruntime_saved_in_a_process_with_the_library_still_fuses(llama_models, tmp_path):
    from onnxruntime.transformers.optimizer import optimize_model

    pair = llama_models["float"]
    with ort_rmsnorm.everywhere():
        optimize_model(str(pair.fused), opt_level=1)  # the library registered once in this process
    optimized = tmp_path / "unfused.opt.onnx"
    optimize_model(str(pair.unfused), opt_level=1).save_model_to_file(str(optimized))  # no library
    imports = {opset.domain: opset.version for opset in onnx.load(str(optimized)).opset_import}
    assert imports.get(ort_rmsnorm.OP_DOMAIN) in (None, 1000)
    _, report = ort_rmsnorm.fuse(optimized)
    assert len(report.fusions) == 5, report.summary()
    if imports.get(ort_rmsnorm.OP_DOMAIN) == 1000:
        assert any("version 1000, which no node uses" in note for note in report.notes), report.notes


def test_quantization_preprocessing(llama, tmp_path):
    from onnxruntime.quantization.shape_inference import quant_pre_process

    with ort_rmsnorm.everywhere():
        unfused, fused = _both(llama, tmp_path, quant_pre_process, "pre")
    _assert_keeps_our_ops(fused)
    _assert_verified(unfused, fused)
    _assert_verified(llama.fused, fused)
    inferred = onnx.load(str(fused))
    typed = {info.name for info in inferred.graph.value_info}
    assert all(name in typed for node in our_nodes(inferred) for name in node.output if name)


def test_mobile_usability_checker(llama, tmp_path):
    from onnxruntime.tools.mobile_helpers import usability_checker

    logger = logging.getLogger("usability")
    with pytest.raises(Exception, match=NOT_REGISTERED):
        usability_checker.analyze_model(llama.fused, skip_optimize=False, logger=logger)
    with ort_rmsnorm.everywhere():
        for path in (llama.unfused, llama.fused):
            usability_checker.analyze_model(path, skip_optimize=False, logger=logger)


# ---- the same tools from the command line ----------------------------------------------------------------------


def _run(*args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=600)


def test_command_line_preprocessing(llama_models, tmp_path):
    pair = llama_models["float"]
    plain = _run("-m", "onnxruntime.quantization.preprocess", "--input", pair.fused,
                 "--output", tmp_path / "plain.onnx", cwd=tmp_path)
    assert "Incomplete symbolic shape inference" in plain.stderr
    output = tmp_path / "pre.onnx"
    ours = _run("-m", "ort_rmsnorm", "tool", "onnxruntime.quantization.preprocess", "--input", pair.fused,
                "--output", output, cwd=tmp_path)
    assert ours.returncode == 0, ours.stderr
    _assert_verified(pair.fused, output)


def test_command_line_mobile_usability(llama_models, tmp_path):
    pair = llama_models["float"]
    plain = _run("-m", "onnxruntime.tools.check_onnx_model_mobile_usability", pair.fused, cwd=tmp_path)
    assert "ort_rmsnorm:RMSNorm(-1) is not a registered function/op" in plain.stderr
    ours = _run("-m", "ort_rmsnorm", "tool", "onnxruntime.tools.check_onnx_model_mobile_usability", pair.fused,
                cwd=tmp_path)
    assert ours.returncode == 0, ours.stderr
    assert "Model should perform well with" in ours.stderr + ours.stdout


def test_command_line_transformer_optimizer(llama_models, tmp_path):
    pair = llama_models["float"]
    output = tmp_path / "optimized.onnx"
    ours = _run("-m", "ort_rmsnorm", "tool", "onnxruntime.transformers.optimizer", "--input", pair.fused, "--output",
                output, "--opt_level", "2", cwd=tmp_path)
    assert ours.returncode == 0, ours.stderr
    _assert_keeps_our_ops(output)
    _assert_verified(pair.fused, output)


def test_command_line_tool_status_and_errors(tmp_path):
    script = tmp_path / "exits_three.py"
    script.write_text("import sys, onnxruntime\nprint(sys.argv[1:])\nsys.exit(3)\n")
    result = subprocess.run([sys.executable, "-m", "ort_rmsnorm", "tool", "exits_three", "--a", "b"],
                            capture_output=True, text=True, cwd=tmp_path, timeout=300,
                            env={**__import__("os").environ, "PYTHONPATH": str(tmp_path)})
    assert result.returncode == 3, result.stderr
    assert result.stdout.strip() == "['--a', 'b']"
    missing = _run("-m", "ort_rmsnorm", "tool", "onnxruntime.no_such_tool", cwd=tmp_path)
    assert missing.returncode == 2
    assert missing.stderr.strip() == "ort-rmsnorm tool: error: no module named 'onnxruntime.no_such_tool'"


# ---- tools that need nothing -----------------------------------------------------------------------------------


def _saved(tmp_path: Path, name: str, model: onnx.ModelProto) -> Path:
    path = tmp_path / f"{name}.onnx"
    save_model(model, path)
    return path


def _on_both(llama, tmp_path, name: str, transform) -> tuple[Path, Path]:
    return tuple(_saved(tmp_path, f"{kind}.{name}", transform(onnx.load(str(source))))
                 for kind, source in (("unfused", llama.unfused), ("fused", llama.fused)))


def test_onnx_ir_round_trip(llama, tmp_path):
    import onnx_ir as ir

    unfused, fused = _on_both(llama, tmp_path, "ir", lambda m: ir.serde.serialize_model(ir.serde.deserialize_model(m)))
    _assert_keeps_our_ops(fused)
    _assert_verified(unfused, fused)


def test_onnxscript_optimizer(llama, tmp_path):
    onnxscript = pytest.importorskip("onnxscript")
    unfused, fused = _on_both(llama, tmp_path, "onnxscript", onnxscript.optimizer.optimize)
    _assert_keeps_our_ops(fused)
    _assert_verified(unfused, fused)


def test_onnxslim(llama, tmp_path):
    onnxslim = pytest.importorskip("onnxslim", reason="onnxslim is a test extra (pip install onnxslim)")
    unfused, fused = _on_both(llama, tmp_path, "slim", onnxslim.slim)
    _assert_keeps_our_ops(fused)
    _assert_verified(unfused, fused)


def test_onnxsim(llama, tmp_path):
    onnxsim = pytest.importorskip("onnxsim", reason="onnxsim is a test extra (pip install onnxsim)")

    def simplify(model):
        simplified, ok = onnxsim.simplify(model)
        assert ok
        return simplified

    unfused, fused = _on_both(llama, tmp_path, "sim", simplify)
    _assert_keeps_our_ops(fused)
    _assert_verified(unfused, fused)


@pytest.mark.parametrize("converter", ["onnxconverter_common.float16", "onnxruntime.transformers.float16"])
def test_float16_converters(llama_models, tmp_path, converter):
    module = pytest.importorskip(converter)
    pair = llama_models["float"]
    unfused, fused = _on_both(pair, tmp_path, "fp16",
                              lambda m: module.convert_float_to_float16(m, keep_io_types=True))
    _assert_keeps_our_ops(fused)
    _assert_verified(unfused, fused)  # float16 tolerance: the models compute in float16


def test_int4_quantizer_after_fusing(llama_models, tmp_path):
    from ort_rmsnorm.builders import int4

    if int4.unavailable():
        pytest.skip(int4.unavailable())
    pair = llama_models["float"]
    unfused, fused = tmp_path / "unfused.int4.onnx", tmp_path / "fused.int4.onnx"
    int4.quantize(pair.unfused, unfused)
    int4.quantize(pair.fused, fused)
    _assert_keeps_our_ops(fused)
    assert Counter(n.op_type for n in onnx.load(str(fused)).graph.node)["MatMulNBits"] == 15
    _assert_verified(unfused, fused)


def test_ort_format_with_the_library(llama_models, tmp_path):
    pair = llama_models["float"]
    source = tmp_path / "model.onnx"
    shutil.copy(pair.fused, source)
    converted = _run("-m", "onnxruntime.tools.convert_onnx_models_to_ort", source, "--custom_op_library",
                     ort_rmsnorm.get_library_path(), cwd=tmp_path)
    assert converted.returncode == 0, converted.stderr
    expected = _outputs(pair.fused, pair)
    got = runtime.run(runtime.make_session(str(tmp_path / "model.ort")), pair.feeds())[0]
    np.testing.assert_allclose(got, expected, rtol=2**-14, atol=1e-6)
