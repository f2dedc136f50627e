"""``ort-rmsnorm tune``: this machine's table for the ``auto`` target, measured where decoders run norms.

For each op (``RMSNorm``, ``SkipRMSNorm``) and type, from the shortest rows up, ours and onnxruntime's op are timed
cold, side by side (:mod:`ort_rmsnorm.bench.cold`). A length is onnxruntime's when its op was faster in at least three
of four rounds, ours when ours was, and a tie otherwise. The first length that is ours ends that op and type's search
(longer rows only favour our kernels more); onnxruntime's op is taken up to the longest length before it that was
onnxruntime's, ties below that included (a tie costs nothing either way; ending the search at the first tie would
hand rows to the op measured slower at longer lengths). The table is written to
:func:`ort_rmsnorm.auto_table.machine_table_path`, where ``auto`` reads it.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Callable, Sequence

import onnxruntime as ort

from .._library import get_library_path
from ..auto_table import AutoTable, cpu_key
from ..contract import RMSNORM, SKIP_RMSNORM
from . import cold

DEFAULT_HIDDEN = (64, 128, 256, 384, 512, 576, 640, 768, 896, 1024, 1536, 2048, 3072, 4096, 8192)
QUICK_HIDDEN = (64, 256, 576, 1024, 2048)
DEFAULT_DTYPES = ("float32", "float16")
DEFAULT_WEIGHT_MIB = 8.0  # per stage: more than the L2 cache of the CPUs this runs on
STAGES = 8


@dataclasses.dataclass(frozen=True)
class Cell:
    op: str
    dtype: str
    hidden: int
    ours_us: float
    theirs_us: float
    ratios: tuple[float, float, float]  # quartiles of ours / theirs over the rounds
    verdict: str  # THEIRS, OURS or TIE

    @property
    def theirs_faster(self) -> bool:
        return self.verdict == THEIRS

    def line(self) -> str:
        q1, median, q3 = self.ratios
        verdict = {THEIRS: "onnxruntime's op faster", OURS: "ours faster", TIE: "a tie"}[self.verdict]
        return (f"{self.op:11} {self.dtype:8} H {self.hidden:5}: ours {self.ours_us:6.2f} us, onnxruntime's "
                f"{self.theirs_us:6.2f} us, ours/theirs {median:.3f} [{q1:.3f}-{q3:.3f}]: {verdict}")


THEIRS, OURS, TIE = "theirs", "ours", "tie"


def verdict(ratios: Sequence[float]) -> str:
    """Ours / theirs per round: THEIRS where ours was slower in at least three of four rounds, OURS where it was faster
    in at least three of four, TIE otherwise."""
    if sum(ratio > 1 for ratio in ratios) * 4 >= len(ratios) * 3:
        return THEIRS
    if sum(ratio < 1 for ratio in ratios) * 4 >= len(ratios) * 3:
        return OURS
    return TIE


def measure(hidden_sizes: Sequence[int], dtypes: Sequence[str], *, rounds: int, runs: int, weight_mib: float,
            library: str | None = None, progress: Callable[[str], None] = print) -> tuple[AutoTable, list[Cell]]:
    """The table and every cell measured (see the module's docstring)."""
    library = library or str(get_library_path())
    limits: dict[str, dict[str, int]] = {}
    cells: list[Cell] = []
    done: set[tuple[str, str]] = set()
    for hidden in sorted(set(hidden_sizes)):
        pending = [(op, dtype) for dtype in dtypes for op in (RMSNORM, SKIP_RMSNORM) if (op, dtype) not in done]
        if not pending:
            break
        stage_weights = cold.weights(hidden, STAGES, weight_mib)
        for op, dtype in pending:
            contenders = [cold.Contender("ours", op, library), cold.Contender("theirs", cold.OPPONENT[op])]
            result = cold.measure(contenders, dtype, hidden, stage_weights, rounds=rounds, runs=runs)
            ratios = result.ratios("ours", "theirs")
            cell = Cell(op, dtype, hidden, result.median("ours"), result.median("theirs"), cold.quartiles(ratios),
                        verdict(ratios))
            cells.append(cell)
            progress(cell.line())
            if cell.verdict == THEIRS:
                limits.setdefault(op, {})[dtype] = hidden
            elif cell.verdict == OURS:
                done.add((op, dtype))
    measured_on = (f"measured cold on {cpu_key()}, onnxruntime {ort.__version__}, one thread, "
                   f"{time.strftime('%Y-%m-%d')}")
    return AutoTable(limits, measured_on, "measured"), cells


def load_line() -> str:
    return f"load average {os.getloadavg()[0]:.2f}" if hasattr(os, "getloadavg") else "load average unknown"


def describe(table: AutoTable) -> list[str]:
    lines = []
    for op in (RMSNORM, SKIP_RMSNORM):
        for dtype, limit in sorted(table.faster_up_to.get(op, {}).items()):
            lines.append(f"  {op} {dtype}: onnxruntime's op on rows of up to {limit} elements, ours above")
    return lines or ["  ours at every length measured"]


def text(table: AutoTable) -> str:
    """The table file's text: the table, this CPU and this onnxruntime."""
    return table.to_json(cpu_key(), ort.__version__)


def write(table: AutoTable, path: Path) -> None:
    from ..durable import write_file

    content = text(table)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_file(path, lambda staged: staged.write_text(content))
