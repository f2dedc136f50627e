"""One-node models using our ops, for the operator tests, and the tensor and model helpers every test builds with."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from reference import BFLOAT16

ONNX_TYPE = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16, BFLOAT16: TensorProto.BFLOAT16}

# The (X, scale) type pairs of the contract.
TYPE_PAIRS = [
    (np.dtype(np.float32), np.dtype(np.float32)),
    (np.dtype(np.float16), np.dtype(np.float16)),
    (np.dtype(np.float16), np.dtype(np.float32)),
    (BFLOAT16, BFLOAT16),
    (BFLOAT16, np.dtype(np.float32)),
]


def tensor_proto(name: str, array) -> onnx.TensorProto:
    """numpy_helper.from_array, also for bfloat16 arrays (which onnx < 1.19 does not take)."""
    array = np.asarray(array)
    if array.dtype == BFLOAT16:
        return helper.make_tensor(name, TensorProto.BFLOAT16, array.shape, array.view(np.uint16).tobytes(), raw=True)
    return numpy_helper.from_array(array, name)


def tensor_array(tensor: onnx.TensorProto) -> np.ndarray:
    """numpy_helper.to_array, with bfloat16 as ml_dtypes' bfloat16 (onnx < 1.19 returns a structured uint16)."""
    if tensor.data_type != TensorProto.BFLOAT16:
        return numpy_helper.to_array(tensor)
    if tensor.HasField("raw_data"):
        bits = np.frombuffer(tensor.raw_data, np.uint16)
    else:
        bits = np.array(tensor.int32_data, np.uint16)
    return bits.view(BFLOAT16).reshape(tuple(tensor.dims))


ORT_RELEASE = tuple(int(part) for part in ort.__version__.split(".")[:2])


def skip_unless_runtime_runs(target: str, dtype: str = "float32") -> None:
    """Skips the rest of a test when the installed onnxruntime cannot run what the pass emits for ``target``:
    opset 23 (the onnx target) from 1.23, bfloat16 SimplifiedLayerNormalization on CPU from 1.30 (docs/fusion.md)."""
    import pytest  # here: tests/compat/check_runtime.py imports this module in venvs without pytest
    if target == "onnx" and ORT_RELEASE < (1, 23):
        pytest.skip(f"onnxruntime {ort.__version__} does not run opset 23 (1.23 does)")
    if target == "ort" and dtype == "bfloat16" and ORT_RELEASE < (1, 30):
        pytest.skip(f"onnxruntime {ort.__version__} has no bfloat16 SimplifiedLayerNormalization CPU kernel (1.30 has)")


# onnxruntime 1.20 to 1.23 crash (SIGSEGV inside onnxruntime, before our kernel is made) creating a session that
# holds a custom-op node with an empty-named optional input before a given one: SkipRMSNorm with a bias and no scale
# (docs/ops.md). 1.24 and later do not.
RUNS_EMPTY_MIDDLE_INPUTS = ORT_RELEASE >= (1, 24)


def make_model(graph: onnx.GraphProto, opset_imports, **kwargs) -> onnx.ModelProto:
    """helper.make_model stating the oldest IR version its default-domain opset allows, as exporters do, rather than
    the installed onnx's newest, which older onnxruntime releases refuse (IR 11 needs onnxruntime 1.23)."""
    default = [opset for opset in opset_imports if opset.domain in ("", "ai.onnx")]
    return helper.make_model(graph, opset_imports=opset_imports, ir_version=helper.find_min_ir_version_for(default),
                             **kwargs)


def norm_model(
    x_dtype,
    scale_dtype=None,
    *,
    skip: bool = False,
    sum_output: bool = False,
    x_shape=("rows", "a", "b"),
    scale_shape=None,
    constant_scale: np.ndarray | None = None,
    bias_shape=None,
    constant_bias: np.ndarray | None = None,
    attributes: dict | None = None,
    node_name: str = "norm0",
) -> onnx.ModelProto:
    """RMSNorm (or SkipRMSNorm) over input `x` (and `skip`); the scale is a graph input of `scale_shape`, or the
    initializer `constant_scale`, or absent; SkipRMSNorm's bias (of X's type) likewise from `bias_shape` or
    `constant_bias` (an absent scale is then the empty input name)."""
    x_type = ONNX_TYPE[np.dtype(x_dtype)]
    inputs = [helper.make_tensor_value_info("x", x_type, list(x_shape) if x_shape is not None else None)]
    node_inputs = ["x"]
    initializers = []
    if skip:
        inputs.append(helper.make_tensor_value_info("skip", x_type, list(x_shape) if x_shape is not None else None))
        node_inputs.append("skip")
    if constant_scale is not None:
        initializers.append(tensor_proto("scale", constant_scale))
        node_inputs.append("scale")
    elif scale_shape is not None:
        inputs.append(helper.make_tensor_value_info("scale", ONNX_TYPE[np.dtype(scale_dtype)], list(scale_shape)))
        node_inputs.append("scale")
    if constant_bias is not None or bias_shape is not None:
        if len(node_inputs) < 3:
            node_inputs.append("")  # no scale
        if constant_bias is not None:
            initializers.append(tensor_proto("bias", constant_bias))
        else:
            inputs.append(helper.make_tensor_value_info("bias", x_type, list(bias_shape)))
        node_inputs.append("bias")
    outputs = [helper.make_tensor_value_info("y", x_type, None)]
    node_outputs = ["y"]
    if sum_output:
        outputs.append(helper.make_tensor_value_info("sum", x_type, None))
        node_outputs.append("sum")
    node = helper.make_node(
        "SkipRMSNorm" if skip else "RMSNorm", node_inputs, node_outputs, name=node_name, domain="ort_rmsnorm",
        **(attributes or {}),
    )
    graph = helper.make_graph([node], "norm", inputs, outputs, initializer=initializers)
    return make_model(graph, [helper.make_opsetid("", 17), helper.make_opsetid("ort_rmsnorm", 1)])
