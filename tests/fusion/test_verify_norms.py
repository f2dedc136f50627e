"""``verify``'s per-norm check: semantic errors injected into fused models are caught at their norm with the right
diagnosis, even where the outputs stay within their tolerance; models whose norms differ only in rounding pass, and
a difference that quantization downstream amplifies past the outputs' tolerance is explained, not failed."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import ort_rmsnorm
from ort_rmsnorm import norm_checks, verify
from ort_rmsnorm.builders.llama import LlamaConfig, build_llama_onnx
from fusion.norm_graphs import Spelling, norm_model
from op_models import skip_unless_runtime_runs

CONFIG = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4)
DIMS = {"batch": 2, "sequence": 6}


def _llama(dtype="float32", **changes) -> onnx.ModelProto:
    return build_llama_onnx(dataclasses.replace(CONFIG, **changes), dtype)


def _norm_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [node for node in model.graph.node if node.domain == "ort_rmsnorm"]


def _set_attribute(node: onnx.NodeProto, name: str, value) -> None:
    kept = [attribute for attribute in node.attribute if attribute.name != name]
    del node.attribute[:]
    node.attribute.extend([*kept, helper.make_attribute(name, value)])


def _initializer(model: onnx.ModelProto, name: str) -> np.ndarray:
    return numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == name))


def _replace_initializer(model: onnx.ModelProto, name: str, array: np.ndarray) -> None:
    for index, tensor in enumerate(model.graph.initializer):
        if tensor.name == name:
            model.graph.initializer[index].CopyFrom(numpy_helper.from_array(array, name))
            return
    raise KeyError(name)


def _only_failure(result: verify.VerifyResult) -> norm_checks.NormVerdict:
    failed = [norm for norm in result.norms.norms if not norm.ok]
    assert len(failed) == 1, result.describe(verbose=True)
    return failed[0]


# --- injected semantic errors -------------------------------------------------------------------------------------


def _epsilon_value(fused, original):
    _set_attribute(_norm_nodes(fused)[1], "epsilon", 1e-5)  # the model's is 1e-6
    return 1, "epsilon (the original matches 1e-06, the fused op has 1e-05)"


def _epsilon_placement(fused, original):
    _set_attribute(_norm_nodes(fused)[2], "eps_outside_sqrt", 1)
    return 2, "epsilon placement (the original matches 0.01 inside the sqrt, the fused op adds 0.01 outside the sqrt)"


def _axis(fused, original):
    _set_attribute(_norm_nodes(fused)[0], "axis", -2)
    return 0, "axis (the original normalizes the last 1 dims, the fused op the last 2)"


def _scale_dropped(fused, original):
    node = _norm_nodes(fused)[-1]
    node.input[2] = ""
    while node.input and not node.input[-1]:  # omitted trailing inputs left out, as exporters write them (an empty
        del node.input[-1]                    # name there crashes onnxruntime 1.20-1.23, tests/op_models.py)
    return len(_norm_nodes(fused)) - 1, "scale (the original multiplies by a scale the fused op lacks)"


def _scale_swapped(fused, original):
    first, second = _norm_nodes(fused)[1:3]
    first.input[2], second.input[2] = second.input[2], first.input[2]
    return None, "scale (the original matches the scale of norm '"


def _one_plus_lost(fused, original):
    node = _norm_nodes(fused)[3]
    scale = _initializer(fused, node.input[2])
    fused.graph.initializer.append(numpy_helper.from_array(scale - np.float32(1), "w_without_one"))
    node.input[2] = "w_without_one"
    return 3, "scale (the original multiplies by 1 + w, the fused op by w: the `1 + w` is lost)"


def _layer_norm(fused, original):
    node = _norm_nodes(fused)[0]
    replacement = helper.make_node("LayerNormalization", [node.input[0], node.input[1]], [node.output[0]],
                                   name=node.name, axis=-1, epsilon=1e-6)
    node.CopyFrom(replacement)
    return 0, "mean (the fused op centres each row, a LayerNorm; the original divides by the RMS about zero)"


def _wrong_residual(fused, original):
    nodes = _norm_nodes(fused)
    nodes[2].input[1] = nodes[0].output[0]  # the first norm's output instead of the attention's
    return 2, "residual sum (the original's "


INJECTIONS = {
    "epsilon_value": (_epsilon_value, {}),
    "epsilon_placement": (_epsilon_placement, {"rms_norm_eps": 1e-2}),
    "axis": (_axis, {}),
    "scale_dropped": (_scale_dropped, {}),
    "scale_swapped": (_scale_swapped, {}),
    "one_plus_lost": (_one_plus_lost, {}),
    "layer_norm": (_layer_norm, {}),
    "wrong_residual": (_wrong_residual, {}),
}


@pytest.mark.parametrize("injection", INJECTIONS)
def test_injected_semantic_error_is_caught_at_its_norm(injection):
    inject, config = INJECTIONS[injection]
    original = _llama(**config)
    if injection == "scale_dropped":  # the scale the finding reports: 1 + 1e-5 * N(0, 1), invisible at the outputs
        weight = "norm.weight"
        rng = np.random.default_rng(5)
        _replace_initializer(original, weight, (1 + 1e-5 * rng.standard_normal(CONFIG.hidden_size)).astype(np.float32))
    fused, report = ort_rmsnorm.fuse(original)
    assert report.fusions and len(_norm_nodes(fused)) == CONFIG.norm_count
    clean = verify.verify(original, fused, dims=DIMS)
    assert clean.ok and clean.norms.ok, clean.describe(verbose=True)
    index, diagnosis = inject(fused, original)
    result = verify.verify(original, fused, dims=DIMS)
    failed = _only_failure(result) if injection != "scale_swapped" else None
    if failed is None:  # both norms of the swap fail, each matching the other's scale
        failed_norms = [norm for norm in result.norms.norms if not norm.ok]
        assert len(failed_norms) == 2, result.describe(verbose=True)
        for norm, other in zip(failed_norms, reversed(failed_norms)):
            assert norm.difference.startswith(f"{diagnosis}{other.node}'"), norm.describe()
    else:
        assert failed.node == _norm_name(fused, index), failed.describe()
        assert failed.difference.startswith(diagnosis), failed.describe()
    assert not result.ok
    text = result.describe()
    assert "MISMATCH: differs: " in text and text.splitlines()[-1].endswith("norm MISMATCH") or \
        text.splitlines()[-1].endswith("norms MISMATCH"), text
    if injection in ("epsilon_value", "scale_dropped"):  # what the outputs alone let through
        assert result.outputs_ok, result.describe()


def _norm_name(fused: onnx.ModelProto, index: int) -> str:
    nodes = [node for node in fused.graph.node
             if ("" if node.domain == "ai.onnx" else node.domain, node.op_type) in norm_checks.NORM_SIGNATURES]
    return nodes[index].name


def test_rows_beyond_float32_are_named_as_such():
    """Squares that overflow float32 make the decomposed original infinite-divided where the fused op computes the
    row in float64: a difference of range, not of meaning, and named so."""
    case = norm_model(Spelling(epsilon=1e-5, shape=("B", "S", 8), run_shape=(2, 3, 8)))
    fused, _ = ort_rmsnorm.fuse(case.model)
    x = np.where(np.arange(8) < 4, 1e30, 1.0).astype(np.float32) * np.ones((2, 3, 8), np.float32)
    failed = _only_failure(verify.verify(case.model, fused, inputs={"x": x}))
    assert failed.difference.startswith("range (a row's sum of squares overflows or underflows float32"), \
        failed.describe()
    assert failed.kernel_bound_ok


def test_injected_error_fails_the_command_line(tmp_path, capsys):
    from ort_rmsnorm.cli import main

    original = _llama()
    fused, _ = ort_rmsnorm.fuse(original)
    _epsilon_value(fused, original)
    onnx.save(original, tmp_path / "original.onnx")
    onnx.save(fused, tmp_path / "broken.onnx")
    status = main(["verify", str(tmp_path / "original.onnx"), str(tmp_path / "broken.onnx"),
                   "--dim", "batch=2", "--dim", "sequence=6"])
    out = capsys.readouterr().out
    assert status == 1, out
    assert "norms: 1 of 5 MISMATCH" in out
    assert "differs: epsilon (the original matches 1e-06, the fused op has 1e-05)" in out
    assert "outputs match; 1 norm MISMATCH" in out


def test_fuse_verify_and_folders_print_the_norms(tmp_path, capsys):
    from ort_rmsnorm.cli import main
    from ort_rmsnorm.folders import fuse_folder, verify_folder

    source = tmp_path / "in"
    source.mkdir()
    onnx.save(_llama(), source / "model.onnx")
    status = main(["fuse", str(source / "model.onnx"), str(tmp_path / "fused.onnx"), "--verify", "--verbose",
                   "--quiet"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "norms: all of 5 keep the exact definition" in out
    assert out.count("exact definition kept (original max ") == 5, out
    fuse_folder(source, tmp_path / "out", "custom")
    result = verify_folder(source, tmp_path / "out")
    assert result.ok and result.models[0].result.norms.ok
    assert "  norms: all of 5 keep the exact definition" in result.describe()
    broken = onnx.load(tmp_path / "out" / "model.onnx")
    _scale_dropped(broken, None)
    onnx.save(broken, tmp_path / "out" / "model.onnx")
    result = verify_folder(source, tmp_path / "out")
    assert not result.ok
    assert "differs: scale (the original multiplies by a scale the fused op lacks)" in result.describe()


def test_models_with_external_data(tmp_path):
    """The weights stay on disk: the sessions with the norms' values as outputs read them from the models'
    folders, and the scales the definition needs are read from there too."""
    original, fused = tmp_path / "model.onnx", tmp_path / "fused.onnx"
    onnx.save(_llama(), original, save_as_external_data=True, location="model.onnx.data")
    ort_rmsnorm.fuse_file(original, fused)
    result = verify.verify(original, fused, dims=DIMS)
    assert result.ok and len(result.norms.norms) == CONFIG.norm_count, result.describe(verbose=True)
    assert all(norm.original_ulps is not None and norm.note is None for norm in result.norms.norms)
    broken = onnx.load(fused, load_external_data=False)
    _scale_dropped(broken, None)
    onnx.save(broken, tmp_path / "broken.onnx")  # its external data is still fused.onnx.data, beside it
    failed = _only_failure(verify.verify(original, tmp_path / "broken.onnx", dims=DIMS))
    assert failed.difference.startswith("scale (the original multiplies by a scale the fused op lacks)")


# --- only rounding differs ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["custom", "ort", "onnx", "auto"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_llama_norms_keep_their_definition(dtype, target):
    """The pass keeps the names of the norms' outputs (Y, and the residual ops' sum), so each is compared."""
    skip_unless_runtime_runs(target, dtype)
    original = _llama(dtype)
    fused, _ = ort_rmsnorm.fuse(original, target=target, allow_opset_upgrade=True)
    result = verify.verify(original, fused, dims=DIMS)
    assert result.ok, result.describe(verbose=True)
    assert len(result.norms.norms) == CONFIG.norm_count
    assert all(norm.original_ulps is not None and norm.note is None for norm in result.norms.norms)
    if target != "onnx":  # no residual op there; the last norm's sum is used by nothing and not written
        assert sum(norm.sum_ulps is not None for norm in result.norms.norms) == CONFIG.norm_count - 2
    assert "keep the exact definition" in result.describe()


def test_inputs_the_pass_made_are_compared_at_the_rows_size():
    """The ``ort`` target writes a float16 residual norm without its sum as the Adds and SimplifiedLayerNormalization:
    the norm's X is a value the pass made, taken from the fused model and measured at each row's RMS."""
    original = _llama("float16")
    fused, _ = ort_rmsnorm.fuse(ort_rmsnorm.fuse(original)[0], "ort")
    result = verify.verify(original, fused, dims=DIMS)
    assert result.ok, result.describe(verbose=True)
    last = result.norms.norms[-1]
    assert last.note.startswith("compared from the fused model's ") and last.note.endswith("at the size of each row")
    assert last.tolerance == 2 * norm_checks.ORIGINAL_ULPS[np.dtype(np.float16)]
    node = [node for node in fused.graph.node if node.op_type == "SimplifiedLayerNormalization"][-1]
    _set_attribute(node, "epsilon", 0.1)
    failed = _only_failure(verify.verify(original, fused, dims=DIMS))
    assert failed.node == last.node
    # float16 cannot tell 1e-6 from 1e-4 at these rows: the fit names a value the original matches within it.
    assert failed.difference.startswith("epsilon (the original matches "), failed.describe()
    assert ", the fused op has 0.1)" in failed.difference, failed.describe()


@pytest.mark.parametrize("source", ["ort", "onnx"])
def test_converted_norm_ops_keep_their_names(source):
    """A model holding onnxruntime's or ONNX's norm ops, converted to ours: each of ours is compared with the op it
    replaced."""
    skip_unless_runtime_runs(source)
    original, _ = ort_rmsnorm.fuse(_llama(), target=source, allow_opset_upgrade=True)
    fused, report = ort_rmsnorm.fuse(original)
    assert {node.op_type for node in _norm_nodes(fused)} == {"RMSNorm", "SkipRMSNorm"}
    result = verify.verify(original, fused, dims=DIMS)
    assert result.ok, result.describe(verbose=True)
    assert all(norm.original_ulps is not None and norm.note is None for norm in result.norms.norms)
    if source == "ort":
        assert sum(norm.sum_ulps is not None for norm in result.norms.norms) == CONFIG.norm_count - 2


def _verify_with_kernels(isa: str, original, fused, *arguments: str) -> str:
    """``ort-rmsnorm verify --verbose`` in a child process with the kernel set ``isa`` forced (the library picks its
    set once per process; "default": its own choice); its output, after checking it exited 0."""
    env = {key: value for key, value in os.environ.items() if key != "ORT_RMSNORM_CPU_ISA"}
    if isa != "default":
        env["ORT_RMSNORM_CPU_ISA"] = isa
    child = subprocess.run([sys.executable, "-m", "ort_rmsnorm", "verify", str(original), str(fused), "--verbose",
                            *arguments], env=env, capture_output=True, text=True)
    if "not supported by this CPU" in child.stderr:
        pytest.skip(f"{isa}: not supported by this CPU")
    assert child.returncode == 0, child.stdout + child.stderr
    return child.stdout


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("upcast", [True, False])
@pytest.mark.parametrize("isa", ["scalar", "avx2", "default"])
def test_sixteen_bit_norms_pass(dtype, upcast, isa, tmp_path):
    """Graphs that compute in float32 and cast, and graphs that compute per op in 16 bits, with each kernel set."""
    if dtype == "bfloat16" and not upcast:
        pytest.skip("onnxruntime's CPU provider has no bfloat16 Pow/ReduceMean/Sqrt")
    # onnxruntime's CPU provider has no bfloat16 Mul: the bfloat16 graph scales in float32 and casts last.
    scale = "cast_after" if dtype == "bfloat16" else "mul"
    case = norm_model(Spelling(dtype=dtype, upcast=upcast, scale=scale, epsilon=1e-5, shape=("B", "S", 64),
                               run_shape=(4, 16, 64)))
    fused, report = ort_rmsnorm.fuse(case.model)
    assert report.fusions
    onnx.save(case.model, tmp_path / "original.onnx")
    onnx.save(fused, tmp_path / "fused.onnx")
    np.save(tmp_path / "x.npy", case.feeds["x"])
    out = _verify_with_kernels(isa, tmp_path / "original.onnx", tmp_path / "fused.onnx", "--input",
                               f"x={tmp_path / 'x.npy'}")
    assert "norms: all of 1 keep the exact definition" in out, out
    assert "verify: all of 2 outputs match" in out, out
    if isa == "default":  # the same in process, with the numbers
        result = verify.verify(case.model, fused, inputs=case.feeds)
        (norm,) = result.norms.norms
        assert result.ok and norm.kernel_bound_ok, result.describe(verbose=True)
        assert norm.original_ulps <= norm_checks.ORIGINAL_ULPS[np.dtype(case.spelling.np_dtype)]


def _quantized_llama(tmp_path, how: str) -> tuple[str, str]:
    original = tmp_path / "float.onnx"
    onnx.save(_llama(hidden_size=128, intermediate_size=256), original)
    quantized = tmp_path / f"{how}.onnx"
    if how == "int8":
        from onnxruntime.quantization import quantize_dynamic

        quantize_dynamic(str(original), str(quantized))
    else:
        from ort_rmsnorm.builders import int4

        if int4.unavailable():
            pytest.skip(int4.unavailable())
        int4.quantize(original, quantized, int4.Int4Options(accuracy_level=4))
    fused = tmp_path / f"{how}-fused.onnx"
    ort_rmsnorm.fuse_file(quantized, fused)
    return str(quantized), str(fused)


@pytest.mark.parametrize("how", ["int8", "int4"])
def test_quantized_models_pass_and_name_the_amplifiers(tmp_path, how):
    """Every norm keeps its definition; where the int8 roundings downstream carry a one-ulp change at a norm past
    the outputs' tolerance (measured: the int4 model with accuracy_level 4, seed 3, AVX-512 and AVX2 kernels: logits
    0.9% off; scalar kernels: within 1.5e-6), the verdict explains it and verify passes."""
    quantized, fused = _quantized_llama(tmp_path, how)
    expected = "MatMulInteger" if how == "int8" else "MatMulNBits (accuracy_level 4: int8 activations)"
    for seed in range(4):
        result = verify.verify(quantized, fused, dims={"batch": 3, "sequence": 5}, seed=seed)
        assert result.ok, result.describe(verbose=True)
        assert len(result.norms.norms) == CONFIG.norm_count and result.norms.ok
        assert expected in result.norms.amplifiers, result.norms.amplifiers
        if not result.outputs_ok:
            assert result.explained and "explained by rounding at 5 norms" in result.describe()
    for isa in ("scalar", "avx2"):
        for seed in (0, 3):
            out = _verify_with_kernels(isa, quantized, fused, "--dim", "batch=3", "--dim", "sequence=5",
                                       "--seed", str(seed))
            assert "norms: all of 5 keep the exact definition" in out, out
            assert ("verify: all of 1 outputs match" in out
                    or f"explained by rounding at 5 norms (max " in out and expected in out), out


def test_amplified_difference_is_explained():
    """Outputs beyond their tolerance, every norm exact: explained by the quantizing ops downstream, not failed."""
    original = _llama()
    fused, _ = ort_rmsnorm.fuse(original)
    result = verify.verify(original, fused, dims=DIMS)
    result.outputs[0].max_rel = 10 * result.outputs[0].tolerance  # as a one-ulp flip amplified by int8 rounding
    assert not result.explained and not result.ok  # no quantizing or discontinuous op downstream: not explained
    result.norms.amplifiers = ["DynamicQuantizeLinear", "MatMulInteger"]
    assert result.explained and result.ok
    last = result.describe().splitlines()[-1]
    assert last.startswith("verify: 0 of 1 outputs within tolerance; the rest explained by rounding at 5 norms (max ")
    assert last.endswith("ulp), amplified by DynamicQuantizeLinear, MatMulInteger"), last


def test_amplifying_ops_are_found_downstream():
    graph = helper.make_graph(
        [helper.make_node("Relu", ["n"], ["a"]), helper.make_node("DynamicQuantizeLinear", ["a"], ["q", "s", "z"]),
         helper.make_node("MatMulNBits", ["b", "w", "ws"], ["c"], domain="com.microsoft", accuracy_level=4),
         helper.make_node("Cast", ["a"], ["i"], to=onnx.TensorProto.INT32),
         helper.make_node("ArgMax", ["other"], ["am"])],
        "g", [], [])
    model = helper.make_model(graph)
    assert norm_checks.amplifying_ops(model, ["n"]) == ["DynamicQuantizeLinear", "Cast to integer"]
    assert norm_checks.amplifying_ops(model, ["b"]) == ["MatMulNBits (accuracy_level 4: int8 activations)"]


def test_definition_against_reference():
    """The float64 evaluation is the contract's formula (independent numpy here)."""
    rng = np.random.default_rng(3)
    x, skip = rng.standard_normal((2, 3, 8)).astype(np.float16), rng.standard_normal((2, 3, 8)).astype(np.float16)
    scale = rng.standard_normal(8)
    s = (x.astype(np.float32) + skip.astype(np.float32)).astype(np.float64)
    for outside in (False, True):
        rms = np.sqrt(np.mean(s**2, axis=(1, 2), keepdims=True))
        want = s / ((rms + 1e-3) if outside else np.sqrt(rms**2 + 1e-3)) * scale
        definition = norm_checks.Definition(axis=1, epsilon=1e-3, eps_outside=outside, centred=False,
                                            float32_sum=True)
        y, total, _ = norm_checks.evaluate(definition, np.dtype(np.float16), x, skip, scale, None, None)
        np.testing.assert_allclose(y, want, rtol=1e-12)
        np.testing.assert_array_equal(total, s.astype(np.float16).astype(np.float64))
    assert norm_checks.ulps(np.float32(1 + 2**-22), np.float64(1.0), np.dtype(np.float32)) == 2.0


def test_another_runtimes_kernel_may_round_its_long_sums_its_own_way():
    """onnxruntime's float32 SkipSimplifiedLayerNormalization was 19 ulp from the float64 definition on rows of 2048
    (its sum of squares in its own order): a rounding question, bounded by the row's length, not a mismatch. Our
    ops keep the contract's bound."""
    y = np.zeros((1, 2048), np.float32)
    assert norm_checks.other_kernel_tolerance(16, y, -1) == pytest.approx(4 * 2048**0.5)
    assert norm_checks.other_kernel_tolerance(16, np.zeros((3, 8), np.float32), -1) == 16
    original = _llama(hidden_size=2048, intermediate_size=256, num_layers=1, num_heads=32, vocab_size=32)
    fused, _ = ort_rmsnorm.fuse(original, "ort")
    result = verify.verify(original, fused)
    assert result.ok and result.norms.ok and len(result.norms.norms) == 3, result.describe(True)
