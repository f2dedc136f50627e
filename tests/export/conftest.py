"""Exports cached for the whole test session: each (case, exporter, dtype) is exported once.

torch is imported inside the fixture: without torch, the test module skips itself (pytest.importorskip) and this
file must still import.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest


@dataclasses.dataclass(frozen=True)
class Exported:
    path: Path
    module: Any  # torch.nn.Module
    example: Any  # torch.Tensor


@pytest.fixture(scope="session")
def exported(tmp_path_factory):
    """``exported(case, exporter, dtype)``: the case's module exported with dynamic batch and sequence dims."""
    from export.models import CASES, EXPORT_VARIANTS, UNOPTIMIZED, build  # tests/ is on sys.path; imports torch

    from ort_rmsnorm.builders.exporters import TORCH_DTYPES, export

    folder = tmp_path_factory.mktemp("exports")
    cache: dict[tuple[str, str, str], Exported] = {}

    def get(case_name: str, exporter: str, dtype: str) -> Exported:
        key = (case_name, exporter, dtype)
        if key not in cache:
            case = CASES[case_name]
            module = build(case, TORCH_DTYPES[dtype])
            example = case.example_input(TORCH_DTYPES[dtype])
            path = folder / f"{case_name}.{exporter}.{dtype}.onnx"
            name = "input_ids" if case.input_kind == "tokens" else "x"
            kind, opset = EXPORT_VARIANTS[exporter]
            export(module, (example,), path, exporter=kind, opset=opset, input_names=[name], output_names=["y"],
                   dynamic_dims={name: {0: "batch", 1: "sequence"}, "y": {0: "batch", 1: "sequence"}},
                   optimize=exporter not in UNOPTIMIZED)
            cache[key] = Exported(path, module, example)
        return cache[key]

    return get
