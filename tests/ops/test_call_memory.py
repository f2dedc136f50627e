"""The memory a call needs beyond its tensors is not kept after one huge row: a serving process that once gets a
[1, 2^25] float16 row (a float32 row of ones for an absent scale, a float32 copy of a float16 scale, or the float32
sum SkipRMSNorm stages) goes back to about its resident size once it runs small rows again. Each case runs in a
process of its own, with onnxruntime's arena off (the arena keeps the output's memory by design), and reads VmRSS.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads Linux's /proc/self/status")

COLS = 2**25  # 128 MiB as float32: far above what a thread keeps (4 MiB a buffer)
# What may stay after the huge row: the allocator's and onnxruntime's own slack, far below the 128-256 MiB a kept
# float32 copy of the row takes.
SLACK_MIB = 24

_CHILD = r"""
import gc, json, sys
import numpy as np
import onnxruntime as ort
sys.path.insert(0, sys.argv[1])
from op_models import norm_model
from ort_rmsnorm.runtime import make_session

case, cols = sys.argv[2], int(sys.argv[3])

def rss_mib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

skip = case == "float32_sum"
attributes = {"normalize_float32_sum": 1} if skip else None
scale = case == "float16_scale"
model = norm_model(np.float16, np.float16 if scale else None, skip=skip, x_shape=("rows", "cols"),
                   scale_shape=("cols",) if scale else None, attributes=attributes)
options = ort.SessionOptions()
options.enable_cpu_mem_arena = False
session = make_session(model, options=options, threads=1)

def feeds(cols):
    rng = np.random.default_rng(0)
    found = {"x": rng.standard_normal((1, cols)).astype(np.float16)}
    if skip:
        found["skip"] = rng.standard_normal((1, cols)).astype(np.float16)
    if scale:
        found["scale"] = np.ones(cols, np.float16)
    return found

def run(cols, times=1):
    for _ in range(times):
        outputs = session.run(None, feeds(cols))
        assert np.isfinite(outputs[0]).all()
        del outputs
    gc.collect()

run(4096, 20)
before = rss_mib()
run(cols)
after_huge = rss_mib()
run(4096, 20)
after_small = rss_mib()
print(json.dumps({"before": before, "after_huge": after_huge, "after_small": after_small}))
"""


def resident(case: str, cols: int = COLS) -> dict:
    tests = Path(__file__).resolve().parents[1]
    # From tests/: `python -c` puts the working directory first on sys.path, and a checkout's ort_rmsnorm/ (without
    # the library) would shadow the installed package.
    result = subprocess.run([sys.executable, "-c", _CHILD, str(tests), case, str(cols)], capture_output=True,
                            text=True, timeout=300, cwd=tests)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", ["no_scale", "float16_scale", "float32_sum"])
def test_one_huge_row_leaves_no_copy_of_it_behind(case):
    """The buffers were per thread, grown to the largest row ever seen and kept: 128 MiB (ones, the float32 scale)
    or 256 MiB (two staged float32 rows) stayed resident after the huge row."""
    found = resident(case)
    assert found["after_small"] - found["before"] < SLACK_MIB, found
