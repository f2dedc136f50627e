"""Fusing an exported model file as `ort-rmsnorm fuse` does (target custom), and counting a model's ops."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import onnx

from ort_rmsnorm.model.read import load_model
from ort_rmsnorm.model.write import save_model
from ort_rmsnorm.fusion import FusionReport, fuse_model


def fuse_file(source: Path, **options) -> tuple[Path, FusionReport]:
    """Fuses ``source`` into ``<stem>.fused.onnx`` beside it (``options``: those of ``fuse_model``); returns that path
    and the report."""
    model = load_model(source)
    report = fuse_model(model, **options)
    output = source.with_name(source.stem + ".fused.onnx")
    save_model(model, output, protected=[source])
    return output, report


def op_counts(path: Path) -> Counter:
    return Counter(node.op_type for node in onnx.load(path, load_external_data=False).graph.node)
