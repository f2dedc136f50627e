"""The machine a benchmark ran on: processor, cores this process may use, versions, kernel set, load average."""

from __future__ import annotations

import datetime
import os
import platform

import onnxruntime as ort

from .._library import build_info

ISA_ENV = "ORT_RMSNORM_CPU_ISA"


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
        "forced_isa": os.environ.get(ISA_ENV) or None,
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
    isa = machine.get("forced_isa") or "best available"
    load = machine.get("load_average_at_start")
    return (f"{machine['cpu_model']}, {machine['cores']} cores, onnxruntime {machine['onnxruntime']}, kernels: {isa}, "
            f"{machine['date']}" + (f", load average {load[0]:.2f} at start" if load else ""))
