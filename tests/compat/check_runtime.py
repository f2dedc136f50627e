"""Loads the library into whatever onnxruntime this interpreter has (used with old releases by
scripts/test-ort-compat) and checks RMSNorm/SkipRMSNorm numerics against the float64 reference.

usage: python check_runtime.py LIBRARY_PATH
"""

import os
import sys

import numpy as np
import onnxruntime as ort

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from op_models import norm_model  # noqa: E402
from reference import assert_matches_reference, random_array, rmsnorm  # noqa: E402


def main(library: str) -> None:
    options = ort.SessionOptions()
    options.register_custom_ops_library(library)
    options.intra_op_num_threads = 2
    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float16):
        for skip in (False, True):
            model = norm_model(dtype, dtype, skip=skip, sum_output=skip, x_shape=("r", "d"), scale_shape=["d"],
                               attributes={"epsilon": 1e-5, "axis": -1})
            session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
            x = random_array(rng, (300, 1000), dtype)
            s = random_array(rng, (300, 1000), dtype)
            w = rng.uniform(0.5, 1.5, 1000).astype(dtype)
            feeds = {"x": x, "scale": w, **({"skip": s} if skip else {})}
            outputs = session.run(None, feeds)
            expected, h = rmsnorm(x, w, skip=s if skip else None)
            assert_matches_reference(outputs[0], expected, np.dtype(dtype), f"{dtype.__name__} skip={skip}")
            if skip:
                np.testing.assert_array_equal(outputs[1], h)
    print(f"onnxruntime {ort.__version__}: RMSNorm and SkipRMSNorm OK")


if __name__ == "__main__":
    main(sys.argv[1])
