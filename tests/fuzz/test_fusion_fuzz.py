"""Property-based fuzzing of the fusion pass: random models mixing every RMSNorm spelling, LayerNorms, near misses,
residual Adds and unrelated ops (in If branches and model-local functions too), fused for each target and checked
against the generator's ground truth (see fuzz.checks and docs/fuzzing.md).

``ORT_RMSNORM_FUZZ_EXAMPLES=N`` sets the number of examples per target (default 60; a long campaign: thousands).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, event, given, settings

from fusion.norm_graphs import check_model
from fuzz.checks import TARGETS, check_case
from fuzz.strategies import cases

EXAMPLES = int(os.environ.get("ORT_RMSNORM_FUZZ_EXAMPLES", "60"))

FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)


@pytest.mark.parametrize("target", TARGETS)
@FUZZ
@given(case=cases())
def test_fusion_properties(target, case):
    describe(case)
    check_model(case.model)  # the generator's own model is valid
    check_case(case, target)


def describe(case) -> None:
    """What the example holds, for --hypothesis-show-statistics."""
    for block in case.plan.blocks:
        event(f"block: {type(block).__name__}")
    for truth in case.norms:
        event(f"norm: {truth.norm.kind}")
        event(f"norm in: {truth.location.split(' ', 1)[0]}")
    if case.residuals:
        event("residual Add")
    event(f"types: {'/'.join(sorted(dtype.name for dtype in case.dtypes))}")
