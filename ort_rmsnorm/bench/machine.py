"""The machine a benchmark ran on: processor, cores this process may use, versions, kernel set, load average."""

from __future__ import annotations

import datetime
import os
import platform

import onnxruntime as ort

from .._library import CPU_ISA_ENV, build_info, cpu_kernel_set


def all_threads() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def machine_info() -> dict:
    info = {
        "processor": platform.processor() or platform.machine(),
        "cpu_model": cpu_model(),
        "cores": all_threads(),
        "python": platform.python_version(),
        "onnxruntime": ort.__version__,
        "ort_rmsnorm": build_info(),
        "forced_isa": os.environ.get(CPU_ISA_ENV) or None,
        "kernels": cpu_kernel_set()[0],
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    if hasattr(os, "getloadavg"):
        info["load_average_at_start"] = os.getloadavg()
    return info


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as file:
            return next(line.split(":", 1)[1].strip() for line in file if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


def machine_line(machine: dict) -> str:
    """One line for the head of a table."""
    isa = machine.get("kernels") or machine.get("forced_isa") or "best available"
    load = machine.get("load_average_at_start")
    return (f"{machine['cpu_model']}, {machine['cores']} cores, onnxruntime {machine['onnxruntime']}, kernels: {isa}, "
            f"{machine['date']}" + (f", load average {load[0]:.2f} at start" if load else ""))


def load_note(load_averages: list[float], threads: int) -> str | None:
    """A note when other processes competed for the cores while something was timed: the highest of the 1-minute
    load averages seen (``os.getloadavg()[0]`` before and after) above the cores this process may use. Side-by-side
    ratios share that noise, but a difference of a few percent is then within it."""
    if not load_averages:
        return None
    load, cores = max(load_averages), all_threads()
    if load <= cores:
        return None
    return (f"note: the load average reached {load:.1f} on {cores} core{'s' if cores > 1 else ''} while this ran "
            f"({threads} thread{'s' if threads > 1 else ''} of them ours): other processes took CPU time, so these "
            "times are unreliable and a few percent either way is noise; rerun on an idle machine to trust them")


def load_average() -> list[float]:
    """The 1-minute load average as a one-element list, or an empty one where the system has none."""
    return [os.getloadavg()[0]] if hasattr(os, "getloadavg") else []
