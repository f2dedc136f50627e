"""The ``auto`` target: per norm, onnxruntime's op where the measured table says it is faster and it computes the same
thing, ours everywhere else; the report says which and why, and models already holding either op get the same
choice."""

from __future__ import annotations

import numpy as np
import pytest

import ort_rmsnorm
from ort_rmsnorm.auto_table import SHIPPED, AutoTable
from ort_rmsnorm.builders.llama import LlamaConfig, build_llama_onnx
from ort_rmsnorm.rewrites import _target_auto as _auto
from ort_rmsnorm.verify import verify
from op_models import norm_model

ORT_OPS = {"SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization"}
OUR_OPS = {"RMSNorm", "SkipRMSNorm"}
LIMIT = 48  # the table below: onnxruntime's ops faster up to 48 float32 elements per row


def use_table(monkeypatch, faster_up_to) -> None:
    """The shipped table replaced by ``faster_up_to`` (tests/conftest.py keeps a tuned table of the machine out)."""
    monkeypatch.setattr(_auto, "SHIPPED_TABLE", AutoTable(faster_up_to, "a test's table", SHIPPED))


@pytest.fixture(autouse=True)
def table(monkeypatch):
    use_table(monkeypatch, {"RMSNorm": {"float32": LIMIT}, "SkipRMSNorm": {"float32": LIMIT}})


def _llama(hidden: int, dtype: str = "float32"):
    return build_llama_onnx(LlamaConfig(vocab_size=64, hidden_size=hidden, intermediate_size=2 * hidden,
                                        num_layers=2, num_heads=2), dtype)


def _norm_ops(model) -> set[str]:
    return {node.op_type for node in model.graph.node if node.op_type in ORT_OPS | OUR_OPS}


@pytest.mark.parametrize("hidden, dtype, expected", [
    (32, "float32", ORT_OPS),       # short rows: onnxruntime's
    (64, "float32", OUR_OPS),       # longer: ours
    (32, "float16", OUR_OPS),       # no float16 length measured faster: ours
])
def test_each_norm_takes_the_faster_op(hidden, dtype, expected):
    original = _llama(hidden, dtype)
    fused, report = ort_rmsnorm.fuse(original, "auto")
    assert _norm_ops(fused) == expected, report.summary()
    assert len(report.fusions) == 5 and not report.skipped
    side = "onnxruntime's op" if expected == ORT_OPS else "ours"
    assert all(fusion.choice.startswith(side) for fusion in report.fusions)
    by_table = [fusion for fusion in report.fusions if dtype == "float32" or "Skip" not in fusion.op_type]
    assert by_table and all("a test's table" in fusion.choice for fusion in by_table)
    assert verify(original, fused).ok
    again, second = ort_rmsnorm.fuse(fused, "auto")  # idempotent
    assert second.fusions == [] and again == fused


@pytest.mark.parametrize("hidden", [32, 64])
@pytest.mark.parametrize("source", ["custom", "ort"])
def test_models_already_fused_get_the_same_choice(source, hidden):
    """A model fused to either target, given to auto, ends as auto would have fused the original; an op that is
    already the faster one stays and is counted in the notes."""
    original = _llama(hidden)
    direct, _ = ort_rmsnorm.fuse(original, "auto")
    fused, _ = ort_rmsnorm.fuse(original, source)
    chosen, report = ort_rmsnorm.fuse(fused, "auto")
    assert _norm_ops(chosen) == _norm_ops(direct)
    if _norm_ops(fused) == _norm_ops(direct):
        assert report.fusions == [] and any("kept: already the faster op here" in note for note in report.notes)
    else:
        assert len(report.fusions) == 5 and all(fusion.converted_from for fusion in report.fusions)
    assert verify(original, chosen).ok


def test_ours_where_onnxruntimes_op_cannot_express_the_norm():
    """Epsilon outside the sqrt has no onnxruntime op: ours, whatever the table, and the choice says why."""
    model = norm_model(np.float32, x_shape=(2, 16), constant_scale=np.ones(16, np.float32),
                       attributes={"eps_outside_sqrt": 1})
    model.graph.node[0].domain = "ort_rmsnorm"
    fused, report = ort_rmsnorm.fuse(model, "auto")
    assert _norm_ops(fused) == {"RMSNorm"} and report.fusions == [], report.summary()
    assert any("kept" in note for note in report.notes)
    decomposed, _ = ort_rmsnorm.fuse(model, "decomposed")
    refused, report = ort_rmsnorm.fuse(decomposed, "auto")
    (fusion,) = report.fusions
    assert fusion.op_type == "ort_rmsnorm.RMSNorm" and "cannot express" in fusion.choice, fusion.choice


def test_a_16_bit_residual_takes_ours_whatever_the_table(monkeypatch):
    """The graph's float16 Add rounds the sum; onnxruntime's float16 residual op normalizes it unrounded: ours, even
    where the table would say onnxruntime's is faster."""
    use_table(monkeypatch, {"RMSNorm": {"float16": LIMIT}, "SkipRMSNorm": {"float16": LIMIT}})
    original = _llama(32, "float16")
    fused, report = ort_rmsnorm.fuse(original, "auto")
    residual = [fusion for fusion in report.fusions if "Skip" in fusion.op_type]
    assert len(residual) == 4 and all(fusion.op_type == "ort_rmsnorm.SkipRMSNorm" for fusion in residual)
    assert all("normalizes the float32 sum, the graph the sum its Add rounded" in fusion.choice
               for fusion in residual), [fusion.choice for fusion in residual]
    assert verify(original, fused).ok


def test_rows_of_unknown_length_take_ours():
    model = norm_model(np.float32, x_shape=("rows", "hidden"), attributes={"epsilon": 1e-5})
    decomposed, _ = ort_rmsnorm.fuse(model, "decomposed")
    fused, report = ort_rmsnorm.fuse(decomposed, "auto")
    (fusion,) = report.fusions
    assert fusion.op_type == "ort_rmsnorm.RMSNorm" and "not static" in fusion.choice, fusion.choice


def test_the_table_is_the_measured_one():
    """The shipped table is written by benchmarks/cold_call.py: every entry a positive row length of a type the
    ops take, for our two ops."""
    from ort_rmsnorm.rewrites import _auto_table

    assert set(_auto_table.FASTER_UP_TO) <= {"RMSNorm", "SkipRMSNorm"} and _auto_table.MEASURED_ON
    for limits in _auto_table.FASTER_UP_TO.values():
        assert all(dtype in ("float32", "float16", "bfloat16") and length > 0 for dtype, length in limits.items())
