"""The way back: a model holding our ops fused again to the ``ort``, ``onnx`` and ``decomposed`` targets computes what
ours compute (float64 reference: outputs within the op contract's tolerance, the residual sum bit for bit), or each
op that stays is in the report with the reason; and the round trip original -> custom -> back -> custom keeps the
numbers."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import ort_rmsnorm
from ort_rmsnorm.builders.llama import LlamaConfig, build_llama_onnx
from ort_rmsnorm.verify import verify
from fusion.norm_graphs import run_fused
from op_models import make_model, norm_model, skip_unless_runtime_runs
from reference import BFLOAT16, assert_matches_reference, random_array, rmsnorm

DTYPES = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16), "bfloat16": BFLOAT16}
SHAPE = (2, 3, 16)
TARGETS = ("ort", "onnx", "decomposed")
LLAMA = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2)


def _at_opset(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """The one-node model at another default opset (our op does not care; RMSNormalization needs 23)."""
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            entry.version = opset
    model.ir_version = helper.find_min_ir_version_for([helper.make_opsetid("", opset)])
    return model


def _ours(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [node for node in model.graph.node if node.domain == "ort_rmsnorm"]


def _run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    return run_fused(model, feeds)


CASES = {
    # name: (skip, attributes, with bias, with scale)
    "RMSNorm": (False, {"epsilon": 1e-5}, False, True),
    "RMSNorm, no scale": (False, {"epsilon": 1e-3}, False, False),
    "RMSNorm, two axes": (False, {"axis": -2, "epsilon": 1e-5}, False, True),
    "RMSNorm, eps outside": (False, {"eps_outside_sqrt": 1, "epsilon": 1e-3}, False, True),
    "SkipRMSNorm": (True, {"epsilon": 1e-5}, False, True),
    "SkipRMSNorm, float32 sum": (True, {"epsilon": 1e-5, "normalize_float32_sum": 1}, False, True),
    "SkipRMSNorm, bias": (True, {"epsilon": 1e-5}, True, True),
    "SkipRMSNorm, bias, float32 sum": (True, {"epsilon": 1e-5, "normalize_float32_sum": 1}, True, True),
}


def _expressible(target: str, dtype: str, case: str) -> bool:
    """Where the target has ops for the norm (docs/fusion.md, Targets): epsilon outside the sqrt only as plain ops,
    bfloat16 nowhere in RMSNormalization."""
    if "eps outside" in case and target != "decomposed":
        return False
    # A bfloat16 residual op whose norm reads the float32 sum is a float32 RMSNormalization.
    return not (target == "onnx" and dtype == "bfloat16" and "float32 sum" not in case)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("target", TARGETS)
def test_our_op_written_back(target, dtype, case):
    skip_unless_runtime_runs(target, dtype)
    x_dtype = DTYPES[dtype]
    skip, attributes, with_bias, with_scale = CASES[case]
    rng = np.random.default_rng(0)
    normalized = SHAPE[attributes.get("axis", -1):]
    scale = random_array(rng, normalized, x_dtype, offset=1.0) if with_scale else None
    bias = random_array(rng, SHAPE[-1:], x_dtype, magnitude=0.1) if with_bias else None
    model = norm_model(x_dtype, skip=skip, sum_output=skip, x_shape=SHAPE, constant_scale=scale,
                       constant_bias=bias, attributes=attributes)
    model = _at_opset(model, 23 if target == "onnx" else 17)
    back, report = ort_rmsnorm.fuse(model, target)

    if not _expressible(target, dtype, case):
        assert len(_ours(back)) == 1 and report.fusions == [], report.summary()
        assert [entry.nodes for entry in report.skipped] == [["norm0"]], report.summary()
        return
    assert not _ours(back), report.summary()
    (fusion,) = report.fusions
    assert fusion.converted_from == f"ort_rmsnorm.{'SkipRMSNorm' if skip else 'RMSNorm'}" and fusion.skip == skip

    feeds = {"x": random_array(rng, SHAPE, x_dtype)}
    if skip:
        feeds["skip"] = random_array(rng, SHAPE, x_dtype)
    expected, total = rmsnorm(feeds["x"], scale, axis=attributes.get("axis", -1), epsilon=attributes["epsilon"],
                              eps_outside_sqrt=bool(attributes.get("eps_outside_sqrt")), skip=feeds.get("skip"),
                              bias=bias, normalize_float32_sum=bool(attributes.get("normalize_float32_sum")))
    outputs = _run(back, feeds)
    assert_matches_reference(outputs[0], expected, x_dtype, f"{target} {dtype} {case}")
    if skip:
        np.testing.assert_array_equal(outputs[1].astype(np.float32), total.astype(np.float32))  # bit for bit
        ours = _run(model, feeds)
        np.testing.assert_array_equal(ours[1].astype(np.float32), outputs[1].astype(np.float32))


def test_the_float32_sum_of_16_bit_inputs_takes_onnxruntimes_residual_op():
    """SkipSimplifiedLayerNormalization normalizes the float32 sum: ours with normalize_float32_sum=1 maps onto it,
    with 0 (the rounded sum) it is written as the float32 Add between Casts and SimplifiedLayerNormalization."""
    scale = np.ones(SHAPE[-1], np.float16)
    for flag, ops in ((1, ["SkipSimplifiedLayerNormalization"]),
                      (0, ["Cast", "Cast", "Add", "Cast", "SimplifiedLayerNormalization"])):
        model = norm_model(np.float16, skip=True, sum_output=True, x_shape=SHAPE, constant_scale=scale,
                           attributes={"normalize_float32_sum": flag})
        back, _ = ort_rmsnorm.fuse(model, "ort")
        assert [node.op_type for node in back.graph.node if node.op_type != "Constant"] == ops


def test_residual_norms_written_as_adds_are_reported_by_their_own_names():
    """A float16 model fused to our ops, then to ``ort``: each 16-bit SkipRMSNorm (the rounded sum) becomes its sum's
    Adds and SimplifiedLayerNormalization, and each is in the report, named as in the model fused by ``custom``; no
    entry names a node that neither model has (such as an Add this run wrote)."""
    from fusion.test_residual import llama_block

    model = llama_block(np.float16, layers=2)
    fused, _ = ort_rmsnorm.fuse(model)
    skips = [node.name for node in fused.graph.node if node.op_type == "SkipRMSNorm"]
    assert len(skips) == 4
    back, report = ort_rmsnorm.fuse(fused, "ort")
    names = {node.name for graph in (fused.graph, back.graph) for node in graph.node}
    assert sorted(name for entry in report.skipped for name in entry.nodes) == sorted(skips), report.summary()
    for entry in report.skipped:
        assert "normalizes the sum rounded to the type: written as the sum's Add" in entry.reason
        assert entry.fused_as in names and set(entry.nodes) <= names, entry
    for fusion in report.fusions:
        assert fusion.node in names and set(fusion.replaced_nodes) <= names, fusion
    result = verify(fused, back)
    assert result.ok, result.describe()


def test_a_rank_4_residual_norm_is_the_add_and_simplified_layer_normalization():
    """onnxruntime's residual op normalizes rank-2 and rank-3 inputs only."""
    model = norm_model(np.float32, skip=True, sum_output=True, x_shape=(2, 2, 3, 16),
                       constant_scale=np.ones(16, np.float32))
    back, report = ort_rmsnorm.fuse(model, "ort")
    assert [node.op_type for node in back.graph.node if node.op_type != "Constant"] == [
        "Add", "SimplifiedLayerNormalization"], report.summary()


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("target", TARGETS)
def test_round_trip_keeps_the_numbers(target, dtype):
    """A Llama-style model (residual norms) -> custom -> the target -> custom: each step passes ``verify`` against
    the original, and the last step gives back our ops, as many as the first."""
    skip_unless_runtime_runs(target, dtype)
    original = build_llama_onnx(LLAMA, dtype)
    custom, first = ort_rmsnorm.fuse(original, "custom")
    if target == "onnx":
        custom = _at_opset(custom, 23)
    back, second = ort_rmsnorm.fuse(custom, target)
    again, third = ort_rmsnorm.fuse(back, "custom")
    assert len(_ours(custom)) == len(first.fusions) == 2 * LLAMA.num_layers + 1
    assert len(second.fusions) == len(_ours(custom)) and not _ours(back), second.summary()
    assert len(_ours(again)) == len(_ours(custom)), third.summary()
    for step, model in (("custom", custom), (target, back), ("custom again", again)):
        result = verify(original, model)
        assert result.ok, f"{target} {dtype}, {step}: {result.describe()}"


def test_decomposed_is_plain_onnx_at_any_opset():
    """The decomposed target needs no schema but ONNX's: the checker passes at opset 13 and 18 (ReduceMean's axes an
    attribute, then an input)."""
    for opset in (13, 18):
        model = _at_opset(norm_model(np.float16, x_shape=SHAPE, constant_scale=np.ones(16, np.float16)), opset)
        back, _ = ort_rmsnorm.fuse(model, "decomposed")
        stripped = make_model(back.graph, [helper.make_opsetid("", opset)])
        # Y has X's shape; onnx 1.18's full check wants the shape of a graph output stated.
        stripped.graph.output[0].type.tensor_type.shape.CopyFrom(stripped.graph.input[0].type.tensor_type.shape)
        onnx.checker.check_model(stripped, full_check=True)
        reduce_mean = next(node for node in back.graph.node if node.op_type == "ReduceMean")
        assert (len(reduce_mean.input) == 2) == (opset >= 18)


# --- ops that break the contract are refused, not converted ---------------------------------------------------------

BROKEN = {
    # name: (skip, attributes, scale dtype, bias dtype, what the error names)
    "eps_outside_sqrt 7": (False, {"eps_outside_sqrt": 7}, np.float32, None, "'eps_outside_sqrt' is 7"),
    "eps_outside_sqrt -1 (SkipRMSNorm)": (True, {"eps_outside_sqrt": -1}, np.float32, None,
                                          "'eps_outside_sqrt' is -1"),
    "normalize_float32_sum 2": (True, {"normalize_float32_sum": 2}, np.float32, None,
                                "'normalize_float32_sum' is 2"),
    "normalize_float32_sum on RMSNorm": (False, {"normalize_float32_sum": 1}, np.float32, None,
                                         "'normalize_float32_sum' is SkipRMSNorm's"),
    "epsilon a string": (False, {"epsilon": "small"}, np.float32, None, "'epsilon' is not a float"),
    "float64 scale": (False, {}, np.float64, None, "scale is float64"),
    "int32 scale": (False, {}, np.int32, None, "scale is int32"),
    "float16 scale on float32": (True, {}, np.float16, None, "scale is float16"),
    "float32 bias on float16": (True, {}, np.float16, np.float32, "bias is float32"),
}


def _broken_model(name: str) -> onnx.ModelProto:
    skip, attributes, scale_dtype, bias_dtype, _ = BROKEN[name]
    x_dtype = np.float16 if bias_dtype is not None else np.float32
    scale = np.arange(1, SHAPE[-1] + 1).astype(scale_dtype)
    bias = np.zeros(SHAPE[-1], bias_dtype) if bias_dtype is not None else None
    model = norm_model(x_dtype, skip=skip, x_shape=SHAPE, constant_scale=scale, constant_bias=bias,
                       attributes={"epsilon": 1e-5, **attributes})
    if bias is not None:  # norm_model gives the bias X's type: this one is another
        model.graph.initializer[-1].CopyFrom(onnx.numpy_helper.from_array(bias, "bias"))
    return model


@pytest.mark.parametrize("target", ["decomposed", "ort", "onnx", "auto"])
@pytest.mark.parametrize("name", BROKEN)
def test_an_op_breaking_the_contract_is_refused(target, name):
    """onnxruntime with the library refuses such a node; turning it into plain or onnxruntime ops would give it a
    meaning it does not have. The error names the node and what is wrong."""
    model = _at_opset(_broken_model(name), 23 if target == "onnx" else 17)
    with pytest.raises(ValueError, match="norm0") as raised:
        ort_rmsnorm.fuse(model, target)
    assert BROKEN[name][-1] in str(raised.value) and "\n" not in str(raised.value)


def test_an_op_breaking_the_contract_is_refused_on_the_command_line(tmp_path):
    from cli.conftest import run_cli

    model = tmp_path / "broken.onnx"
    broken = _broken_model("eps_outside_sqrt 7")
    broken.graph.output[0].type.tensor_type.shape.dim.extend(  # a file passes onnx.checker: the shape is written
        helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, SHAPE).type.tensor_type.shape.dim)
    onnx.save(broken, model)
    for target in ("decomposed", "ort"):
        result = run_cli("fuse", model, tmp_path / "out.onnx", "--target", target, "--quiet")
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1, result
        assert "norm0" in lines[0] and "eps_outside_sqrt" in lines[0] and str(model) in lines[0], lines
        assert sorted(path.name for path in tmp_path.iterdir()) == ["broken.onnx"]


def test_the_valid_flags_keep_their_meaning():
    """0 and 1, written explicitly, convert as the defaults do: the numbers of test_our_op_written_back."""
    rng = np.random.default_rng(1)
    scale = random_array(rng, SHAPE[-1:], np.float32, offset=1.0)
    x = random_array(rng, SHAPE, np.float32)
    for flag in (0, 1):
        model = norm_model(np.float32, x_shape=SHAPE, constant_scale=scale,
                           attributes={"epsilon": 1e-3, "eps_outside_sqrt": flag})
        back, report = ort_rmsnorm.fuse(model, "decomposed")
        assert not _ours(back) and len(report.fusions) == 1
        expected, _ = rmsnorm(x, scale, axis=-1, epsilon=1e-3, eps_outside_sqrt=bool(flag))
        assert_matches_reference(_run(back, {"x": x})[0], expected, np.dtype(np.float32), f"flag {flag}")
