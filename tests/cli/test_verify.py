"""`ort-rmsnorm verify` and the pieces it is made of: input generation, dims, tolerances, exit codes."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnx_ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from ort_rmsnorm import feeds, verify
from ort_rmsnorm.runtime import make_session
from op_models import make_model

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
UNIT_ROUNDOFF = {np.dtype(np.float32): 2.0**-24, np.dtype(np.float16): 2.0**-11, BFLOAT16: 2.0**-8}


# --- comparison -----------------------------------------------------------------------------------------------------


def _output(dtype, seed=0, shape=(4, 64)):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float16, BFLOAT16])
def test_one_rounding_difference_passes(dtype):
    """The fused op rounds x * factor * scale once where the HF graph rounds the norm, then the product: the two
    results differ by about one unit in the last place, which must pass."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 256))
    weight = (1 + 0.1 * rng.standard_normal(256)).astype(dtype)
    normalized = x / np.sqrt(np.mean(x**2, axis=-1, keepdims=True) + 1e-6)
    twice = (normalized.astype(np.float32).astype(dtype) * weight).astype(dtype)  # unfused: two roundings
    once = (normalized * weight.astype(np.float64)).astype(dtype)  # fused: one rounding
    assert not np.array_equal(once, twice)
    comparison = verify.compare("y", twice, once)
    assert comparison.ok, comparison.describe()
    assert comparison.max_rel <= 2 * UNIT_ROUNDOFF[np.dtype(dtype)] * 2


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BFLOAT16])
@pytest.mark.parametrize("error", ["lost_scale", "wrong_axis", "lost_epsilon"])
def test_semantic_errors_fail(dtype, error):
    """A lost scale, a norm over the wrong axis or a lost epsilon is far outside every tolerance."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((8, 64)) * np.where(np.arange(8) == 3, 1e-3, 1.0)[:, None]  # one row with small values
    weight = 1 + 0.5 * rng.standard_normal(64)
    epsilon = 1e-5

    def norm(values, axis=-1, eps=epsilon, scale=weight):
        return values / np.sqrt(np.mean(values**2, axis=axis, keepdims=True) + eps) * scale

    wrong = {"lost_scale": norm(x, scale=1.0), "wrong_axis": norm(x, axis=0), "lost_epsilon": norm(x, eps=0.0)}[error]
    comparison = verify.compare("y", norm(x).astype(dtype), wrong.astype(dtype))
    assert not comparison.ok, comparison.describe()


def test_nan_placement_and_shape_and_dtype_changes_fail():
    original = _output(np.float32)
    with_nan = original.copy()
    with_nan[1, 2] = np.nan
    assert verify.compare("y", with_nan, with_nan.copy()).ok
    assert "NaN" in verify.compare("y", original, with_nan).problem
    assert "NaN" in verify.compare("y", with_nan, original).problem
    assert "shape changed" in verify.compare("y", original, original[:2]).problem
    assert "dtype changed" in verify.compare("y", original, original.astype(np.float16)).problem


@pytest.mark.parametrize(
    "output, arithmetic, tolerance, named",
    [
        (np.float32, np.float16, 2.0**-7, True),  # float16 model, logits cast to float32 at the end
        (np.float32, BFLOAT16, 2.0**-4, True),
        (np.float64, np.float32, 2.0**-14, True),  # float64 output computed in float32
        (np.float16, np.float32, 2.0**-7, False),  # more precise arithmetic: the output's own tolerance
        (np.float32, None, 2.0**-14, False),
    ],
)
def test_tolerance_follows_the_models_least_precise_arithmetic(output, arithmetic, tolerance, named):
    """A float32 output of a float16 model carries float16 rounding differences: one float16 rounding flip at a
    norm, carried on by the layers after it, must pass; a lost scale must still fail."""
    arithmetic = None if arithmetic is None else np.dtype(arithmetic)
    original = _output(output, seed=3)
    comparison = verify.compare("logits", original, original.copy(), arithmetic)
    assert comparison.tolerance == tolerance
    assert ("for the model's" in comparison.describe()) == named, comparison.describe()
    if named:
        assert f"for the model's {arithmetic} arithmetic" in comparison.describe()
    rounded_twice = original.astype(np.float64) * (1 + 4 * UNIT_ROUNDOFF[arithmetic or np.dtype(output)])
    assert verify.compare("logits", original, rounded_twice.astype(output), arithmetic).ok
    assert not verify.compare("logits", original, (original * 1.1).astype(output), arithmetic).ok


def _cast_chain(*steps, constant_dtype=None):
    """x (float32) -> Cast to each of ``steps`` in turn -> y; with ``constant_dtype``, y also adds a Constant of that
    type cast to float32, and a float16 initializer cast to float32 (given values, not arithmetic)."""
    nodes, previous = [], "x"
    for index, elem in enumerate(steps):
        nodes.append(helper.make_node("Cast", [previous], [f"c{index}"], to=elem))
        previous = f"c{index}"
    initializers = [numpy_helper.from_array(np.ones(4, np.float16), "w16")]
    nodes += [helper.make_node("Cast", ["w16"], ["w"], to=TensorProto.FLOAT),
              helper.make_node("Add", [previous, "w"], ["y"])]
    if constant_dtype is not None:
        nodes[-1].output[0] = "partial"
        nodes += [helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.ones(4, constant_dtype))),
                  helper.make_node("Cast", ["k"], ["k32"], to=TensorProto.FLOAT),
                  helper.make_node("Add", ["partial", "k32"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], initializers)
    return make_model(graph, [helper.make_opsetid("", 18)])


@pytest.mark.parametrize(
    "steps, constant_dtype, expected",
    [
        ((TensorProto.FLOAT16, TensorProto.FLOAT), None, np.float16),
        ((TensorProto.BFLOAT16, TensorProto.FLOAT16, TensorProto.FLOAT), None, BFLOAT16),
        ((TensorProto.DOUBLE, TensorProto.FLOAT), None, np.float32),
        ((), np.float16, np.float32),  # float16 weights and constants only: float32 arithmetic
    ],
)
def test_arithmetic_dtype_is_the_least_precise_computed_float(steps, constant_dtype, expected):
    model = onnx_ir.serde.deserialize_model(_cast_chain(*steps, constant_dtype=constant_dtype))
    assert verify.arithmetic_dtype(model) == np.dtype(expected)


def test_integer_outputs_compare_exactly():
    original = np.arange(10, dtype=np.int64)
    assert verify.compare("ids", original, original.copy()).ok
    changed = original.copy()
    changed[3] += 1
    assert not verify.compare("ids", original, changed).ok


# --- inputs ---------------------------------------------------------------------------------------------------------


def _model(inputs, output_dtype=TensorProto.FLOAT):
    """A model with the given ``(name, elem_type, shape)`` inputs whose output is the first input's Identity."""
    infos = [helper.make_tensor_value_info(name, elem, shape) for name, elem, shape in inputs]
    y = helper.make_tensor_value_info("y", output_dtype, None)
    graph = helper.make_graph([helper.make_node("Identity", [inputs[0][0]], ["y"])], "g", infos, [y])
    return make_model(graph, [helper.make_opsetid("", 18)])


def _feeds(model, **options):
    return feeds.make_inputs(make_session(model).get_inputs(), **options)


def test_symbolic_dims_defaults_overrides_and_expressions():
    model = _model([
        ("x", TensorProto.FLOAT, ["batch", "sequence", 8]),
        ("past", TensorProto.FLOAT, ["batch", "past_sequence_length", 8]),
        ("attention_mask", TensorProto.INT64, ["batch", "past_sequence_length + sequence"]),
        ("free", TensorProto.FLOAT, [None, 3]),
    ])
    feeds = _feeds(model)
    assert feeds["x"].shape == (2, 4, 8)
    assert feeds["past"].shape == (2, 0, 8)
    assert feeds["attention_mask"].shape == (2, 4)
    assert feeds["free"].shape == (4, 3)
    feeds = _feeds(model, dims={"sequence": 5, "past_sequence_length": 3, "batch": 1})
    assert feeds["x"].shape == (1, 5, 8) and feeds["past"].shape == (1, 3, 8)
    assert feeds["attention_mask"].shape == (1, 8)


def test_integer_and_bool_inputs_get_valid_values():
    model = _model([
        ("input_ids", TensorProto.INT64, ["batch", "sequence"]),
        ("attention_mask", TensorProto.INT64, ["batch", "sequence"]),
        ("position_ids", TensorProto.INT32, ["batch", "sequence"]),
        ("causal_mask", TensorProto.BOOL, ["sequence", "sequence"]),
    ], output_dtype=TensorProto.INT64)
    feeds = _feeds(model, dims={"sequence": 6})
    ids = feeds["input_ids"]
    assert ids.dtype == np.int64 and 1 <= ids.min() and ids.max() < 16
    assert (feeds["attention_mask"] == 1).all()
    assert feeds["position_ids"].dtype == np.int32
    assert (feeds["position_ids"] == np.arange(6)).all()
    assert feeds["causal_mask"].all()


def test_inputs_are_deterministic_and_seeded():
    model = _model([("x", TensorProto.FLOAT16, ["batch", 8])], TensorProto.FLOAT16)
    first, again, other = _feeds(model), _feeds(model), _feeds(model, seed=1)
    assert first["x"].dtype == np.float16
    assert np.array_equal(first["x"], again["x"]) and not np.array_equal(first["x"], other["x"])


def test_given_inputs_bind_their_dims():
    model = _model([("x", TensorProto.FLOAT, ["batch", "sequence", 8]),
                    ("mask", TensorProto.INT64, ["batch", "sequence"])])
    given = np.ones((3, 7, 8), np.float32)
    feeds = _feeds(model, given={"x": given})
    assert feeds["x"] is given or np.array_equal(feeds["x"], given)
    assert feeds["mask"].shape == (3, 7)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"dims": {"nope": 3}}, "--dim nope: no input has such a dim; the model's symbolic dims are: batch"),
        ({"given": {"nope": np.ones(2)}}, "--input nope: the model has no such input; its inputs are: x"),
        ({"given": {"x": np.ones((2, 8))}}, "input 'x': the given array is float64, the model expects float32"),
        ({"given": {"x": np.ones((2, 9), np.float32)}}, "input 'x': the given array has shape [2, 9]"),
        ({"given": {"x": np.ones((2,), np.float32)}}, "the model expects rank 2"),
        ({"given": {"x": np.ones((2, 8), np.float32)}, "dims": {"batch": 3}}, "dim 0 ('batch') is 2 in the given"),
        ({"dims": {"batch": 10**14}}, "the generated inputs would take 2,980,232 GiB (input 'x' of shape "
                                      "[100000000000000, 8]: 2,980,232 GiB), more than a quarter of this machine's"),
    ],
)
def test_bad_dims_and_inputs_are_clear_errors(options, message):
    model = _model([("x", TensorProto.FLOAT, ["batch", 8])])
    with pytest.raises(feeds.VerifyInputError) as info:
        _feeds(model, **options)
    assert message in str(info.value)


def test_bfloat16_inputs_from_npy(tmp_path):
    array = np.arange(6, dtype=np.float32).reshape(2, 3).astype(BFLOAT16)
    np.save(tmp_path / "x.npy", array)  # stored as 2-byte records
    loaded = feeds.load_npy_inputs({"x": tmp_path / "x.npy"})
    model = _model([("x", TensorProto.BFLOAT16, ["batch", 3])], TensorProto.BFLOAT16)
    made = _feeds(model, given=loaded)
    assert made["x"].dtype == BFLOAT16 and np.array_equal(made["x"], array)


# --- the command ----------------------------------------------------------------------------------------------------


def _scaled_copy(source, destination, factor: float, initializer_suffix: str = "input_layernorm.weight"):
    """A copy of ``source`` whose first initializer ending in ``initializer_suffix`` is multiplied by ``factor``."""
    model = onnx.load(source)
    for index, tensor in enumerate(model.graph.initializer):
        if tensor.name.endswith(initializer_suffix):
            model.graph.initializer[index].CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor) * factor,
                                                                            tensor.name))
            break
    onnx.save(model, destination)
    return destination


def test_verify_identical_models_passes(cli, small_llama):
    result = cli("verify", small_llama, small_llama)
    assert result.returncode == 0, result
    assert "inputs: input_ids int64 [2, 4]" in result.stdout
    assert "output 'logits' float32 [2, 4, 128]: max abs 0, max rel 0" in result.stdout
    assert "verify: all of 1 outputs match" in result.stdout


def test_verify_of_empty_outputs_says_so(cli, small_llama):
    result = cli("verify", small_llama, small_llama, "--dim", "batch=0")
    assert result.returncode == 0 and "empty, nothing to compare: ok" in result.stdout, result


def test_verify_mismatch_exits_1(cli, small_llama, tmp_path):
    changed = _scaled_copy(small_llama, tmp_path / "changed.onnx", 1.25)
    result = cli("verify", small_llama, changed)
    assert result.returncode == 1, result
    assert "MISMATCH" in result.stdout


def test_verify_with_dims_and_input_file(cli, small_llama, tmp_path):
    ids = np.arange(1, 16, dtype=np.int64).reshape(3, 5)
    np.save(tmp_path / "ids.npy", ids)
    result = cli("verify", small_llama, small_llama, "--input", f"input_ids={tmp_path / 'ids.npy'}")
    assert result.returncode == 0, result
    assert "inputs: input_ids int64 [3, 5]" in result.stdout
    result = cli("verify", small_llama, small_llama, "--dim", "batch=1", "--dim", "sequence=9")
    assert result.returncode == 0 and "input_ids int64 [1, 9]" in result.stdout


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--dim", "nope=3"], "--dim nope: no input has such a dim"),
        (["--dim", "batch=x"], "--dim 'batch=x': the size must be a non-negative integer"),
        (["--input", "input_ids=/nonexistent.npy"], "--input input_ids=/nonexistent.npy: no such file"),
        (["--seed", "-1"], "argument --seed: '-1' is not a non-negative integer"),
        (["--dim", "batch=99999999999"], "the generated inputs would take 2,980 GiB"),
    ],
)
def test_verify_bad_options_exit_2(cli, small_llama, arguments, message):
    result = cli("verify", small_llama, small_llama, *arguments)
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ort-rmsnorm verify: error: ") and message in lines[0], lines


def test_verify_changed_interface_is_a_mismatch(cli, small_llama, tmp_path):
    model = onnx.load(small_llama)
    model.graph.output[0].name = "renamed"
    model.graph.node[-1].output[0] = "renamed"
    onnx.save(model, tmp_path / "renamed.onnx")
    result = cli("verify", small_llama, tmp_path / "renamed.onnx")
    assert result.returncode == 1 and "inputs/outputs" in result.stdout, result


def test_verify_unreadable_model_exits_2(cli, small_llama, tmp_path):
    (tmp_path / "bad.onnx").write_bytes(b"not a model")
    result = cli("verify", small_llama, tmp_path / "bad.onnx")
    assert result.returncode == 2 and "bad.onnx: not a readable ONNX model" in result.stderr, result
