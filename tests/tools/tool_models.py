"""Models for the tool tests: the demo's Llama-style model built with onnx.helper (float32, and int4 with onnxruntime's
quantizer), each unfused and fused, small enough that every tool runs in seconds; and one-node models of our ops."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

import ort_rmsnorm
from ort_rmsnorm.model.write import save_model
from ort_rmsnorm.builders.llama import LlamaConfig
from op_models import make_model

# Two decoder layers: 5 norms, 4 of them SkipRMSNorm after fusing.
CONFIG = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4)
OUR_OPS = ("RMSNorm", "SkipRMSNorm")


@dataclasses.dataclass(frozen=True)
class Pair:
    """A model and the same model fused (target custom)."""

    name: str
    unfused: Path
    fused: Path

    def feeds(self, batch: int = 2, sequence: int = 7, seed: int = 5) -> dict[str, np.ndarray]:
        return {"input_ids": np.random.default_rng(seed).integers(0, CONFIG.vocab_size, (batch, sequence))}


def our_nodes(model: onnx.ModelProto | str | Path) -> list[onnx.NodeProto]:
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model), load_external_data=False)
    return [node for node in model.graph.node if node.domain == ort_rmsnorm.OP_DOMAIN]


def fused_pair(folder: Path, name: str, source: Path) -> Pair:
    fused, report = ort_rmsnorm.fuse(source)
    assert len(report.fusions) == CONFIG.norm_count, report.summary()
    fused_path = folder / f"{name}.fused.onnx"
    save_model(fused, fused_path)
    return Pair(name, source, fused_path)


# ---- one-node models ------------------------------------------------------------------------------------------


def op_model(op: str, x_type: int = TensorProto.FLOAT, x_shape=("batch", "sequence", 8), *, scale_type=None,
             scale_shape=(8,), skip_shape=None, bias_type=None, bias_shape=None, outputs=("y",),
             attributes: dict | None = None, output_types: bool = False) -> onnx.ModelProto:
    """A model of one of our nodes, inputs as graph inputs (skip_shape None: X's), outputs without types unless
    ``output_types`` (X's)."""
    inputs = [helper.make_tensor_value_info("x", x_type, list(x_shape) if x_shape is not None else None)]
    names = ["x"]
    if op == "SkipRMSNorm":
        inputs.append(helper.make_tensor_value_info(
            "skip", x_type, list(skip_shape if skip_shape is not None else x_shape) if x_shape is not None else None))
        names.append("skip")
    if scale_type is not None:
        inputs.append(helper.make_tensor_value_info("scale", scale_type, list(scale_shape)))
        names.append("scale")
    elif bias_type is not None:
        names.append("")
    if bias_type is not None:
        inputs.append(helper.make_tensor_value_info("bias", bias_type, list(bias_shape)))
        names.append("bias")
    node = helper.make_node(op, names, list(outputs), name="norm0", domain=ort_rmsnorm.OP_DOMAIN,
                            **(attributes or {}))
    graph_outputs = [
        helper.make_tensor_value_info(name, x_type, list(x_shape)) if output_types
        else helper.make_empty_tensor_value_info(name)
        for name in outputs if name
    ]
    graph = helper.make_graph([node], "one_op", inputs, graph_outputs)
    return make_model(graph, [helper.make_opsetid("", 18), helper.make_opsetid(ort_rmsnorm.OP_DOMAIN, 1)])


def run_python(code: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -c code`` in a fresh interpreter (the schemas are process-wide)."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, timeout=timeout)
