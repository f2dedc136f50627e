"""The machine a benchmark ran on: processor, cores this process may use, versions, kernel set, load average."""

from __future__ import annotations

import datetime
import os
import platform

import onnxruntime as ort

from .._library import CPU_ISA_ENV, build_info, cpu_kernel_set
from ..auto_table import cpuinfo


def all_threads() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def machine_info() -> dict:
    cpu = cpu_identity()
    forced = os.environ.get(CPU_ISA_ENV) or None
    info = {
        "processor": platform.processor() or platform.machine(),
        "cpu_model": cpu_model(),
        "cpu": cpu,
        "cores": all_threads(),
        "python": platform.python_version(),
        "onnxruntime": ort.__version__,
        "ort_rmsnorm": build_info(),
        "forced_isa": forced,
        "kernels": cpu_kernel_set()[0],
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    if hasattr(os, "getloadavg"):
        info["load_average_at_start"] = os.getloadavg()
    return info


# The CPU flags (as /proc/cpuinfo names them) each kernel set needs (custom_op_src/kernels/dispatch.cpp): a result
# records those the CPU has. Which set ran is the library's answer (_library.cpu_kernel_set).
KERNEL_FLAGS = {
    "scalar": (),
    "neon": ("asimd",),
    "avx2": ("avx2", "fma", "f16c"),
    "avx512": ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl"),
    "avx512bf16": ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"),
    "avx512fp16": ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16", "avx512_fp16"),
}


def cpu_identity() -> dict:
    """Vendor, family, model, stepping and the flags that decide the kernels, from /proc/cpuinfo (empty elsewhere)."""
    fields = cpuinfo()
    flags = fields.get("flags", fields.get("Features", "")).split()
    relevant = sorted({flag for needed in KERNEL_FLAGS.values() for flag in needed} & set(flags))

    def number(key):
        value = fields.get(key, "")
        return int(value, 0) if value.isdigit() or value.startswith("0x") else None

    return {"vendor": fields.get("vendor_id") or fields.get("CPU implementer"),
            "family": number("cpu family"), "model": number("model"), "stepping": number("stepping"),
            "flags": relevant}


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as file:
            return next(line.split(":", 1)[1].strip() for line in file if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


def machine_line(machine: dict) -> str:
    """One line for the head of a table."""
    if machine.get("forced_isa"):
        isa = f"{machine['forced_isa']} (forced by {CPU_ISA_ENV})"
    else:
        isa = f"{machine.get('kernels', 'best available')} (the library's choice)"
    cpu = machine.get("cpu") or {}
    identity = ""
    if cpu.get("family") is not None:
        identity = f" ({cpu.get('vendor')} family {cpu['family']} model {cpu.get('model')}; {' '.join(cpu['flags'])})"
    load = machine.get("load_average_at_start")
    return (f"{machine['cpu_model']}{identity}, {machine['cores']} cores, onnxruntime {machine['onnxruntime']}, "
            f"kernels: {isa}, {machine['date']}" + (f", load average {load[0]:.2f} at start" if load else ""))


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
