"""Loads the library into whatever onnxruntime this interpreter has (used with old releases by
scripts/test-ort-compat) and checks RMSNorm/SkipRMSNorm numerics against the float64 reference, with and without
SkipRMSNorm's optional `sum` output, with its optional bias and normalize_float32_sum, and in a residual chain as
the pass writes it (the last norm without `sum`), and the output shapes the library infers for onnxruntime.

usage: python check_runtime.py LIBRARY_PATH
"""

import os
import sys

import numpy as np
import onnxruntime as ort
from onnx import helper

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from op_models import ONNX_TYPE, norm_model  # noqa: E402
from reference import assert_matches_reference, random_array, rmsnorm  # noqa: E402

ROWS, HIDDEN = 300, 1000
RELEASE = int(ort.__version__.split(".")[1])


def residual_chain(dtype):
    """y1, h1 = SkipRMSNorm(x, skip); y2 = SkipRMSNorm(h1, y1) without `sum`: a decoder's last two norms, fused."""
    elem = ONNX_TYPE[np.dtype(dtype)]
    nodes = [
        helper.make_node("SkipRMSNorm", ["x", "skip", "scale"], ["y1", "h1"], name="norm1", domain="ort_rmsnorm"),
        helper.make_node("SkipRMSNorm", ["h1", "y1", "scale"], ["y2"], name="norm2", domain="ort_rmsnorm"),
    ]
    inputs = [helper.make_tensor_value_info(name, elem, ["r", "d"]) for name in ("x", "skip")]
    inputs.append(helper.make_tensor_value_info("scale", elem, ["d"]))
    outputs = [helper.make_tensor_value_info(name, elem, None) for name in ("y1", "h1", "y2")]
    graph = helper.make_graph(nodes, "chain", inputs, outputs)
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ort_rmsnorm", 1)], ir_version=9
    )


def check_shapes(session, what, first_y):
    """Every output gets X's shape from 1.28. Before it the library cannot ask whether a SkipRMSNorm has `sum` and
    leaves `sum`'s shape (and what a chain computes from it) to onnxruntime: only the first norm's Y is inferred.
    Before 1.17 (C API 17) a custom op cannot infer shapes at all."""
    for output in session.get_outputs():
        if RELEASE >= 28 or (RELEASE >= 17 and output.name == first_y):
            assert output.shape == ["r", "d"], f"{what}: output {output.name} inferred as {output.shape}"


def main(library: str) -> None:
    options = ort.SessionOptions()
    options.register_custom_ops_library(library)
    options.intra_op_num_threads = 2
    rng = np.random.default_rng(0)

    def session_for(model):
        return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])

    for dtype in (np.float32, np.float16):
        x = random_array(rng, (ROWS, HIDDEN), dtype)
        s = random_array(rng, (ROWS, HIDDEN), dtype)
        w = rng.uniform(0.5, 1.5, HIDDEN).astype(dtype)
        for skip, sum_output in ((False, False), (True, True), (True, False)):
            what = f"{dtype.__name__} skip={skip} sum={sum_output}"
            model = norm_model(dtype, dtype, skip=skip, sum_output=sum_output, x_shape=("r", "d"), scale_shape=["d"],
                               attributes={"epsilon": 1e-5, "axis": -1})
            session = session_for(model)
            check_shapes(session, what, "y")
            outputs = session.run(None, {"x": x, "scale": w, **({"skip": s} if skip else {})})
            expected, h = rmsnorm(x, w, skip=s if skip else None)
            assert_matches_reference(outputs[0], expected, np.dtype(dtype), what)
            if sum_output:
                np.testing.assert_array_equal(outputs[1], h)

        for float32_sum, sum_output in ((1, True), (1, False), (0, True)):
            what = f"{dtype.__name__} skip+bias normalize_float32_sum={float32_sum} sum={sum_output}"
            bias = random_array(rng, (HIDDEN,), dtype)
            model = norm_model(dtype, dtype, skip=True, sum_output=sum_output, x_shape=("r", "d"), scale_shape=["d"],
                               bias_shape=["d"], attributes={"epsilon": 1e-5, "normalize_float32_sum": float32_sum})
            session = session_for(model)
            check_shapes(session, what, "y")
            outputs = session.run(None, {"x": x, "skip": s, "scale": w, "bias": bias})
            expected, h = rmsnorm(x, w, skip=s, bias=bias, normalize_float32_sum=bool(float32_sum))
            assert_matches_reference(outputs[0], expected, np.dtype(dtype), what)
            if sum_output:
                np.testing.assert_array_equal(outputs[1], h)

        session = session_for(residual_chain(dtype))
        check_shapes(session, f"{dtype.__name__} residual chain", "y1")
        y1, h1, y2 = session.run(None, {"x": x, "skip": s, "scale": w})
        expected1, expected_h1 = rmsnorm(x, w, skip=s)
        assert_matches_reference(y1, expected1, np.dtype(dtype), f"{dtype.__name__} chain y1")
        np.testing.assert_array_equal(h1, expected_h1)
        assert_matches_reference(y2, rmsnorm(h1, w, skip=y1)[0], np.dtype(dtype), f"{dtype.__name__} chain y2")
    print(f"onnxruntime {ort.__version__}: RMSNorm and SkipRMSNorm (with and without sum, bias and the float32 sum, "
          "in a chain) OK")


if __name__ == "__main__":
    main(sys.argv[1])
