"""The kernel benchmark's plot: GB/s against H per contender (needs matplotlib, the ``bench`` extra)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ..model.write import write_atomically
from .cases import case_from_dict
from .machine import machine_line
from .contenders import DTYPES, Shape, moved_bytes
from .tables import time_of

PLOTTED = ("copy", "rmsnorm", "ort_simplified", "onnx_rmsnorm23", "decomposed", "copy2", "skip_rmsnorm",
           "ort_skip_simplified", "decomposed_skip")


def can_plot() -> bool:
    """Whether :func:`write_plot` can run: it needs matplotlib, an optional dependency (the ``bench`` extra)."""
    return importlib.util.find_spec("matplotlib") is not None


def write_plot(report: dict, path: Path) -> None:
    """GB/s against H per contender: one panel per (dtype, rows, threads)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = [case_from_dict(c) for c in report["cases"]]
    colors = plt.get_cmap("tab10")  # one color per contender in every panel
    panels = sorted({(c.rows, c.threads) for c in cases})
    dtypes = [d for d in DTYPES if any(c.dtype == d for c in cases)]
    figure, axes = plt.subplots(len(dtypes), len(panels), figsize=(4.2 * len(panels), 3.4 * len(dtypes)),
                                squeeze=False)
    for i, dtype in enumerate(dtypes):
        for j, (rows, threads) in enumerate(panels):
            axis = axes[i][j]
            group = sorted((c for c in cases if c.dtype == dtype and c.rows == rows and c.threads == threads),
                           key=lambda c: c.hidden)
            for column in PLOTTED:
                points = []
                for case in group:
                    if seconds := time_of(case, column):
                        family = column if column in ("copy", "copy2") else case.get(column).family
                        size = moved_bytes(family, Shape(dtype, rows, case.hidden))
                        points.append((case.hidden, size / seconds / 1e9))
                if points:
                    ours = column in ("rmsnorm", "skip_rmsnorm")
                    style = "--" if column.startswith("copy") else ("-" if ours else ":")
                    axis.plot(*zip(*points), style, marker="o", markersize=3, label=column,
                              color=colors(PLOTTED.index(column)))
            axis.set_xscale("log", base=2)
            sizes = [c.hidden for c in group]
            axis.set_xticks(sizes, [str(h) for h in sizes], fontsize=7, rotation=45)
            axis.minorticks_off()
            axis.set_title(f"{dtype}, {rows} x H, {threads} thread{'s' if threads > 1 else ''}", fontsize=9)
            axis.set_xlabel("H")
            axis.set_ylabel("GB/s")
            axis.grid(True, alpha=0.3)
    axes[0][0].legend(fontsize=7)
    figure.suptitle(machine_line(report["machine"]), fontsize=8)
    figure.tight_layout()
    write_atomically(path, lambda temporary: figure.savefig(temporary, dpi=90, format="png"))
    plt.close(figure)
