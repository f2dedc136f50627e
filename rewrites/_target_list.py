"""The targets by name."""

from __future__ import annotations

from ._target_auto import AutoTarget
from ._target_base import Target
from ._target_custom import CustomTarget
from ._target_decomposed import DecomposedTarget
from ._target_onnx import OnnxTarget
from ._target_ort import OrtTarget

TARGETS: dict[str, Target] = {
    target.name: target for target in (CustomTarget(), OnnxTarget(), OrtTarget(), AutoTarget(), DecomposedTarget())
}
"""The targets by name, in :data:`ort_rmsnorm.contract.TARGETS`' order (tests/package/test_layers.py checks it)."""


def get_target(name: str) -> Target:
    """The target ``name``; ``auto`` afresh, so that each pass reads the table in force when it runs."""
    if name == AutoTarget.name:
        return AutoTarget()
    try:
        return TARGETS[name]
    except KeyError:
        raise ValueError(f"unknown fusion target {name!r}: choose one of {', '.join(TARGETS)}") from None
