"""`ort-rmsnorm info`: the CPU kernel set the library's dispatch picks, and whether the CUDA kernels can run."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys

import pytest

import ort_rmsnorm
from ort_rmsnorm import cli as cli_module

# What each x86-64 set needs, as Linux names the CPU's features in /proc/cpuinfo (it leaves out the AVX-512 ones when
# the OS does not save their registers); custom_op_src/kernels/dispatch.cpp checks the same with cpuid and xgetbv.
_X86_FLAGS = {
    "scalar": set(),
    "avx2": {"avx2", "fma", "f16c"},
    "avx512": {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl"},
    "avx512bf16": {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"},
    "avx512fp16": {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16",
                   "avx512_fp16"},
}


def _env(**changes: str | None) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "ORT_RMSNORM_CPU_ISA"}
    env.update({key: value for key, value in changes.items() if value is not None})
    return env


def _info(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ort_rmsnorm.cli", "info"], capture_output=True, text=True, env=env,
                          timeout=300)


def _kernel_line(stdout: str) -> str:
    return next(line for line in stdout.splitlines() if line.startswith("CPU kernels in use:"))


def test_info_names_the_set_dispatch_picks():
    result = _info(_env())
    assert result.returncode == 0, result.stderr
    match = re.fullmatch(r"CPU kernels in use: (\S+) \((.+)\)", _kernel_line(result.stdout))
    assert match, result.stdout
    chosen, built = match.group(1), ort_rmsnorm.build_info()["cpu_isas"]
    assert chosen in built
    # The library itself: the chosen set registers when forced, every more capable one of the build is refused.
    library = ort_rmsnorm.get_library_path()
    assert ort_rmsnorm._library._registration_problem(library, chosen) is None
    for isa in built[built.index(chosen) + 1:]:
        assert "not supported by this CPU" in ort_rmsnorm._library._registration_problem(library, isa), isa
        assert isa in match.group(2)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64 feature flags")
def test_the_set_info_names_agrees_with_the_cpu_flags_linux_reports():
    try:
        with open("/proc/cpuinfo") as file:
            flags = set(next(line for line in file if line.startswith("flags")).split(":", 1)[1].split())
    except (OSError, StopIteration):
        pytest.skip("no /proc/cpuinfo flags")
    built = ort_rmsnorm.build_info()["cpu_isas"]
    expected = [isa for isa in built if _X86_FLAGS[isa] <= flags][-1]
    assert _kernel_line(_info(_env()).stdout).startswith(f"CPU kernels in use: {expected} ")


def test_a_forced_set_is_named_as_forced():
    result = _info(_env(ORT_RMSNORM_CPU_ISA="scalar"))
    assert result.returncode == 0, result.stderr
    assert _kernel_line(result.stdout) == "CPU kernels in use: scalar (forced by ORT_RMSNORM_CPU_ISA=scalar)"


def test_a_forced_set_the_library_refuses_is_reported():
    result = _info(_env(ORT_RMSNORM_CPU_ISA="sse9"))
    assert result.returncode == 0, result.stderr
    line = _kernel_line(result.stdout)
    assert line.startswith("CPU kernels in use: none: ") and "ORT_RMSNORM_CPU_ISA=sse9" in line, line
    assert "unknown instruction set" in line, line


def test_info_says_whether_the_cuda_kernels_can_run():
    import onnxruntime

    result = _info(_env())
    line = next(line for line in result.stdout.splitlines() if line.startswith("CUDA kernels:"))
    provider = "CUDAExecutionProvider" in onnxruntime.get_available_providers()
    assert line == cli_module._cuda_line(ort_rmsnorm.has_cuda(), provider,
                                         ort_rmsnorm.build_info().get("cuda_architectures"))


@pytest.mark.parametrize("built, provider, expected", [
    (True, True, "sessions using it run them"),
    (True, False, "they cannot run here (that needs onnxruntime-gpu instead of onnxruntime)"),
    (False, True, "not built, though this onnxruntime has CUDAExecutionProvider"),
    (False, False, "not built (this onnxruntime has no CUDAExecutionProvider to run them either)"),
])
def test_cuda_line(built, provider, expected):
    assert expected in cli_module._cuda_line(built, provider, "80;90")


@pytest.mark.parametrize("forced", ["bogus", "neon" if platform.machine() == "x86_64" else "avx2"])
def test_forced_set_the_library_refuses_is_named_before_any_output(small_llama, forced):
    """A forced set the library will not run (unknown, or of another architecture) is the error, said first: not
    blamed on the input model, and `fuse --verify` writes nothing."""
    destination = small_llama.with_name("fused.onnx")
    commands = [["fuse", small_llama, destination, "--verify"], ["verify", small_llama, small_llama]]
    for command in commands:
        result = subprocess.run([sys.executable, "-m", "ort_rmsnorm.cli", *map(str, command)], capture_output=True,
                                text=True, env=_env(ORT_RMSNORM_CPU_ISA=forced), timeout=300)
        assert result.returncode == 2, result
        lines = result.stderr.strip().splitlines()
        expected = f"ort-rmsnorm {command[0]}: error: ORT_RMSNORM_CPU_ISA={forced}: "
        assert len(lines) == 1 and lines[0].startswith(expected), result.stderr
        assert str(small_llama) not in lines[0] and "unset ORT_RMSNORM_CPU_ISA" in lines[0], lines[0]
        assert not destination.exists()
