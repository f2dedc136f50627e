"""RMSNorm / SkipRMSNorm on onnxruntime's CUDAExecutionProvider against a float64 reference.

Skipped unless onnxruntime has the CUDA provider (onnxruntime-gpu), the library was built with CUDA, and a session
really runs on a GPU. Every session disables the CPU fallback, so a node that would not run on CUDA fails the test.
"""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import ort_rmsnorm
from ort_rmsnorm import runtime
from op_models import make_model

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
ONNX_TYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16,
              BFLOAT16: TensorProto.BFLOAT16}
UNIT_ROUNDOFF = {np.dtype(np.float32): 2.0**-24, np.dtype(np.float16): 2.0**-11, BFLOAT16: 2.0**-8}
SMALLEST_SUBNORMAL = {np.dtype(np.float32): 2.0**-149, np.dtype(np.float16): 2.0**-24, BFLOAT16: 2.0**-133}
TYPE_PAIRS = [(np.float32, np.float32), (np.float16, np.float16), (np.float16, np.float32),
              (BFLOAT16, BFLOAT16), (BFLOAT16, np.float32)]


def _model(op: str, x_shape, dtype, *, scale=None, scale_shape=None, scale_dtype=None, sum_output=False,
           bias=None, bias_shape=None, name="n0", **attributes) -> onnx.ModelProto:
    """One RMSNorm/SkipRMSNorm node. `scale`: an array (a constant initializer), None with `scale_shape` (a graph
    input), or None (no scale); SkipRMSNorm's `bias` (of X's type) likewise, with `bias_shape`."""
    dtype = np.dtype(dtype)
    inputs = [helper.make_tensor_value_info("x", ONNX_TYPES[dtype], x_shape)]
    node_inputs = ["x"]
    if op == "SkipRMSNorm":
        inputs.append(helper.make_tensor_value_info("skip", ONNX_TYPES[dtype], x_shape))
        node_inputs.append("skip")
    initializers = []
    if scale is not None:
        initializers.append(onnx.numpy_helper.from_array(np.asarray(scale), "scale"))
        node_inputs.append("scale")
    elif scale_shape is not None:
        inputs.append(helper.make_tensor_value_info("scale", ONNX_TYPES[np.dtype(scale_dtype)], scale_shape))
        node_inputs.append("scale")
    if bias is not None or bias_shape is not None:
        if len(node_inputs) < 3:
            node_inputs.append("")  # no scale
        if bias is not None:
            initializers.append(onnx.helper.make_tensor("bias", ONNX_TYPES[dtype], bias.shape,
                                                        bias.view(np.uint16 if dtype.itemsize == 2 else np.uint32)
                                                        .tobytes(), raw=True))
        else:
            inputs.append(helper.make_tensor_value_info("bias", ONNX_TYPES[dtype], bias_shape))
        node_inputs.append("bias")
    outputs = [helper.make_tensor_value_info("y", ONNX_TYPES[dtype], x_shape)]
    node_outputs = ["y"]
    if sum_output:
        outputs.append(helper.make_tensor_value_info("sum", ONNX_TYPES[dtype], x_shape))
        node_outputs.append("sum")
    node = helper.make_node(op, node_inputs, node_outputs, domain=ort_rmsnorm.OP_DOMAIN, name=name, **attributes)
    graph = helper.make_graph([node], "g", inputs, outputs, initializer=initializers)
    return make_model(graph, [helper.make_opsetid("", 17),
                                                   helper.make_opsetid(ort_rmsnorm.OP_DOMAIN, 1)])


def _cuda_options() -> ort.SessionOptions:
    options = ort_rmsnorm.session_options()
    options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    return options


def _session(model: onnx.ModelProto, provider_options: dict | None = None) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), _cuda_options(),
                                providers=[("CUDAExecutionProvider", provider_options or {})])


@functools.lru_cache(maxsize=None)
def _why_not_runnable() -> str | None:
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return "onnxruntime has no CUDAExecutionProvider (onnxruntime-gpu is not installed)"
    try:
        if not ort_rmsnorm.has_cuda():
            return "the ort_rmsnorm library was built without CUDA"
    except FileNotFoundError as error:
        return str(error)
    try:
        session = _session(_model("RMSNorm", [1, 8], np.float32))
    except Exception as error:  # no GPU, driver too old, ...
        return f"no CUDA session: {error}"
    if "CUDAExecutionProvider" not in session.get_providers():
        return "onnxruntime could not start the CUDA provider"
    return None


@pytest.fixture(autouse=True)
def _require_cuda():
    reason = _why_not_runnable()
    if reason:
        pytest.skip(reason)


def _reference(x, skip, scale_gains, axis, epsilon, eps_outside_sqrt, bias=None, float32_sum=False):
    """float64 reference of the contract. SkipRMSNorm: s = (x + skip) + bias in float32, h = round_T(s) (the `sum`
    output), and the normalized values are h, or s itself with normalize_float32_sum."""
    if skip is not None:
        s = x.astype(np.float32) + skip.astype(np.float32)
        if bias is not None:
            s = s + bias.astype(np.float32)
        with np.errstate(over="ignore"):
            h = s.astype(x.dtype)
        normalized = s if float32_sum else h
    else:
        h = normalized = x
    axes = tuple(range(axis % x.ndim, x.ndim))
    hd = normalized.astype(np.float64)
    mean_square = np.mean(hd * hd, axis=axes, keepdims=True)
    rms = np.sqrt(mean_square) + epsilon if eps_outside_sqrt else np.sqrt(mean_square + epsilon)
    return hd / rms * scale_gains, h


def _assert_close(got, want):
    dtype = got.dtype
    allowed = SMALLEST_SUBNORMAL[dtype] + (UNIT_ROUNDOFF[dtype] + 40 * 2.0**-24) * np.abs(want)
    error = np.abs(got.astype(np.float64) - want)
    assert np.array_equal(np.isnan(got.astype(np.float64)), np.isnan(want))
    worst = np.nanmax(error - allowed) if error.size else 0.0
    assert worst <= 0.0, f"beyond tolerance by {worst:.3g} (max |error| {np.nanmax(error):.3g})"


def _random(rng, shape, dtype, mean=0.3, sigma=1.0):
    """Normal values with a non-zero mean (RMSNorm does not center), rounded to `dtype`."""
    return ((rng.standard_normal(shape) + mean) * sigma).astype(np.float32).astype(dtype)


@pytest.mark.parametrize("dtype,scale_dtype", TYPE_PAIRS, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("shape,axis", [([2, 3, 768], -1), ([5, 4097], -1), ([2, 4, 16, 8], -2), ([3, 70000], -1),
                                        ([1, 16384], -1), ([7, 1], -1)])
@pytest.mark.parametrize("epsilon,eps_outside_sqrt", [(1e-5, 0), (0.0, 1), (1e-2, 1)])
def test_rmsnorm_matches_reference(dtype, scale_dtype, shape, axis, epsilon, eps_outside_sqrt):
    rng = np.random.default_rng(len(shape) * 1000 + shape[-1])
    normalized = shape[axis % len(shape):]
    scale = rng.uniform(-2, 2, normalized).astype(np.float32).astype(scale_dtype)
    x = _random(rng, shape, dtype, sigma=0.1 if epsilon == 1e-2 else 1.0)  # an epsilon that matters
    model = _model("RMSNorm", shape, dtype, scale=scale, axis=axis, epsilon=epsilon,
                   eps_outside_sqrt=eps_outside_sqrt)
    (y,) = runtime.run(_session(model), {"x": x})
    want, _ = _reference(x, None, scale.astype(np.float64), axis, epsilon, eps_outside_sqrt)
    assert y.dtype == np.dtype(dtype)
    _assert_close(y, want)


@pytest.mark.parametrize("dtype,scale_dtype", TYPE_PAIRS, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("cols", [768, 4095, 40000])
@pytest.mark.parametrize("sum_output", [True, False])
def test_skip_rmsnorm_matches_reference(dtype, scale_dtype, cols, sum_output):
    rng = np.random.default_rng(cols)
    shape = [3, 2, cols]
    x, skip = _random(rng, shape, dtype), _random(rng, shape, dtype, mean=0.0)
    scale = rng.uniform(-2, 2, [cols]).astype(np.float32).astype(scale_dtype)
    model = _model("SkipRMSNorm", shape, dtype, scale=scale, sum_output=sum_output, epsilon=1e-6)
    outputs = runtime.run(_session(model), {"x": x, "skip": skip})
    want, h = _reference(x, skip, scale.astype(np.float64), -1, 1e-6, False)
    _assert_close(outputs[0], want)
    if sum_output:
        assert np.array_equal(outputs[1].view(np.uint8), h.view(np.uint8)), "sum must be round_T(x + skip) exactly"


@pytest.mark.parametrize("dtype,scale_dtype", TYPE_PAIRS, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("cols", [768, 4095, 40000])
@pytest.mark.parametrize("float32_sum", [0, 1], ids=["rounded-sum", "float32-sum"])
@pytest.mark.parametrize("bias_kind", ["none", "constant", "input", "broadcast"])
@pytest.mark.parametrize("sum_output", [True, False])
def test_skip_rmsnorm_bias_and_float32_sum(dtype, scale_dtype, cols, float32_sum, bias_kind, sum_output):
    """s = (x + skip) + bias in float32; `sum` = round_T(s) bit for bit; Y normalizes round_T(s) or, with
    normalize_float32_sum = 1, s itself. Skips small against x, so that rounding the sum changes many outputs;
    rows of 40000 run the two-pass kernel, 4095 the scalar fallback."""
    rng = np.random.default_rng(cols + 10 * float32_sum)
    dtype = np.dtype(dtype)
    shape = [3, 2, cols]
    x, skip = _random(rng, shape, dtype), _random(rng, shape, dtype, mean=0.0, sigma=1 / 64)
    scale = rng.uniform(-2, 2, [cols]).astype(np.float32).astype(scale_dtype)
    bias = None if bias_kind == "none" else _random(rng, [1] if bias_kind == "broadcast" else [cols], dtype)
    model = _model("SkipRMSNorm", shape, dtype, scale=scale, sum_output=sum_output, epsilon=1e-6,
                   normalize_float32_sum=float32_sum, bias=bias if bias_kind in ("constant", "broadcast") else None,
                   bias_shape=[cols] if bias_kind == "input" else None)
    feeds = {"x": x, "skip": skip, **({"bias": bias} if bias_kind == "input" else {})}
    outputs = runtime.run(_session(model), feeds)
    want, h = _reference(x, skip, scale.astype(np.float64), -1, 1e-6, False, bias=bias, float32_sum=bool(float32_sum))
    _assert_close(outputs[0], want)
    if sum_output:
        assert np.array_equal(outputs[1].view(np.uint8), h.view(np.uint8)), "sum must be round_T(s) exactly"


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BFLOAT16], ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("scale_shape", [[8], [3, 1], [1], [1, 1, 8], []])
@pytest.mark.parametrize("constant", [True, False])
def test_broadcast_scales(dtype, scale_shape, constant):
    """Scales over X[..., 3, 8] normalized on the last two dims: per element, expanded, a single value; constant
    (expanded once at creation) or a graph input (expanded per call on the compute stream)."""
    rng = np.random.default_rng(7)
    shape = [4, 3, 8]
    x = _random(rng, shape, dtype)
    scale = rng.uniform(-2, 2, scale_shape).astype(np.float32).astype(dtype)
    if constant:
        model = _model("RMSNorm", shape, dtype, scale=scale, axis=-2)
        feeds = {"x": x}
    else:
        model = _model("RMSNorm", shape, dtype, scale_shape=scale_shape, scale_dtype=dtype, axis=-2)
        feeds = {"x": x, "scale": scale}
    (y,) = runtime.run(_session(model), feeds)
    gains = scale.astype(np.float64)
    gains = gains.reshape(gains.shape[max(0, gains.ndim - 2):])  # extra leading 1s dropped
    want, _ = _reference(x, None, gains, -2, 1e-5, False)
    _assert_close(y, want)


def test_constant_scale_with_dynamic_normalized_dims():
    """The constant's expansion cannot be made at creation when the normalized dims are dynamic: made per call."""
    rng = np.random.default_rng(3)
    scale = rng.uniform(-2, 2, [5, 1]).astype(np.float32)
    model = _model("RMSNorm", ["batch", 5, "width"], np.float32, scale=scale, axis=-2)
    session = _session(model)
    for width in (8, 33):
        x = _random(rng, [2, 5, width], np.float32)
        (y,) = runtime.run(session, {"x": x})
        want, _ = _reference(x, None, np.broadcast_to(scale.astype(np.float64), [5, width]), -2, 1e-5, False)
        _assert_close(y, want)


def test_no_scale_and_empty_input():
    model = _model("RMSNorm", ["rows", 64], np.float16)
    session = _session(model)
    x = _random(np.random.default_rng(0), [3, 64], np.float16)
    (y,) = runtime.run(session, {"x": x})
    _assert_close(y, _reference(x, None, 1.0, -1, 1e-5, False)[0])
    (empty,) = runtime.run(session, {"x": np.zeros([0, 64], np.float16)})
    assert empty.shape == (0, 64)


def test_statistic_beyond_float32_range():
    """bfloat16 values near 3e38 have squares beyond float32: such rows are redone in float64."""
    x = np.full([2, 256], 3e38, np.float32).astype(BFLOAT16)
    x[:, ::2] = -x[:, ::2]
    model = _model("RMSNorm", [2, 256], BFLOAT16, epsilon=0.0)
    (y,) = runtime.run(_session(model), {"x": x})
    _assert_close(y, _reference(x, None, 1.0, -1, 0.0, False)[0])


def test_errors_name_the_node():
    model = _model("SkipRMSNorm", ["a", "b"], np.float32, name="block3.norm")
    for dim, name in zip(model.graph.input[1].type.tensor_type.shape.dim, ["c", "d"]):
        dim.dim_param = name  # skip's shape independent of X's, so that only the kernel can object
    session = _session(model)
    with pytest.raises(Exception, match=r"SkipRMSNorm node 'block3.norm': skip of shape \[2, 4\] must have the "
                                        r"shape of X \[2, 3\]"):
        session.run(None, {"x": np.ones([2, 3], np.float32), "skip": np.ones([2, 4], np.float32)})
    with pytest.raises(Exception, match=r"RMSNorm node 'n0': axis 2 is out of range for X of shape \[3, 8\]"):
        _session(_model("RMSNorm", [3, 8], np.float32, axis=2))
    with pytest.raises(Exception, match=r"RMSNorm node 'n0': scale of shape \[4\] does not broadcast"):
        _session(_model("RMSNorm", [3, 8], np.float32, scale=np.ones([4], np.float32)))


def test_cuda_graph_capture():
    """With onnxruntime's CUDA graphs the op is captured once and replayed: no allocation, sync or device query
    may happen in a call."""
    rng = np.random.default_rng(11)
    shape = [8, 1024]
    scale = rng.uniform(-2, 2, [1024]).astype(np.float16)
    model = _model("SkipRMSNorm", shape, np.float16, scale=scale, sum_output=True)
    session = _session(model, {"enable_cuda_graph": "1"})
    x_device = ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, np.float16), "cuda", 0)
    skip_device = ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, np.float16), "cuda", 0)
    y_device = ort.OrtValue.ortvalue_from_shape_and_type(shape, np.float16, "cuda", 0)
    sum_device = ort.OrtValue.ortvalue_from_shape_and_type(shape, np.float16, "cuda", 0)
    binding = session.io_binding()
    binding.bind_ortvalue_input("x", x_device)
    binding.bind_ortvalue_input("skip", skip_device)
    binding.bind_ortvalue_output("y", y_device)
    binding.bind_ortvalue_output("sum", sum_device)
    gains = scale.astype(np.float64)
    for _ in range(3):  # the first run captures, the next ones replay with new inputs in the same buffers
        x, skip = _random(rng, shape, np.float16), _random(rng, shape, np.float16, mean=0.0)
        x_device.update_inplace(x)
        skip_device.update_inplace(skip)
        session.run_with_iobinding(binding)
        want, h = _reference(x, skip, gains, -1, 1e-5, False)
        _assert_close(y_device.numpy(), want)
        assert np.array_equal(sum_device.numpy(), h)
