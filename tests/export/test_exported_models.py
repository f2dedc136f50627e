"""Real exporter output: small torch modules exported by both torch exporters (dynamo with and without its own
optimization), fused, checked, run.

For each case x exporter x dtype: every RMSNorm of the module is fused (counted from the module's submodules, not
from the graph), the decomposed nodes are gone, no LayerNorm is fused, the residual adds of Llama decoder layers
become SkipRMSNorm, and the fused model's outputs match the original's through `verify` (float32, float16) or the
torch module's own output (bfloat16, which onnxruntime's CPU kernels cannot run unfused).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch")

from export.fusing import fuse_file, op_counts  # noqa: E402
from export.models import (  # noqa: E402
    CASES,
    EXPORT_VARIANTS,
    LAYERNORM_MODULES,
    OPSET23_CASES,
    RMSNORM_MODULES,
    UNOPTIMIZED,
    count_modules,
    skip_norms_expected,
)

from ort_rmsnorm import verify  # noqa: E402
from ort_rmsnorm.runtime import make_session, run  # noqa: E402

pytestmark = pytest.mark.torch

DTYPES = ("float32", "float16", "bfloat16")
# torch.onnx's TorchScript exporter has no symbolic for aten::rms_norm at opset 17: nn.RMSNorm exports with dynamo only.
TORCHSCRIPT_CANNOT_EXPORT = {name for name in CASES if name.startswith("torch_rmsnorm")}


def _combinations():
    for exporter, (kind, _) in EXPORT_VARIANTS.items():
        for dtype in DTYPES:
            for name in CASES:
                if exporter == "torchscript" and name in TORCHSCRIPT_CANNOT_EXPORT:
                    continue
                if exporter.endswith("opset23") and name not in OPSET23_CASES:
                    continue
                if exporter in UNOPTIMIZED and dtype == "bfloat16":
                    continue  # the raw translation's casts are dtype-independent: float16 shows them
                # Exports with dynamo take seconds each: its 16-bit exports are the slow part of the suite.
                marks = [pytest.mark.slow] if kind == "dynamo" and dtype != "float32" else []
                yield pytest.param(name, exporter, dtype, id=f"{name}-{exporter}-{dtype}", marks=marks)


COMBINATIONS = list(_combinations())


@dataclasses.dataclass(frozen=True)
class Fused:
    original: Path
    fused: Path
    report: object
    module: torch.nn.Module
    example: torch.Tensor


@pytest.fixture(scope="session")
def fused(exported):
    """``fused(case, exporter, dtype)``: the export fused as `ort-rmsnorm fuse` does it (target custom)."""
    cache: dict[tuple[str, str, str], Fused] = {}

    def get(case_name: str, exporter: str, dtype: str) -> Fused:
        key = (case_name, exporter, dtype)
        if key not in cache:
            source = exported(case_name, exporter, dtype)
            output, report = fuse_file(source.path)
            cache[key] = Fused(source.path, output, report, source.module, source.example)
        return cache[key]

    return get


@pytest.mark.parametrize("case_name, exporter, dtype", COMBINATIONS)
def test_every_rmsnorm_is_fused_and_nothing_else(fused, case_name, exporter, dtype):
    result = fused(case_name, exporter, dtype)
    norms = count_modules(result.module, RMSNORM_MODULES)
    skips = skip_norms_expected(result.module)
    before, after = op_counts(result.original), op_counts(result.fused)

    assert len(result.report.fusions) == norms, result.report.summary()
    assert after["RMSNorm"] + after["SkipRMSNorm"] == norms, result.report.summary()
    assert after["SkipRMSNorm"] == skips, result.report.summary()
    # Each norm was one Sqrt's decomposition or (torch.nn.RMSNorm at opset 23) one RMSNormalization: those are gone,
    # any other Sqrt (a LayerNorm's, attention's scale) stays.
    assert before["Sqrt"] + before["RMSNormalization"] - after["Sqrt"] - after["RMSNormalization"] == norms
    assert after["RMSNormalization"] == 0
    # No LayerNorm is fused: the exported LayerNormalization ops stay, and so does the mean subtraction of the
    # written-out LayerNorm.
    layer_norms = count_modules(result.module, LAYERNORM_MODULES)
    assert after["LayerNormalization"] == before["LayerNormalization"]
    assert after["Sub"] == before["Sub"]
    assert before["LayerNormalization"] + before["Sub"] == layer_norms
    onnx.checker.check_model(result.fused)


def _has_cpu_kernels(path: Path) -> bool:
    """False when onnxruntime's CPU provider has no kernel for one of the model's ops (NOT_IMPLEMENTED)."""
    try:
        make_session(str(path))
    except Exception as error:  # onnxruntime's exceptions derive from Exception only
        if "NOT_IMPLEMENTED" in str(error):
            return False
        raise
    return True


def _feed(example: torch.Tensor) -> np.ndarray:
    if example.dtype == torch.bfloat16:
        return example.float().numpy().astype(ml_dtypes.bfloat16)  # exact: bfloat16 widens to float32 exactly
    return example.numpy()


@pytest.mark.parametrize("case_name, exporter, dtype", COMBINATIONS)
def test_fused_outputs_match(fused, case_name, exporter, dtype):
    result = fused(case_name, exporter, dtype)
    name = onnx.load(result.original, load_external_data=False).graph.input[0].name
    if dtype != "bfloat16":
        comparison = verify.verify(result.original, result.fused, dims={"batch": 3, "sequence": 7})
        assert comparison.ok, comparison.describe()
        return
    # onnxruntime has no CPU kernels for the unfused graph's bfloat16 Mul/MatMul: compare with torch itself.
    feeds = {name: _feed(result.example)}
    if not _has_cpu_kernels(result.fused):
        pytest.skip("the fused model still holds bfloat16 ops (MatMul) that onnxruntime's CPU provider lacks")
    (got,) = run(make_session(str(result.fused)), feeds)
    with torch.no_grad():
        want = result.module(result.example).float().numpy().astype(got.dtype)
    comparison = verify.compare("y", want, got, np.dtype(ml_dtypes.bfloat16))  # torch computed in bfloat16
    assert comparison.ok, comparison.describe()
