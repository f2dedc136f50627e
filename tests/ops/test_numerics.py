"""RMSNorm / SkipRMSNorm run in onnxruntime versus the float64 reference: every type pair, axis, epsilon placement,
scale layout, odd sizes and row counts."""

from __future__ import annotations

import itertools

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from op_models import RUNS_EMPTY_MIDDLE_INPUTS, TYPE_PAIRS, norm_model
from ort_rmsnorm.runtime import make_session, run
from reference import assert_matches_reference, random_array, rmsnorm

PAIR_IDS = [f"{x.name}-{s.name}" for x, s in TYPE_PAIRS]
EPSILON_MODES = [  # (epsilon, eps_outside_sqrt)
    (1e-5, 0),
    (1e-2, 1),
    (0.0, 0),
    (1e-2, 0),
]


def _session(model, threads=1):
    return make_session(model, threads=threads)


def _check(session, x_dtype, x, scale=None, skip=None, *, axis, epsilon, outside, sum_output=False, what="",
           bias=None, bias_fed=True, float32_sum=False):
    feeds = {"x": x}
    if skip is not None:
        feeds["skip"] = skip
    if scale is not None:
        feeds["scale"] = scale
    if bias is not None and bias_fed:
        feeds["bias"] = bias
    outputs = run(session, feeds)
    expected, h = rmsnorm(x, scale, axis=axis, epsilon=epsilon, eps_outside_sqrt=bool(outside), skip=skip, bias=bias,
                          normalize_float32_sum=float32_sum)
    assert outputs[0].dtype == x_dtype, f"{what}: output dtype {outputs[0].dtype} != {x_dtype}"
    assert_matches_reference(outputs[0], expected, x_dtype, what)
    if sum_output:
        assert outputs[1].dtype == x_dtype
        np.testing.assert_array_equal(outputs[1].view(np.uint8), h.view(np.uint8), err_msg=f"{what}: sum output")


@pytest.mark.parametrize("x_dtype,scale_dtype", TYPE_PAIRS, ids=PAIR_IDS)
@pytest.mark.parametrize("axis", [-1, -2, -3])
@pytest.mark.parametrize("epsilon,outside", EPSILON_MODES, ids=["eps1e-5", "eps-outside", "eps0", "eps1e-2"])
@pytest.mark.parametrize("skip", [False, True], ids=["rmsnorm", "skip"])
def test_type_pairs_axes_epsilon(rng, x_dtype, scale_dtype, axis, epsilon, outside, skip):
    normalized_rank = -axis
    scale_shape = ["a", "b"][2 - normalized_rank :] if normalized_rank <= 2 else ["r", "a", "b"]
    model = norm_model(
        x_dtype, scale_dtype, skip=skip, sum_output=skip, x_shape=("r", "a", "b"),
        scale_shape=scale_shape if normalized_rank <= 2 else None,
        attributes={"axis": axis, "epsilon": epsilon, "eps_outside_sqrt": outside},
    )
    session = _session(model)
    for shape in [(2, 3, 17), (1, 1, 1), (4, 2, 4097), (3, 5, 64)]:
        x = random_array(rng, shape, x_dtype, magnitude=0.05 if epsilon >= 1e-2 else 1.0)
        skip_value = random_array(rng, shape, x_dtype, magnitude=0.05 if epsilon >= 1e-2 else 1.0) if skip else None
        scale = None
        if normalized_rank <= 2:
            scale = (rng.uniform(-2, 2, shape[axis:])).astype(np.float32).astype(scale_dtype)
        _check(session, x_dtype, x, scale, skip_value, axis=axis, epsilon=epsilon, outside=outside,
               sum_output=skip, what=f"shape {shape}")


@pytest.mark.parametrize("x_dtype,scale_dtype", TYPE_PAIRS, ids=PAIR_IDS)
@pytest.mark.parametrize("cols", [1, 3, 17, 4095, 4097, 16384])
@pytest.mark.parametrize("rows", [0, 1, 7, 2000])
def test_odd_sizes_and_row_counts(rng, x_dtype, scale_dtype, cols, rows):
    model = norm_model(x_dtype, scale_dtype, x_shape=("rows", "cols"), scale_shape=["cols"])
    session = _session(model, threads=2)
    x = random_array(rng, (rows, cols), x_dtype)
    scale = rng.uniform(0.5, 1.5, cols).astype(np.float32).astype(scale_dtype)
    _check(session, x_dtype, x, scale, axis=-1, epsilon=1e-5, outside=0, what=f"{rows}x{cols}")


@pytest.mark.parametrize("x_dtype,scale_dtype", TYPE_PAIRS, ids=PAIR_IDS)
@pytest.mark.parametrize(
    "scale_shape,axis",
    [((64,), -1), ((1,), -1), ((1, 1, 64), -1), ((8, 64), -2), ((8, 1), -2), ((1, 64), -2), ((1,), -2), ((64,), -2)],
    ids=lambda v: str(v),
)
@pytest.mark.parametrize("constant", [False, True], ids=["input", "initializer"])
def test_scale_layouts(rng, x_dtype, scale_dtype, scale_shape, axis, constant):
    scale = rng.uniform(-2, 2, scale_shape).astype(np.float32).astype(scale_dtype)
    model = norm_model(
        x_dtype, scale_dtype, x_shape=("r", 8, 64), scale_shape=None if constant else scale_shape,
        constant_scale=scale if constant else None, attributes={"axis": axis},
    )
    session = _session(model)
    x = random_array(rng, (5, 8, 64), x_dtype)
    feeds_scale = None if constant else scale
    outputs = run(session, {"x": x, **({"scale": feeds_scale} if feeds_scale is not None else {})})
    expected, _ = rmsnorm(x, scale, axis=axis)
    assert_matches_reference(outputs[0], expected, x_dtype, f"scale {scale_shape}")


@pytest.mark.parametrize("x_dtype,scale_dtype", TYPE_PAIRS, ids=PAIR_IDS)
@pytest.mark.parametrize("float32_sum", [0, 1], ids=["rounded-sum", "float32-sum"])
@pytest.mark.parametrize(
    "bias_shape,axis,bias_kind",
    [(None, -1, "none"), ((64,), -1, "input"), ((64,), -1, "initializer"), ((1,), -1, "input"),
     ((8, 64), -2, "input"), ((8, 1), -2, "initializer"), ((64,), -2, "input")],
    ids=lambda v: str(v),
)
@pytest.mark.parametrize("sum_output", [False, True], ids=["no-sum", "sum"])
def test_skip_bias_and_float32_sum(rng, x_dtype, scale_dtype, float32_sum, bias_shape, axis, bias_kind, sum_output):
    """SkipRMSNorm's s = (x + skip) + bias in float32; `sum` is round_T(s) bit for bit, Y normalizes round_T(s) or,
    with normalize_float32_sum = 1, s itself. Skip small against x, so that rounding the sum moves many values."""
    bias = rng.standard_normal(bias_shape).astype(np.float32).astype(x_dtype) if bias_shape else None
    scale = rng.uniform(0.5, 1.5, (8, 64)[axis:]).astype(np.float32).astype(scale_dtype)
    model = norm_model(
        x_dtype, scale_dtype, skip=True, sum_output=sum_output, x_shape=("r", 8, 64), scale_shape=scale.shape,
        bias_shape=bias_shape if bias_kind == "input" else None,
        constant_bias=bias if bias_kind == "initializer" else None,
        attributes={"axis": axis, "normalize_float32_sum": float32_sum},
    )
    session = _session(model)
    for rows in (1, 5):
        x = random_array(rng, (rows, 8, 64), x_dtype)
        skip = random_array(rng, (rows, 8, 64), x_dtype, magnitude=1 / 64)
        _check(session, x_dtype, x, scale, skip, axis=axis, epsilon=1e-5, outside=0, sum_output=sum_output,
               bias=bias, bias_fed=bias_kind == "input", float32_sum=bool(float32_sum), what=f"{rows} rows")


@pytest.mark.parametrize("x_dtype", [np.dtype(np.float16), TYPE_PAIRS[3][0]], ids=str)
def test_float32_sum_is_not_the_rounded_sum(rng, x_dtype):
    """The two settings of normalize_float32_sum compute different functions for 16-bit types: each output is
    within tolerance of its own reference and, in some elements, outside the other's (rounding the sum moves an
    output by up to about one unit in the last place)."""
    x = random_array(rng, (16, 512), x_dtype)
    skip = random_array(rng, (16, 512), x_dtype, magnitude=1 / 64)
    outputs = {}
    for float32_sum in (0, 1):
        model = norm_model(x_dtype, skip=True, x_shape=("r", "d"), attributes={"normalize_float32_sum": float32_sum})
        (outputs[float32_sum],) = run(_session(model), {"x": x, "skip": skip})
    for float32_sum in (0, 1):
        own, _ = rmsnorm(x, skip=skip, normalize_float32_sum=bool(float32_sum))
        other, _ = rmsnorm(x, skip=skip, normalize_float32_sum=not float32_sum)
        assert_matches_reference(outputs[float32_sum], own, x_dtype, f"normalize_float32_sum={float32_sum}")
        with pytest.raises(AssertionError, match="outside tolerance"):
            assert_matches_reference(outputs[float32_sum], other, x_dtype, "the other setting's reference")


def test_float32_sum_is_the_same_computation_for_float32(rng):
    x, skip = random_array(rng, (8, 300), np.float32), random_array(rng, (8, 300), np.float32, magnitude=1 / 64)
    results = [run(_session(norm_model(np.float32, skip=True, sum_output=True, x_shape=("r", "d"),
                                       attributes={"normalize_float32_sum": value})), {"x": x, "skip": skip})
               for value in (0, 1)]
    for a, b in zip(*results):
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


def test_float32_sum_beyond_float16_range(rng):
    """float16 x + skip beyond 65504: `sum` is inf either way; the float32 sum is finite, and so is its norm."""
    x = np.full((2, 64), 60000.0, np.float16)
    skip = np.full((2, 64), 8000.0, np.float16)
    skip[:, ::2] = -8000.0
    model = norm_model(np.float16, skip=True, sum_output=True, x_shape=("r", "d"),
                       attributes={"normalize_float32_sum": 1})
    y, h = run(_session(model), {"x": x, "skip": skip})
    expected, expected_h = rmsnorm(x, skip=skip, normalize_float32_sum=True)
    assert np.isinf(h[:, 1::2]).all() and np.isfinite(expected).all()
    assert_matches_reference(y, expected, np.float16, "finite norm of the float32 sum")
    np.testing.assert_array_equal(h.view(np.uint16), expected_h.view(np.uint16))


@pytest.mark.parametrize("x_dtype", [np.dtype(np.float32), np.dtype(np.float16), TYPE_PAIRS[3][0]], ids=str)
@pytest.mark.parametrize("skip", [False, True])
def test_no_scale_and_sum_output_optional(rng, x_dtype, skip):
    model = norm_model(x_dtype, skip=skip, sum_output=False, x_shape=("r", "d"))
    session = _session(model)
    x = random_array(rng, (6, 40), x_dtype)
    skip_value = random_array(rng, (6, 40), x_dtype) if skip else None
    _check(session, x_dtype, x, None, skip_value, axis=-1, epsilon=1e-5, outside=0)


def test_empty_tensors(rng):
    model = norm_model(np.float32, np.float32, skip=True, sum_output=True, x_shape=("r", "d"), scale_shape=["d"])
    session = _session(model)
    for shape in [(0, 8), (4, 0), (0, 0)]:
        x = np.zeros(shape, np.float32)
        y, h = run(session, {"x": x, "skip": x, "scale": np.ones(shape[1:], np.float32)})
        assert y.shape == shape and h.shape == shape


@pytest.mark.parametrize("x_dtype", [np.dtype(np.float32), np.dtype(np.float16), TYPE_PAIRS[3][0]], ids=str)
def test_nan_and_inf_stay_in_their_row(x_dtype):
    model = norm_model(x_dtype, x_shape=("r", "d"), attributes={"epsilon": 1e-5})
    session = _session(model)
    x = np.ones((4, 16), np.float32)
    x[1, 3] = np.nan
    x[2, 5] = np.inf
    x[3, :] = 0.0
    x = x.astype(x_dtype)
    (y,) = run(session, {"x": x})
    expected, _ = rmsnorm(x)
    assert_matches_reference(y, expected, x_dtype, "special values")
    assert np.all(np.isnan(y[1].astype(np.float32)))
    assert np.all(y[3].astype(np.float32) == 0.0)
    assert np.all(y[0].astype(np.float32) == 1.0) or np.allclose(y[0].astype(np.float32), 1.0, rtol=1e-3)


@pytest.mark.parametrize(
    "x_dtype,values",
    [
        (np.dtype(np.float16), [65504.0, -60000.0]),  # squares overflow float16 but not float32
        (np.dtype(np.float16), [1e-7, -6e-8]),  # float16 subnormals
        (TYPE_PAIRS[3][0], [3.0e38, -1.0e38]),  # squares overflow float32: recomputed in float64
        (TYPE_PAIRS[3][0], [1e-38, -3e-39]),  # squares underflow float32
        (np.dtype(np.float32), [3.0e38, 1.0e30]),
        (np.dtype(np.float32), [1e-40, -1e-42]),
    ],
    ids=["f16-max", "f16-subnormal", "bf16-max", "bf16-tiny", "f32-max", "f32-subnormal"],
)
@pytest.mark.parametrize("epsilon", [0.0, 1e-6])
def test_values_near_type_limits(x_dtype, values, epsilon):
    model = norm_model(x_dtype, x_shape=("r", "d"), attributes={"epsilon": epsilon})
    session = _session(model)
    x = np.resize(np.array(values, np.float32), (3, 64)).astype(x_dtype)
    (y,) = run(session, {"x": x})
    expected, _ = rmsnorm(x, epsilon=epsilon)
    assert np.all(np.isfinite(expected)), "test data must have a representable result"
    assert_matches_reference(y, expected, x_dtype, f"values {values}")


def test_epsilon_placement_and_value_are_distinguishable(rng):
    """Tolerances must not hide semantic errors: with epsilon comparable to the mean square, the wrong placement or
    a dropped epsilon is hundreds of tolerances away."""
    x = random_array(rng, (4, 64), np.float32, magnitude=0.05)
    results = {}
    for epsilon, outside in [(1e-2, 0), (1e-2, 1), (0.0, 0)]:
        session = _session(norm_model(np.float32, x_shape=("r", "d"),
                                      attributes={"epsilon": epsilon, "eps_outside_sqrt": outside}))
        results[(epsilon, outside)] = run(session, {"x": x})[0].astype(np.float64)
    rtol, _ = __import__("reference").tolerance(np.float32)
    for a, b in itertools.combinations(results.values(), 2):
        assert np.max(np.abs(a - b) / np.abs(b)) > 100 * rtol


def test_additive_shift_is_not_removed(rng):
    """RMSNorm is not LayerNorm: adding a constant to every element changes the direction of the output."""
    session = _session(norm_model(np.float32, x_shape=("r", "d")))
    x = np.array([[1.0, 3.0]], np.float32)
    (y,) = run(session, {"x": x})
    (y_shifted,) = run(session, {"x": x + 2.0})
    expected_shifted, _ = rmsnorm(x + 2.0)
    assert_matches_reference(y_shifted, expected_shifted, np.float32)
    assert not np.allclose(y, y_shifted, atol=1e-2)


def test_thread_pool_result_matches_single_thread(rng):
    """Rows are independent, so splitting them over the pool must give bit-identical results."""
    model = norm_model(np.float32, np.float32, skip=True, sum_output=True, x_shape=("r", "d"), scale_shape=["d"])
    x = random_array(rng, (512, 1024), np.float32)
    s = random_array(rng, (512, 1024), np.float32)
    scale = rng.uniform(0.5, 1.5, 1024).astype(np.float32)
    one = run(_session(model, threads=1), {"x": x, "skip": s, "scale": scale})
    two = run(_session(model, threads=2), {"x": x, "skip": s, "scale": scale})
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a, b)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    shape=st.lists(st.integers(0, 40), min_size=1, max_size=4),
    data=st.data(),
    pair=st.sampled_from(range(len(TYPE_PAIRS))),
    skip=st.booleans(),
    outside=st.booleans(),
    epsilon=st.sampled_from([0.0, 1e-6, 1e-5, 0.1]),
)
def test_property_random_shapes(shape, data, pair, skip, outside, epsilon):
    x_dtype, scale_dtype = TYPE_PAIRS[pair]
    rank = len(shape)
    axis = data.draw(st.integers(-rank, rank - 1), label="axis")
    normalized = shape[axis % rank:]
    # A random broadcastable scale: each normalized dim kept or set to 1, maybe fewer leading dims.
    drop = data.draw(st.integers(0, len(normalized)), label="dropped leading dims")
    scale_shape = [d if data.draw(st.booleans()) else 1 for d in normalized[drop:]]
    use_scale = data.draw(st.booleans(), label="scale")
    # SkipRMSNorm: a bias of a random broadcastable shape, and either setting of normalize_float32_sum.
    bias_drop = data.draw(st.integers(0, len(normalized)), label="bias: dropped leading dims")
    bias_shape = [d if data.draw(st.booleans()) else 1 for d in normalized[bias_drop:]]
    use_bias = skip and data.draw(st.booleans(), label="bias") and (use_scale or RUNS_EMPTY_MIDDLE_INPUTS)
    float32_sum = skip and data.draw(st.booleans(), label="normalize_float32_sum")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    attributes = {"axis": axis, "epsilon": epsilon, "eps_outside_sqrt": int(outside)}
    if skip:
        attributes["normalize_float32_sum"] = int(float32_sum)
    model = norm_model(
        x_dtype, scale_dtype, skip=skip, sum_output=skip, x_shape=[f"d{i}" for i in range(rank)],
        scale_shape=[f"s{i}" for i in range(len(scale_shape))] if use_scale else None,
        bias_shape=[f"b{i}" for i in range(len(bias_shape))] if use_bias else None,
        attributes=attributes,
    )
    x = random_array(rng, shape, x_dtype)
    s = random_array(rng, shape, x_dtype) if skip else None
    scale = rng.uniform(-2, 2, scale_shape).astype(np.float32).astype(scale_dtype) if use_scale else None
    bias = random_array(rng, bias_shape, x_dtype) if use_bias else None
    _check(_session(model), x_dtype, x, scale, s, axis=axis, epsilon=epsilon, outside=outside, sum_output=skip,
           bias=bias, float32_sum=float32_sum,
           what=f"shape {shape} axis {axis} scale {scale_shape if use_scale else None} "
                f"bias {bias_shape if use_bias else None} float32_sum {float32_sum}")


def test_library_loads_in_a_default_session():
    session = ort.InferenceSession(norm_model(np.float32, x_shape=(2, 4)).SerializeToString(),
                                   __import__("ort_rmsnorm").session_options(), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"x": np.array([[1, 2, 3, 4], [0, 0, 0, 1]], np.float32)})
    expected, _ = rmsnorm(np.array([[1, 2, 3, 4], [0, 0, 0, 1]], np.float32))
    assert_matches_reference(y, expected, np.float32)


@pytest.mark.parametrize("x_dtype", [np.dtype(np.float32), np.dtype(np.float16), TYPE_PAIRS[3][0]], ids=str)
@pytest.mark.parametrize("op", ["rmsnorm", "skip", "skip+sum", "skip+bias+float32-sum", "skip+sum+bias+float32-sum"])
def test_large_outputs_match_small_ones_bit_for_bit(rng, x_dtype, op):
    """Outputs of several MB are written with streaming stores, in larger tasks, and rows are pipelined (each
    row scaled inside the next row's sum of squares): every row must have the bits it gets in smaller calls (ordinary
    stores, row by row), a row redone in double (it holds a NaN) among them, and the results match the reference."""
    skip = op != "rmsnorm"
    float32_sum = "float32-sum" in op
    model = norm_model(x_dtype, np.float32, skip=skip, sum_output="sum+" in op or op == "skip+sum",
                       x_shape=("r", "d"), scale_shape=["d"], bias_shape=["d"] if "bias" in op else None,
                       attributes={"normalize_float32_sum": 1} if float32_sum else None)
    session = _session(model, threads=2)
    # Rows of whole cache lines (streaming stores need them) that end in half a 64-element step: the tail each
    # pipelined row finishes after the next row's sum.
    rows, cols = 4096 if x_dtype.itemsize == 2 else 2048, 1056
    x, s = random_array(rng, (rows, cols), x_dtype), random_array(rng, (rows, cols), x_dtype)
    x[rows // 3, 5] = np.nan
    scale = rng.uniform(0.5, 1.5, cols).astype(np.float32)
    bias = rng.standard_normal(cols).astype(np.float32).astype(x_dtype) if "bias" in op else None

    def feeds(part):
        return {"x": x[part], "scale": scale, **({"skip": s[part]} if skip else {}),
                **({"bias": bias} if bias is not None else {})}

    large = run(session, feeds(slice(None)))
    chunk = 256  # 512 KB of float16 output: ordinary stores
    small = [run(session, feeds(slice(r, r + chunk))) for r in range(0, rows, chunk)]
    for output, got_large in enumerate(large):
        got_small = np.concatenate([parts[output] for parts in small])
        np.testing.assert_array_equal(got_large.view(np.uint8), got_small.view(np.uint8))
    expected, h = rmsnorm(x, scale, skip=s if skip else None, bias=bias, normalize_float32_sum=float32_sum)
    assert_matches_reference(large[0], expected, x_dtype, "large output")
    assert np.isnan(large[0][rows // 3]).all() and not np.isnan(np.delete(large[0], rows // 3, axis=0)).any()
    if len(large) > 1:
        np.testing.assert_array_equal(large[1].view(np.uint8), h.view(np.uint8))
