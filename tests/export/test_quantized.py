"""int8 QDQ models: a small Llama-style model exported by torch's dynamo exporter, statically quantized by
onnxruntime's ``quantize_static`` (QDQ format, a calibration reader over random token ids), then fused.

What must hold: a norm whose float computation lies entirely between a DequantizeLinear and a QuantizeLinear fuses,
computing the same thing; a norm whose computation a QuantizeLinear/DequantizeLinear pair interrupts never fuses and
is reported with that reason, and no residual Add fuses into a norm across such a pair. Every QuantizeLinear and DequantizeLinear of the quantized
model is still there after fusing. The expected counts come from the torch module (its RMSNorm calls); numerics
through ``ort_rmsnorm.verify``.

With ``through_qdq`` the interrupted norms fuse: the pairs inside them go (each fusion lists them in its roundings),
every other Q/DQ node stays, and the fused model is no farther from the float model than the quantized one is.
"""

from __future__ import annotations

import logging
from collections import Counter

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch")
quantization = pytest.importorskip("onnxruntime.quantization")

from export.fusing import fuse_file, op_counts  # noqa: E402

from ort_rmsnorm import verify  # noqa: E402
from ort_rmsnorm.builders import exporters  # noqa: E402
from ort_rmsnorm.builders.llama import LlamaConfig  # noqa: E402

pytestmark = pytest.mark.torch

CONFIG = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4)
QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")


class _RandomTokens(quantization.CalibrationDataReader):
    def __init__(self, batches: int = 4):
        rng = np.random.default_rng(0)
        self.batches = iter([{"input_ids": rng.integers(0, CONFIG.vocab_size, (1, 8))} for _ in range(batches)])

    def get_next(self):
        return next(self.batches, None)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(float model path, RMSNorm calls of the torch module in one forward pass)."""
    path = tmp_path_factory.mktemp("qdq") / "llama.onnx"
    module = exporters.export_llama(CONFIG, path, exporter="dynamo")
    calls = Counter()
    hooks = [m.register_forward_hook(lambda m, *_: calls.update([type(m).__name__])) for m in module.modules()]
    with torch.no_grad():
        module(torch.zeros(1, 4, dtype=torch.int64))
    for hook in hooks:
        hook.remove()
    return path, calls["LlamaRMSNorm"]


def _residual_adds(path) -> list[str]:
    """The Adds whose output a norm reads (its Pow): the residual adds of the decoder layers."""
    graph = onnx.load(path, load_external_data=False).graph
    norm_inputs = {node.input[0] for node in graph.node if node.op_type == "Pow"}
    return [node.name for node in graph.node if node.op_type == "Add" and node.output[0] in norm_inputs]


def _quantize(source, tmp_path, op_types=None, nodes=None, extra_options=None):
    destination = tmp_path / "llama.qdq.onnx"
    logging.getLogger("onnxruntime.quantization").setLevel(logging.ERROR)  # "consider pre-processing" notes
    quantization.quantize_static(str(source), str(destination), _RandomTokens(),
                                 quant_format=quantization.QuantFormat.QDQ, op_types_to_quantize=op_types,
                                 nodes_to_quantize=nodes, extra_options=extra_options)
    return destination


def _fuse_and_check(quantized):
    """Fuses; checks that every Q/DQ node is still there and that the fused model computes the same logits."""
    fused, report = fuse_file(quantized)
    before, after = op_counts(quantized), op_counts(fused)
    assert [before[op] for op in QDQ_OPS] == [after[op] for op in QDQ_OPS], report.summary()
    assert before["QuantizeLinear"] > 0
    for dims in ({}, {"batch": 1, "sequence": 17}):
        result = verify.verify(quantized, fused, dims=dims)
        assert result.ok, result.describe()
    return after, report


def test_norms_between_quantized_matmuls_fuse(exported, tmp_path):
    """Only the MatMuls quantized (a common recipe for transformers): each norm reads the float residual stream and
    its output goes to the QuantizeLinear before the next MatMuls. Every norm fuses, the residual adds with them."""
    source, norms = exported
    after, report = _fuse_and_check(_quantize(source, tmp_path, ["MatMul"]))
    assert len(report.fusions) == norms == after["RMSNorm"] + after["SkipRMSNorm"], report.summary()
    assert after["SkipRMSNorm"] == CONFIG.norms_after_residual_add and not report.skipped, report.summary()


def test_a_norm_between_dequantize_and_quantize_fuses(exported, tmp_path):
    """The embedding Gather quantized too: the first norm reads a DequantizeLinear and feeds a QuantizeLinear, its
    float computation entirely between them."""
    source, norms = exported
    quantized = _quantize(source, tmp_path, ["MatMul", "Gather"])
    graph = onnx.load(quantized, load_external_data=False).graph
    producers = {output: node for node in graph.node for output in node.output}
    first_pow = next(node for node in graph.node if node.op_type == "Pow")
    assert producers[first_pow.input[0]].op_type == "DequantizeLinear"
    after, report = _fuse_and_check(quantized)
    assert len(report.fusions) == norms and after["SkipRMSNorm"] == CONFIG.norms_after_residual_add
    first = next(f for f in report.fusions if first_pow.name in f.replaced_nodes)
    assert first.op_type == "ort_rmsnorm.RMSNorm" and not first.skip


def test_a_residual_add_behind_quantize_dequantize_stays(exported, tmp_path):
    """The residual adds quantized as well: each one's output passes a QuantizeLinear/DequantizeLinear pair before
    the norm reads it. The norms fuse alone (RMSNorm), the adds stay: the norm normalizes the dequantized sum, not
    the Add's output."""
    source, norms = exported
    adds = _residual_adds(source)
    assert len(adds) == CONFIG.norms_after_residual_add
    matmuls = [n.name for n in onnx.load(source, load_external_data=False).graph.node if n.op_type == "MatMul"]
    after, report = _fuse_and_check(_quantize(source, tmp_path, ["MatMul", "Add"], nodes=matmuls + adds))
    assert len(report.fusions) == norms == after["RMSNorm"] and after["SkipRMSNorm"] == 0, report.summary()
    assert after["Add"] >= len(adds)
    assert not any(add in f.replaced_nodes for f in report.fusions for add in adds)


# Every op type quantized (quantize_static's default), or the ops inside the norm: the norm's mean, mean + eps,
# reciprocal or products pass through int8, so the float computation of the norm is interrupted.
INTERRUPTED = {"all op types": None, "Add (mean + eps)": ["MatMul", "Add"],
               "Mul (x * rsqrt, * weight)": ["MatMul", "Mul"]}


@pytest.mark.parametrize("op_types", INTERRUPTED.values(), ids=INTERRUPTED.keys())
def test_a_norm_interrupted_by_quantize_dequantize_never_fuses(exported, tmp_path, op_types):
    source, _ = exported
    after, report = _fuse_and_check(_quantize(source, tmp_path, op_types))
    assert not report.fusions and after["RMSNorm"] == after["SkipRMSNorm"] == 0, report.summary()


@pytest.mark.parametrize("op_types", INTERRUPTED.values(), ids=INTERRUPTED.keys())
def test_an_interrupted_norm_is_reported_with_its_reason(exported, tmp_path, op_types):
    source, norms = exported
    _, report = fuse_file(_quantize(source, tmp_path, op_types))
    quantized = [s for s in report.skipped if "QuantizeLinear" in s.reason or "DequantizeLinear" in s.reason]
    assert len(quantized) == norms, report.summary()


def _logits(path, input_ids) -> np.ndarray:
    from ort_rmsnorm.runtime import make_session, run

    return run(make_session(str(path)), {"input_ids": input_ids})[0].astype(np.float64)


# And every op type with a pair of its own for each consumer: the division reads x through a pair, the square not.
THROUGH = {**{name: (op_types, None) for name, op_types in INTERRUPTED.items()},
           "dedicated pairs": (None, {"DedicatedQDQPair": True})}


@pytest.mark.parametrize("op_types, extra_options", THROUGH.values(), ids=THROUGH.keys())
def test_through_qdq_fuses_the_interrupted_norms(exported, tmp_path, op_types, extra_options):
    source, norms = exported
    quantized = _quantize(source, tmp_path, op_types, extra_options=extra_options)
    fused, report = fuse_file(quantized, through_qdq=True)
    assert len(report.fusions) == norms and not report.skipped, report.summary()
    for fusion in report.fusions:
        assert fusion.roundings and all(rounding.endswith("by a Q/DQ pair") for rounding in fusion.roundings)
    # Only the pairs inside the norms (and the DequantizeLinear of each epsilon) went; every other Q/DQ node stays.
    names = lambda path: {n.name for n in onnx.load(path, load_external_data=False).graph.node  # noqa: E731
                          if n.op_type in QDQ_OPS}
    removed = names(quantized) - names(fused)
    assert names(fused) <= names(quantized) and removed
    assert removed <= {node for fusion in report.fusions for node in fusion.replaced_nodes}
    # Against the float model: the dropped roundings do not move the logits away from it.
    rng = np.random.default_rng(1)
    errors = {"quantized": [], "fused": []}
    for _ in range(4):
        input_ids = rng.integers(0, CONFIG.vocab_size, (2, 16))
        expected = _logits(source, input_ids)
        for name, path in (("quantized", quantized), ("fused", fused)):
            errors[name].append(np.sqrt(np.mean((_logits(path, input_ids) - expected) ** 2)))
    rms = {name: float(np.mean(values)) for name, values in errors.items()}
    assert rms["fused"] <= 1.1 * rms["quantized"], rms
