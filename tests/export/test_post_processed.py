"""Exports passed through the tools people run on them before fusing: onnxslim, onnxsim, onnxconverter-common's and
onnxruntime's float16 converters (with and without the norm's ops in the block list).

These tools drop or rename the stored shapes (the residual adds then rest on symbolic shape inference), wrap the
norm's ops in casts (float32 kept for the statistic, the mean rounded to float16) or leave the nodes out of
topological order. Every norm must still fuse, counted from the torch module, its residual add too, and the fused
model must compute what the processed one does (`verify`); where onnxruntime cannot load the processed model at all,
neither can it load the fused one, and the fusion report says where it rounds differently.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import onnx
import pytest

torch = pytest.importorskip("torch")

from export.fusing import fuse_file, op_counts  # noqa: E402
from export.models import RMSNORM_MODULES, count_modules, skip_norms_expected  # noqa: E402

from ort_rmsnorm import verify  # noqa: E402
from ort_rmsnorm.model.read import load_model  # noqa: E402
from ort_rmsnorm.runtime import make_session  # noqa: E402

pytestmark = pytest.mark.torch

# The norm's own ops, as a float16 conversion's block list names them to keep x^2 out of float16's range.
STATISTIC_OPS = ["Pow", "ReduceMean"]
NORM_OPS = ["Pow", "ReduceMean", "Add", "Sqrt", "Reciprocal", "Div", "Mul"]


def _onnxslim(model: onnx.ModelProto) -> onnx.ModelProto:
    onnxslim = pytest.importorskip("onnxslim")
    return onnxslim.slim(model)


def _onnxsim(model: onnx.ModelProto) -> onnx.ModelProto:
    onnxsim = pytest.importorskip("onnxsim")
    simplified, ok = onnxsim.simplify(model)
    assert ok
    return simplified


def _occ_float16(block: list[str] | None):
    def convert(model: onnx.ModelProto) -> onnx.ModelProto:
        float16 = pytest.importorskip("onnxconverter_common.float16")
        return float16.convert_float_to_float16(model, keep_io_types=True, op_block_list=block)

    return convert


def _ort_float16(block: list[str]):
    def convert(model: onnx.ModelProto) -> onnx.ModelProto:
        from onnxruntime.transformers import float16

        return float16.convert_float_to_float16(model, keep_io_types=True, op_block_list=block)

    return convert


TOOLS = {
    "onnxslim": _onnxslim,
    "onnxsim": _onnxsim,
    "occ-float16": _occ_float16(None),
    "occ-float16-block-statistic": _occ_float16(STATISTIC_OPS),
    "occ-float16-block-norm": _occ_float16(NORM_OPS),
    "ort-float16-block-statistic": _ort_float16(STATISTIC_OPS),
}
# onnxconverter-common 1.16 writes float16 models of TorchScript exports whose Cast outputs are annotated with the
# wrong type (onnxruntime: "Type (tensor(float16)) of output arg ... does not match expected type (tensor(float))").
UNLOADABLE = {("torchscript", "occ-float16"), ("torchscript", "occ-float16-block-statistic"),
              ("torchscript", "occ-float16-block-norm")}
CASES = [(case, exporter, tool) for case in ("llama_decoder", "norm_block") for exporter in ("torchscript", "dynamo")
         for tool in TOOLS if case == "llama_decoder" or tool in ("onnxslim", "onnxsim")]


@dataclasses.dataclass
class Processed:
    path: Path
    fused: Path
    report: object
    module: object
    load_notes: list[str]


def _loads(path: Path) -> bool:
    try:
        make_session(str(path))
    except Exception as error:  # onnxruntime's exceptions derive from Exception only
        assert "Type Error" in str(error) or "does not match expected type" in str(error), error
        return False
    return True


@pytest.fixture(scope="module")
def processed(exported, tmp_path_factory):
    folder = tmp_path_factory.mktemp("processed")
    cache = {}

    def get(case: str, exporter: str, tool: str) -> Processed:
        key = (case, exporter, tool)
        if key not in cache:
            source = exported(case, exporter, "float32")
            path = folder / f"{case}.{exporter}.{tool}.onnx"
            try:
                converted = TOOLS[tool](onnx.load(source.path))
            except AttributeError as error:  # onnxconverter-common 1.16 on TorchScript's casts, blocking Mul
                pytest.skip(f"{tool} fails on this export itself: {error!r}")
            onnx.save(converted, path)
            notes: list[str] = []
            load_model(path, notes)
            fused, report = fuse_file(path)
            cache[key] = Processed(path, fused, report, source.module, notes)
        return cache[key]

    return get


@pytest.mark.parametrize("case, exporter, tool", CASES)
def test_every_norm_and_residual_add_fuses(processed, case, exporter, tool):
    result = processed(case, exporter, tool)
    norms = count_modules(result.module, RMSNORM_MODULES)
    after = op_counts(result.fused)
    assert len(result.report.fusions) == norms == after["RMSNorm"] + after["SkipRMSNorm"], result.report.summary()
    assert after["SkipRMSNorm"] == skip_norms_expected(result.module), result.report.summary()
    assert not result.report.skipped or case == "norm_block", result.report.summary()
    if case == "norm_block":  # its LayerNorms stay, each one reported as such where it looks like a norm
        assert all("LayerNorm" in entry.reason for entry in result.report.skipped), result.report.summary()
        assert after["LayerNormalization"] == op_counts(result.path)["LayerNormalization"]
    if tool.startswith("ort-float16"):  # it writes the casts after the nodes that read them
        assert any("not in topological order" in note for note in result.load_notes), result.load_notes


@pytest.mark.parametrize("case, exporter, tool", CASES)
def test_fused_model_computes_what_the_processed_one_does(processed, case, exporter, tool):
    result = processed(case, exporter, tool)
    if (exporter, tool) in UNLOADABLE:
        # The converter's output is what onnxruntime rejects; fusing neither repairs nor worsens that.
        assert not _loads(result.path) and not _loads(result.fused)
        return
    comparison = verify.verify(result.path, result.fused, dims={"batch": 2, "sequence": 5})
    assert comparison.ok, comparison.describe()


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_statistic_rounded_to_float16_is_reported(processed, exporter):
    """With Pow and ReduceMean kept in float32, the converters round the mean (onnxruntime's also the squares) to
    float16 between the norm's ops; the fused op keeps its statistic in float32, and each fusion says so."""
    for tool in ("occ-float16-block-statistic", "ort-float16-block-statistic"):
        result = processed("llama_decoder", exporter, tool)
        for fusion in result.report.fusions:
            assert "the statistic is rounded to float16" in fusion.roundings, (tool, fusion)
        assert "the graph rounds: " in result.report.summary()
