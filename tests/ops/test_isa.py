"""Each CPU instruction-set path, forced through ORT_RMSNORM_CPU_ISA, through onnxruntime: against the reference and
against each other. (tests/cpp/kernel_tests.cpp calls the same kernels directly, without onnxruntime.)"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import ort_rmsnorm

ALL_ISAS = ["scalar", "avx2", "avx512", "avx512bf16", "avx512fp16", "neon"]

# Runs in a fresh process (the kernel set is chosen once per process): fuses nothing, just runs one-node models over
# every type pair and saves the outputs.
_CHILD = textwrap.dedent(
    """
    import sys, numpy as np
    sys.path.insert(0, {tests_dir!r})
    from op_models import TYPE_PAIRS, norm_model
    from reference import random_array
    from ort_rmsnorm.runtime import make_session, run
    rng = np.random.default_rng(5)
    results = {{}}
    for index, (x_dtype, scale_dtype) in enumerate(TYPE_PAIRS):
        for skip in (False, True):
            model = norm_model(x_dtype, scale_dtype, skip=skip, sum_output=skip, x_shape=("r", "d"),
                               scale_shape=["d"], attributes={{"epsilon": 1e-4, "eps_outside_sqrt": int(skip)}})
            session = make_session(model, threads=2)
            for cols in (1, 7, 16, 33, 1000, 4097):
                x = random_array(rng, (9, cols), x_dtype)
                s = random_array(rng, (9, cols), x_dtype)
                scale = rng.uniform(-2, 2, cols).astype(np.float32).astype(scale_dtype)
                feeds = {{"x": x, "scale": scale, **({{"skip": s}} if skip else {{}})}}
                key = f"{{index}}-{{int(skip)}}-{{cols}}"
                results[key + "-x"] = x.astype(np.float64)
                results[key + "-skip"] = s.astype(np.float64)
                results[key + "-scale"] = scale.astype(np.float64)
                results[key + "-y"] = run(session, feeds)[0].astype(np.float64)
    np.savez(sys.argv[1], **results)
    """
)


def _available_isas() -> list[str]:
    return [isa for isa in ALL_ISAS if isa in ort_rmsnorm.build_info().get("cpu_isas", [])]


def _run_child(isa: str, out_path) -> subprocess.CompletedProcess:
    """Runs the cases with ORT_RMSNORM_CPU_ISA=isa ("" = unset: the library's own choice)."""
    code = _CHILD.format(tests_dir=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {k: v for k, v in os.environ.items() if k != "ORT_RMSNORM_CPU_ISA"}
    if isa:
        env["ORT_RMSNORM_CPU_ISA"] = isa
    return subprocess.run([sys.executable, "-c", code, str(out_path)], env=env, capture_output=True, text=True)


@pytest.fixture(scope="module")
def isa_outputs(tmp_path_factory):
    outputs = {}
    for isa in _available_isas():
        path = tmp_path_factory.mktemp(isa) / "out.npz"
        result = _run_child(isa, path)
        if result.returncode != 0 and "not supported by this CPU" in result.stderr:
            continue  # compiled in, but this CPU cannot run it
        assert result.returncode == 0, result.stderr
        outputs[isa] = dict(np.load(path))
    return outputs


def test_every_runnable_isa_matches_the_reference(isa_outputs):
    from op_models import TYPE_PAIRS
    from reference import assert_matches_reference, rmsnorm

    assert "scalar" in isa_outputs
    for isa, results in isa_outputs.items():
        for key in [k[:-2] for k in results if k.endswith("-y")]:
            index, skip, _ = key.split("-")
            x_dtype, _ = TYPE_PAIRS[int(index)]
            x = results[key + "-x"].astype(np.float32).astype(x_dtype)
            s = results[key + "-skip"].astype(np.float32).astype(x_dtype) if skip == "1" else None
            expected, _ = rmsnorm(x, results[key + "-scale"], epsilon=1e-4, eps_outside_sqrt=skip == "1", skip=s)
            assert_matches_reference(results[key + "-y"], expected, x_dtype, f"{isa} case {key}")


def test_isas_agree_with_each_other(isa_outputs):
    """Paths differ only in float32 summation order: within two tolerances of each other."""
    from op_models import TYPE_PAIRS
    from reference import tolerance

    baseline = isa_outputs["scalar"]
    for isa, results in isa_outputs.items():
        for key in [k for k in results if k.endswith("-y")]:
            x_dtype, _ = TYPE_PAIRS[int(key.split("-")[0])]
            rtol, atol = tolerance(x_dtype)
            np.testing.assert_allclose(results[key], baseline[key], rtol=2 * rtol, atol=atol, err_msg=f"{isa} {key}")


def test_best_isa_is_the_default(tmp_path, isa_outputs):
    """Without the variable, the library runs the most capable set this CPU supports: bit-identical results."""
    best = [isa for isa in ALL_ISAS if isa in isa_outputs][-1]
    path = tmp_path / "default.npz"
    result = _run_child("", path)
    assert result.returncode == 0, result.stderr
    default = dict(np.load(path))
    for key, value in isa_outputs[best].items():
        np.testing.assert_array_equal(default[key], value, err_msg=f"default vs {best}: {key}")


_FOREIGN_ISA = "neon" if os.uname().machine in ("x86_64", "AMD64") else "avx2"


@pytest.mark.parametrize("isa,expected", [("sse9", "unknown instruction set"),
                                          (_FOREIGN_ISA, "not supported by this CPU or build")])
def test_forcing_an_unavailable_isa_fails_clearly(tmp_path, isa, expected):
    result = _run_child(isa, tmp_path / "x.npz")
    assert result.returncode != 0
    assert f"ORT_RMSNORM_CPU_ISA={isa}" in result.stderr and expected in result.stderr
