"""`ort-rmsnorm info` and `ort-rmsnorm demo`."""

from __future__ import annotations

import re
import time

import numpy as np
import onnx
import onnxruntime
import pytest

import ort_rmsnorm


def test_info(cli):
    result = cli("info")
    assert result.returncode == 0, result
    assert f"library: {ort_rmsnorm.get_library_path()}" in result.stdout
    assert f"onnxruntime {onnxruntime.__version__}" in result.stdout
    assert f"ort_api_version: {ort_rmsnorm.build_info()['ort_api_version']}" in result.stdout


def test_info_with_a_missing_library_is_a_clear_error(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("ORT_RMSNORM_LIBRARY", str(tmp_path / "absent.so"))
    result = cli("info")
    assert result.returncode == 2, result
    expected = f"ort-rmsnorm info: error: ORT_RMSNORM_LIBRARY={tmp_path / 'absent.so'}: no such file"
    assert result.stderr.strip().splitlines() == [expected]


def _timings(stdout: str) -> dict[str, tuple[float, float]]:
    """phase -> (original, fused) median ms, as the demo prints them."""
    found = re.findall(r"  (decode|prefill) \(.*\n    original +([\d.]+) ms.*\n    fused(?: = \w+)* +([\d.]+) ms",
                       stdout)
    return {phase: (float(original), float(fused)) for phase, original, fused in found}


def _shares(stdout: str) -> dict[str, tuple[float, float]]:
    """phase -> (original, fused) norm share in percent, as the demo prints them."""
    found = re.findall(r"  (decode|prefill): original ([\d.]+)% .*, fused ([\d.]+)% ", stdout)
    return {phase: (float(original), float(fused)) for phase, original, fused in found}


TINY_DEMO = ("--builder", "onnx", "--layers", "2", "--hidden", "64", "--sequence", "16", "--runs", "3",
             "--decode-runs", "5")


def test_demo_without_torch(cli, tmp_path):
    """The onnx.helper builder: a small model, int4-quantized, fused, verified, timed and profiled; the models are kept
    with --keep."""
    from ort_rmsnorm.builders import int4

    result = cli("demo", *TINY_DEMO, "--keep", tmp_path)
    assert result.returncode == 0, result
    assert "built with onnx.helper in the dynamo exporter's spelling" in result.stdout
    missing = int4.unavailable()  # e.g. with the oldest releases pyproject.toml allows: the demo says what to install
    if missing is None:
        assert re.search(r"int4 \(onnxruntime's MatMul(N|4)BitsQuantizer, block 32, symmetric\): 15 MatMuls quantized",
                         result.stdout), result.stdout
    else:
        assert f"int4: {missing}\n  going on with the float32 model" in result.stdout
    # Two layers: 5 norms, 4 of them after a residual add; the quantized model keeps the shapes the pass needs.
    assert "RMSNorm fusion (target custom): 5 fused, 0 skipped" in result.stdout
    assert "4 x ort_rmsnorm.SkipRMSNorm" in result.stdout
    assert "verify: all of 1 outputs match" in result.stdout
    timings = _timings(result.stdout)
    assert set(timings) == {"decode", "prefill"} and all(t > 0 for pair in timings.values() for t in pair)
    shares = _shares(result.stdout)
    assert set(shares) == {"decode", "prefill"}
    assert all(0 < original <= 100 and 0 < fused <= 100 for original, fused in shares.values())
    stem = "llama" if missing else "llama.int4"
    names = ["llama.onnx", *([] if missing else ["llama.int4.onnx"]),
             *(f"{stem}.{kind}.onnx" for kind in ("fused", "ort", "auto"))]
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(names)
    # The alternatives a user has, fused, verified and timed next to the default target.
    assert "target ort: 1 x SimplifiedLayerNormalization, 4 x com.microsoft.SkipSimplifiedLayerNormalization; " \
           "verify: ok" in result.stdout, result.stdout
    assert re.search(r"target auto: .*; verify: ok", result.stdout), result.stdout
    # Every target's ratio, in words (a target that wrote the same model as another timed once, under both names),
    # and the control's.
    for target in ("ort", "auto"):
        assert re.search(rf"original / (\w+ = )*{target}( = \w+)*: [\d.]+ \((\w+ = )*{target}( = \w+)* [\d.]+% "
                         r"(faster|slower)",
                         result.stdout), result.stdout
    assert re.search(r"original / original again: [\d.]+ \(the control: two sessions of one model differ by [\d.]+%",
                     result.stdout), result.stdout
    # The oldest IR version its opset allows, not onnx's newest: onnxruntime 1.20 reads IR 10 at most.
    for name in names:
        model = onnx.load(tmp_path / name, load_external_data=False)
        assert model.ir_version <= 10, name
    model = onnx.load(tmp_path / "llama.onnx")
    default = [opset for opset in model.opset_import if opset.domain == ""]
    assert model.ir_version == onnx.helper.find_min_ir_version_for(default)


def test_demo_of_the_float_model(cli, tmp_path):
    result = cli("demo", *TINY_DEMO, "--quantize", "none", "--keep", tmp_path)
    assert result.returncode == 0, result
    assert "MatMulNBits" not in result.stdout
    assert "RMSNorm fusion (target custom): 5 fused, 0 skipped" in result.stdout
    assert sorted(path.name for path in tmp_path.iterdir()) == ["llama.auto.onnx", "llama.fused.onnx", "llama.onnx",
                                                               "llama.ort.onnx"]


def test_demo_without_the_quantizer_says_what_to_install(monkeypatch, tmp_path):
    """Without onnxruntime.quantization (it needs packages onnxruntime does not require), the demo says why and what
    to install, and goes on with the float model."""
    from ort_rmsnorm import demo
    from ort_rmsnorm.builders import int4

    monkeypatch.setattr(int4, "unavailable", lambda: "onnxruntime's int4 quantizer cannot be imported: No module "
                        "named 'sympy' (pip install sympy)")
    lines = []
    config = demo.DEMO_CONFIG.__class__(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1,
                                        num_heads=4)
    assert demo.run_demo(config, builder="onnx", sequence=4, runs=1, decode_runs=1, directory=tmp_path,
                         log=lines.append) == 0
    text = "\n".join(lines)
    assert "int4: onnxruntime's int4 quantizer cannot be imported: No module named 'sympy' (pip install sympy)\n" \
           "  going on with the float32 model" in text
    assert sorted(path.name for path in tmp_path.iterdir()) == ["llama.auto.onnx", "llama.fused.onnx", "llama.onnx",
                                                               "llama.ort.onnx"]


def test_demo_usage_errors(cli, tmp_path):
    result = cli("demo", "--hidden", "62")
    assert result.returncode == 2 and "--hidden must be a multiple of the 4 attention heads" in result.stderr
    assert cli("demo", "--layers", "0").returncode == 2
    result = cli("demo", "--decode-runs", "0")
    assert result.returncode == 2 and "--decode-runs must be at least 1" in result.stderr
    (tmp_path / "file").write_text("")
    models = tmp_path / "file" / "models"
    result = cli("demo", "--keep", models)
    assert (result.returncode, result.stderr) == (
        2, f"ort-rmsnorm demo: error: --keep: cannot make the directory {models}: Not a directory\n"
    )


@pytest.mark.slow
@pytest.mark.torch
def test_default_demo_runs_in_under_two_minutes(cli):
    """About 20-40 s on 2 cores (most of it the torch export); the bound leaves room for a busy machine."""
    pytest.importorskip("torch")
    start = time.perf_counter()
    result = cli("demo")
    elapsed = time.perf_counter() - start
    assert result.returncode == 0, result
    assert "exported from torch with the dynamo exporter" in result.stdout
    assert "int4 (onnxruntime's MatMul" in result.stdout
    assert "RMSNorm fusion (target custom): 17 fused, 0 skipped" in result.stdout
    assert "verify: all of 1 outputs match" in result.stdout
    assert set(_timings(result.stdout)) == set(_shares(result.stdout)) == {"decode", "prefill"}
    assert elapsed < 120, f"demo took {elapsed:.0f} s"


def _model_file(path, producer: str, epsilon: float):
    from onnx import TensorProto, helper

    node = helper.make_node("LayerNormalization", ["x", "scale"], ["y"], epsilon=epsilon, doc_string=producer)
    helper.set_metadata_props(node, {"rule": producer})  # as the pass records a fusion's rule, per target
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
                              [onnx.numpy_helper.from_array(np.ones(4, np.float32), "scale")])
    model = helper.make_model(graph, producer_name=producer, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path)
    return path


def test_demo_times_a_model_two_targets_wrote_once(tmp_path):
    """Targets whose files hold the same graph (metadata aside) are one model; an attribute apart makes another."""
    from ort_rmsnorm import demo

    paths = {"fused": _model_file(tmp_path / "fused.onnx", "custom", 1e-5),
             "ort": _model_file(tmp_path / "ort.onnx", "ort", 1e-6),
             "auto": _model_file(tmp_path / "auto.onnx", "auto", 1e-5)}
    assert demo.same_models(paths) == {"fused": ["fused", "auto"], "ort": ["ort"]}
    assert demo.same_models({"ort": paths["ort"], "fused": paths["fused"]}) == {"ort": ["ort"], "fused": ["fused"]}


def test_demo_ratios_in_words():
    from ort_rmsnorm import demo

    assert demo.ratio_words(0.979, "ort") == f"ort {100 * (1 / 0.979 - 1):.1f}% slower" == "ort 2.1% slower"
    assert demo.ratio_words(1.145, "fused = auto") == "fused = auto 14.5% faster"
    assert demo.ratio_words(1.0, "auto") == "auto the same"
    # Against the control's deviation from 1, either way.
    assert demo.ratio_words(0.979, "ort", control=1.03) == "ort 2.1% slower, within the noise"
    assert demo.ratio_words(0.979, "ort", control=1 / 1.03) == "ort 2.1% slower, within the noise"
    assert demo.ratio_words(1.145, "fused", control=1.03) == "fused 14.5% faster"
    assert "differ by 3.0% in this run" in demo.control_words(1 / 1.03)
