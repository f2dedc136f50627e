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
    cpu = cpu_identity()
    forced = os.environ.get(ISA_ENV) or None
    info = {
        "processor": platform.processor() or platform.machine(),
        "cpu_model": cpu_model(),
        "cpu": cpu,
        "cores": all_threads(),
        "python": platform.python_version(),
        "onnxruntime": ort.__version__,
        "ort_rmsnorm": build_info(),
        "forced_isa": forced,
        "kernels": forced or default_kernels(build_info().get("cpu_isas", []), cpu["flags"]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    if hasattr(os, "getloadavg"):
        info["load_average_at_start"] = os.getloadavg()
    return info


# The CPU flags (as /proc/cpuinfo names them) each kernel set needs, in the order of custom_op_src/kernels/dispatch.cpp,
# which runs the last set of its build whose flags the CPU has (the OS's support included: Linux lists AVX-512 only
# when it saves the registers). Mirrored here because the library tells no one which set it chose.
KERNEL_FLAGS = {
    "scalar": (),
    "neon": ("asimd",),
    "avx2": ("avx2", "fma", "f16c"),
    "avx512": ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl"),
    "avx512bf16": ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"),
    "avx512fp16": ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16", "avx512_fp16"),
}


def default_kernels(compiled: list[str], flags: list[str]) -> str:
    """The kernel set the library runs when none is forced: the most capable one built that this CPU supports."""
    chosen = "scalar"
    for isa, needed in KERNEL_FLAGS.items():
        if isa in compiled and all(flag in flags for flag in needed) and (isa != "neon" or platform.machine() in (
                "aarch64", "arm64")):
            chosen = isa
    return chosen


def cpu_identity() -> dict:
    """Vendor, family, model, stepping and the flags that decide the kernels, from /proc/cpuinfo (empty elsewhere)."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as file:
            for line in file:
                if not line.strip():
                    break  # the first processor describes them all
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
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
        isa = f"{machine['forced_isa']} (forced by {ISA_ENV})"
    else:
        isa = f"{machine.get('kernels', 'best available')} (the library's choice)"
    cpu = machine.get("cpu") or {}
    identity = ""
    if cpu.get("family") is not None:
        identity = f" ({cpu.get('vendor')} family {cpu['family']} model {cpu.get('model')}; {' '.join(cpu['flags'])})"
    load = machine.get("load_average_at_start")
    return (f"{machine['cpu_model']}{identity}, {machine['cores']} cores, onnxruntime {machine['onnxruntime']}, "
            f"kernels: {isa}, {machine['date']}" + (f", load average {load[0]:.2f} at start" if load else ""))
