"""Real TensorFlow and Keras exports: Keras ``RMSNormalization``, a hand-written TensorFlow norm, residual blocks of
each (also under the ``mixed_float16`` policy), a norm over two axes, a ``tf.function`` whose scale tf2onnx makes a
graph input, and ``LayerNormalization`` (plain and ``rms_scaling=True``) as controls, exported by tf2onnx at opsets 17
and 18 (tests/export/tensorflow_export.py, run in a subprocess), fused for each target; and the L2-norm family
(``tf.norm(x) / sqrt(d)``, ``tf.norm(x) * d**-0.5 + eps``, ``rsqrt(reduce_sum(x²) + eps)``, and
``tf.math.l2_normalize``, a clamp that stays) at opsets 13, 15, 17 and 18.

For each model and target: every RMSNorm the Keras model has (counted from its layers) is fused, those of a residual
sum with their Add where the target has a residual op, no LayerNorm is fused and each is in the report with its
reason, nothing else is skipped; the fused model's output matches the original's (``verify``) and TensorFlow's own.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

from export.tensorflow_export import CASES, model_name, opsets_of
from fusion.norm_graphs import check_model
from ort_rmsnorm import verify
from ort_rmsnorm.model.read import load_model
from ort_rmsnorm.model.write import save_model
from ort_rmsnorm.fusion import FusionReport, fuse_model
from ort_rmsnorm.runtime import make_session, run

pytestmark = pytest.mark.tensorflow

SCRIPT = Path(__file__).with_name("tensorflow_export.py")
NAMES = [model_name(case, opset) for case in CASES for opset in opsets_of(case)]
TARGET_OPS = {
    "custom": ("RMSNorm", "SkipRMSNorm"),
    "ort": ("SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization"),
    "onnx": ("RMSNormalization", None),
}
LAYERNORM = "the input is x - mean(x) over the normalized axes: a LayerNorm, not an RMSNorm"
MISSING = (
    "TensorFlow, Keras and tf2onnx are not installed: `pip install .[test-tensorflow]` (Linux x86_64, Python 3.11 to "
    "3.13; scripts/setup --test installs it)"
)


@dataclasses.dataclass(frozen=True)
class Export:
    path: Path
    entry: dict
    feeds: dict
    tensorflow_output: np.ndarray


@pytest.fixture(scope="session")
def tensorflow_exports(tmp_path_factory) -> dict[str, Export]:
    """Every case exported once per session, in a subprocess (TensorFlow stays out of the test process)."""
    if any(importlib.util.find_spec(module) is None for module in ("tensorflow", "keras", "tf2onnx")):
        pytest.skip(MISSING)
    folder = tmp_path_factory.mktemp("tensorflow-exports")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(
        [sys.executable, str(SCRIPT), str(folder)], capture_output=True, text=True, timeout=1800, env=env
    )
    if result.returncode != 0:
        pytest.fail(f"{SCRIPT.name} failed ({result.returncode}):\n{result.stderr[-4000:]}")
    exports = {}
    for entry in json.loads((folder / "manifest.json").read_text()):
        feeds = dict(np.load(folder / entry["inputs"]))
        exports[entry["name"]] = Export(folder / entry["model"], entry, feeds, np.load(folder / entry["tensorflow_output"]))
    assert sorted(exports) == sorted(NAMES)
    return exports


@pytest.fixture(scope="session")
def fused_export(tensorflow_exports):
    """``fused_export(name, target)``: the export fused as `ort-rmsnorm fuse --convert-opset` does it."""
    cache: dict[tuple[str, str], tuple[Path, FusionReport]] = {}

    def get(name: str, target: str) -> tuple[Export, Path, FusionReport]:
        source = tensorflow_exports[name]
        if (name, target) not in cache:
            model = load_model(source.path)
            report = fuse_model(model, target, allow_opset_upgrade=True)
            output = source.path.with_name(f"{source.path.stem}.{target}.onnx")
            save_model(model, output, protected=[source.path])
            cache[(name, target)] = (output, report)
        return (source, *cache[(name, target)])

    return get


def _ops(path: Path) -> Counter:
    return Counter(node.op_type for node in onnx.load(path, load_external_data=False).graph.node)


@pytest.mark.parametrize("target", TARGET_OPS)
@pytest.mark.parametrize("name", NAMES)
def test_every_rmsnorm_is_fused_and_no_layernorm(fused_export, name, target):
    source, output, report = fused_export(name, target)
    entry = source.entry
    norms, residual, layer_norms = entry["rmsnorms"], entry["residual"], entry["layernorms"]
    # Epsilon outside the sqrt (tf.norm * d**-0.5 + eps) only our op expresses; tf.math.l2_normalize is a clamp.
    outside = entry.get("eps_outside", 0) if target != "custom" else 0
    clamped = entry.get("clamped", 0)
    norms -= outside
    norm_op, skip_op = TARGET_OPS[target]
    skips = residual if skip_op is not None else 0
    before, after = _ops(source.path), _ops(output)

    assert len(report.fusions) == norms, report.summary()
    assert [fusion.skip for fusion in report.fusions].count(True) == skips, report.summary()
    assert after[norm_op] == norms - skips and (skip_op is None or after[skip_op] == skips), report.summary()
    # Each RMSNorm was one Sqrt's decomposition: those are gone, the LayerNorms' stay, with their centering.
    assert before["Sqrt"] - after["Sqrt"] == norms
    assert after["Sqrt"] == layer_norms + outside + clamped and before["Sub"] == after["Sub"] == layer_norms
    # Nothing is silent: every LayerNorm is in the report with its reason, and so is every norm left, and nothing else.
    reasons = [entry.reason for entry in report.skipped]
    assert reasons.count(LAYERNORM) == layer_norms and len(reasons) == layer_norms + outside + clamped, report.summary()
    assert sum("epsilon is added outside the sqrt" in reason for reason in reasons) == outside, report.summary()
    assert sum("a clamp, not an additive epsilon" in reason for reason in reasons) == clamped, report.summary()
    derived = [fusion.derivation for fusion in report.fusions if fusion.derivation is not None]
    assert len(derived) == (norms if entry["case"] in ("tf_norm_root", "tf_norm_eps_outside", "tf_rsqrt_sum") else 0)
    check_model(onnx.load(output), ort_default_ops=target == "ort")


@pytest.mark.parametrize("target", TARGET_OPS)
@pytest.mark.parametrize("name", NAMES)
def test_fused_outputs_match_the_original_and_tensorflow(fused_export, name, target):
    source, output, _ = fused_export(name, target)
    comparison = verify.verify(source.path, output, inputs=source.feeds)
    assert comparison.ok, comparison.describe()
    arithmetic = np.dtype(source.entry["arithmetic"])
    want = source.tensorflow_output
    for model in (source.path, output):  # the export itself first: a tf2onnx difference would show there
        (got,) = run(make_session(str(model)), source.feeds)
        against_tensorflow = verify.compare(source.entry["output"], want, got, arithmetic)
        assert against_tensorflow.ok, f"{model.name}: {against_tensorflow.describe()}"


# What tf2onnx writes for a norm (docs/fusion.md lists it): the scale multiplied into the inverse first, and at opset
# 17 the last-axis mean of a rank-3 float tensor as GlobalAveragePool.
SPELLED = {
    ("keras_rmsnorm", 17): ["Mul", "GlobalAveragePool", "Add", "Sqrt", "Reciprocal", "Mul", "Mul"],
    ("keras_rmsnorm", 18): ["Mul", "ReduceMean", "Add", "Sqrt", "Reciprocal", "Mul", "Mul"],
    ("tf_rmsnorm", 17): ["Mul", "GlobalAveragePool", "Add", "Sqrt", "Reciprocal", "Mul", "Mul"],
    ("keras_two_axes", 17): ["Mul", "GlobalAveragePool", "Add", "Sqrt", "Reciprocal", "Mul", "Mul"],
    ("keras_two_axes", 18): ["Mul", "ReduceMean", "Add", "Sqrt", "Reciprocal", "Mul", "Mul"],
}


@pytest.mark.parametrize("case, opset", SPELLED)
def test_tf2onnx_writes_the_documented_spelling(tensorflow_exports, case, opset):
    model = onnx.load(tensorflow_exports[model_name(case, opset)].path)
    assert [node.op_type for node in model.graph.node] == SPELLED[(case, opset)]
    factor, product = model.graph.node[-2:]
    assert factor.input[0] == model.graph.node[-3].output[0]  # Mul(inverse, w)
    assert list(product.input) == ["x", factor.output[0]]  # Mul(x, inverse * w)
