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
    assert not any("kept" in note for note in report.notes), report.notes  # the ops this run wrote are not "kept"
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


def _weights_per_norm_reference(model) -> float:
    """The bytes of the MatMul weights over the count of norm reductions, from the proto with numpy."""
    from onnx import numpy_helper

    initializers = {tensor.name: numpy_helper.to_array(tensor) for tensor in model.graph.initializer}
    weights = {name for node in model.graph.node if node.op_type == "MatMul" for name in node.input
               if name in initializers}
    reductions = sum(node.op_type == "ReduceMean" for node in model.graph.node)
    return sum(initializers[name].nbytes for name in weights) / reductions


def test_weights_per_norm_is_what_the_matrix_products_read_per_norm():
    import onnx_ir as ir

    model = _llama(32)
    assert _auto.weight_bytes_per_norm(ir.from_proto(model)) == pytest.approx(_weights_per_norm_reference(model))


@pytest.mark.parametrize("l2, expected", [
    ("1048576", OUR_OPS),  # a few KiB of weights per norm, within half of 1 MiB: warm, ours
    ("4096", ORT_OPS),     # more than half of a 4 KiB L2: cold, the table's choice
    ("0", ORT_OPS),        # 0: every model taken as cold
])
def test_norms_that_run_warm_take_ours_whatever_the_table(monkeypatch, l2, expected):
    """The table is measured cold; a model whose weights per norm fit in half of the L2 runs its norms warm, where
    ours is the cheaper call: `auto` writes ours there and says why."""
    import onnx_ir as ir

    original = _llama(32)
    per_norm = _weights_per_norm_reference(original)
    assert 4096 / 2 < per_norm < 1048576 / 2  # the model sits between the two caches
    assert _auto.weight_bytes_per_norm(ir.from_proto(original)) == pytest.approx(per_norm)
    monkeypatch.setenv("ORT_RMSNORM_L2_BYTES", l2)
    fused, report = ort_rmsnorm.fuse(original, "auto")
    assert _norm_ops(fused) == expected, report.summary()
    if expected == OUR_OPS:
        assert all("run warm" in fusion.choice and "ORT_RMSNORM_L2_BYTES" in fusion.choice and
                   "faster cold on rows of up to 48 float32 elements" in fusion.choice for fusion in report.fusions)
    assert verify(original, fused).ok


@pytest.mark.parametrize("value", ["lots", "-1", "1e6", "1" * 16])
def test_an_l2_that_is_no_count_of_bytes_is_an_error_naming_it(monkeypatch, value):
    from ort_rmsnorm.auto_table import AutoTableError

    monkeypatch.setenv("ORT_RMSNORM_L2_BYTES", value)
    with pytest.raises(AutoTableError, match="ORT_RMSNORM_L2_BYTES=.*not a count of bytes"):
        ort_rmsnorm.fuse(_llama(32), "auto")


def test_the_l2_is_this_cpus(monkeypatch):
    """Unset, the L2 is Linux's description of CPU 0's caches (None where there is none)."""
    from pathlib import Path

    from ort_rmsnorm.auto_table import l2_cache_bytes

    monkeypatch.delenv("ORT_RMSNORM_L2_BYTES")
    found = l2_cache_bytes()
    caches = Path("/sys/devices/system/cpu/cpu0/cache")
    levels = [index for index in caches.glob("index[0-9]*") if (index / "level").read_text().strip() == "2"] \
        if caches.is_dir() else []
    if not levels:
        assert found is None
        return
    size = (levels[0] / "size").read_text().strip()
    assert found == int(size[:-1]) * {"K": 1024, "M": 1 << 20}[size[-1]]
