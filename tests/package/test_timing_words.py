"""How timings are worded: a slowdown as a slowdown, and a note when other processes loaded the machine."""

from __future__ import annotations

import pytest

from ort_rmsnorm.bench import machine
from ort_rmsnorm.bench.cases import CaseResult, Measurement
from ort_rmsnorm.bench.tables import faster_or_slower, format_case_line


@pytest.mark.parametrize("speedup, expected", [
    (1.35, "1.35x faster than ort"),
    (1.0, "1.00x faster than ort"),
    (0.74, "1.35x slower than ort"),
    (None, "no time for ort"),
])
def test_faster_or_slower(speedup, expected):
    assert faster_or_slower(speedup, "ort") == expected


def test_a_kernel_slower_than_onnxruntimes_is_called_slower():
    def measurement(name: str, speedup: float) -> Measurement:
        return Measurement(name, "norm", seconds=2e-6, spread=0.01, samples=5, calls_per_sample=100, bytes=8192,
                           gb_per_s=4.1, vs_roofline=1.1, speedup_vs_ort=speedup)

    case = CaseResult("float32", 1, 1024, 1, "wall",
                      [measurement("rmsnorm", 0.74), measurement("skip_rmsnorm", 2.0)], unsupported={})
    line = format_case_line(case)
    assert "rmsnorm" in line and "1.35x slower than ort" in line and "2.00x faster than ort" in line, line
    assert "x0.74 faster" not in line


def test_load_note(monkeypatch):
    monkeypatch.setattr(machine, "all_threads", lambda: 2)
    assert machine.load_note([], 1) is None
    assert machine.load_note([0.3, 1.9], 1) is None
    note = machine.load_note([1.2, 6.14], 1)
    assert note is not None and "6.1 on 2 cores" in note and "unreliable" in note
