"""Runs cases in this process, one after another: reads "SEED INDEX" lines on stdin and, for each, writes
"BEGIN <id>" (flushed before anything runs, so that a parent watching this process knows which case killed it) and
then "END <id> <verdict as JSON>".

    python tests/adversarial/worker.py --library build/sanitize/libort_rmsnorm.so

A verdict is {"ok": bool, "outcome": ..., "detail": ...}. Passing outcomes: "error-ours" (a clean error naming
the op and node), "error-runtime" (onnxruntime refused the model or feeds itself), "match" (the outputs equal the
float64 reference within the contract's tolerance). Failing: "unclean-error" (an exception leaking from our code
without naming the node), "accepted-invalid" (a result for a node the contract rejects), "mismatch",
"rejected-valid" (an error for a valid, consistently declared model).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: op_models, reference

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402

from adversarial.cases import DTYPES, ONNX_TYPES, build, generate, judge, values  # noqa: E402
from reference import BFLOAT16, rmsnorm, tolerance  # noqa: E402
from ort_rmsnorm import runtime  # noqa: E402

import ml_dtypes  # noqa: E402

OUR_PREFIX = re.compile(r"(Skip)?RMSNorm node ('.*?'|\(unnamed\)): ", re.S)
# Texts of C++ exceptions that would reach onnxruntime from our code without passing through NormAttributes::Fail.
UNCLEAN = ("bad_alloc", "bad_array_new_length", "length_error", "std::", "vector::", "basic_string",
           "Unknown exception", "St9", "unordered_map")
KERNEL_RUN = re.compile(r"running (Skip)?RMSNorm node")


class Placeholder:
    """A tensor known by shape and type only (an empty one numpy cannot hold, or a value not computed)."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)


def session_options(library: str, threads: int = 1) -> ort.SessionOptions:
    options = ort.SessionOptions()
    # Each tensor its own malloc, so that AddressSanitizer's redzones surround every buffer the kernels touch.
    options.enable_cpu_mem_arena = False
    options.enable_mem_pattern = False
    options.intra_op_num_threads = threads
    options.log_severity_level = 4
    options.register_custom_ops_library(library)
    return options


def to_ort_value(spec: dict, array) -> ort.OrtValue:
    if array is None:  # an empty tensor whose other dims numpy cannot hold
        return ort.OrtValue.ortvalue_from_shape_and_type(spec["shape"], ONNX_TYPES[spec["dtype"]])
    return runtime.to_ort_value(array)


def to_numpy(value: ort.OrtValue):
    shape = value.shape()
    if math.prod(shape) == 0:
        dtype = value.data_type()[len("tensor("):-1]
        dtype = {"float": "float32", "double": "float64"}.get(dtype, dtype)
        return Placeholder(shape, DTYPES.get(dtype, np.float32))
    if value.data_type() == "tensor(bfloat16)":
        import ctypes
        raw = (ctypes.c_uint8 * (2 * math.prod(shape))).from_address(value.data_ptr())
        return np.frombuffer(bytes(raw), np.uint16).view(BFLOAT16).reshape(shape)
    return np.array(value.numpy(), copy=True)


def classify_error(stage: str, error: Exception, consistent_valid: bool) -> dict:
    message = str(error)
    if any(text in message for text in UNCLEAN) or (KERNEL_RUN.search(message) and not OUR_PREFIX.search(message)):
        return {"ok": False, "outcome": "unclean-error", "detail": f"{stage}: {message[:2000]}"}
    ours = bool(OUR_PREFIX.search(message))
    if consistent_valid:
        return {"ok": False, "outcome": "rejected-valid", "detail": f"{stage}: {message[:2000]}"}
    return {"ok": True, "outcome": "error-ours" if ours else "error-runtime", "stage": stage,
            "detail": message[:300]}


def declared_consistent(spec: dict) -> bool:
    declared, shape = spec["declared"], spec["shape"]
    if declared is None:
        return True
    if len(declared) != len(shape):
        return False
    return all(not isinstance(d, int) or d == s for d, s in zip(declared, shape))


def compare(actual, expected64: np.ndarray, dtype, scale=None) -> str | None:
    """None when actual matches the float64 reference: |a - e| <= atol + rtol |e|, NaN exactly where
    expected, and a reference beyond T's range may round to that infinity. With a scale, atol also has 2^-149 |scale|:
    the op forms x * factor in float32 before the scale multiplies it, and below float32's normal range that
    product is exact only to 2^-150."""
    if isinstance(actual, Placeholder):
        return None if actual.shape == expected64.shape else f"shape {actual.shape} != {expected64.shape}"
    a = np.asarray(actual).astype(np.float64)
    if a.shape != expected64.shape:
        return f"shape {a.shape} != {expected64.shape}"
    if np.dtype(actual.dtype) != np.dtype(dtype):
        return f"type {actual.dtype} != {dtype}"
    nan = np.isnan(expected64)
    if not np.array_equal(np.isnan(a), nan):
        where = np.argwhere(np.isnan(a) != nan)[0]
        return f"NaN pattern differs at {tuple(where)}: got {a[tuple(where)]!r}, want {expected64[tuple(where)]!r}"
    rtol, atol = tolerance(dtype)
    info = ml_dtypes.finfo(dtype) if np.dtype(dtype) == BFLOAT16 else np.finfo(dtype)
    e = expected64[~nan]
    got = a[~nan]
    with np.errstate(invalid="ignore", over="ignore"):
        error = np.abs(got - e)
        error[got == e] = 0.0
        bound = atol + rtol * np.abs(e)
        if scale is not None:
            bound = bound + 2.0**-149 * np.abs(np.broadcast_to(np.asarray(scale, np.float64), a.shape)[~nan])
        # beyond the largest finite T (within the tolerance): the rounding to T may give that infinity
        overflow = np.isinf(got) & np.isfinite(e) & (np.abs(e) * (1 + rtol) >= float(info.max)) & \
            (np.sign(got) == np.sign(e))
    bad = ~(error <= bound) & ~overflow
    if np.any(bad):
        worst = int(np.argmax(np.where(bad, 1.0, 0.0)))
        return (f"{int(bad.sum())} of {bad.size} elements outside tolerance (rtol={rtol:.3g}); e.g. got "
                f"{got.flat[worst]!r}, want {e.flat[worst]!r}")
    return None


def _same_values(actual, expected) -> bool:
    """The same bits (signed zeros included), or NaN in both."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    if actual.dtype != expected.dtype or actual.shape != expected.shape:
        return False
    bits = np.dtype(f"u{actual.dtype.itemsize}")
    return bool(np.all((actual.view(bits) == expected.view(bits)) | (np.isnan(actual) & np.isnan(expected))))


def check_outputs(case: dict, arrays: dict, produced: dict) -> dict:
    """Judges each node on the tensors it got and compares its outputs with the reference."""
    for node in case["nodes"]:
        reason, p = judge(node, arrays)
        if reason:
            return {"ok": False, "outcome": "accepted-invalid", "detail": f"node {node['name']!r}: {reason}"}
        x = arrays[p["x"]]
        inputs = [arrays[n] if n else None for n in (p["x"], p["skip"], p["scale"], p["bias"])]
        y_name = node["outputs"][0]
        sum_name = node["outputs"][1] if len(node["outputs"]) > 1 else ""
        if any(isinstance(t, Placeholder) for t in inputs if t is not None) or math.prod(x.shape) == 0:
            expected_y = expected_sum = reference_y = reference_sum = Placeholder(x.shape, x.dtype)
        else:
            with np.errstate(all="ignore"):
                expected_y, h = rmsnorm(x, inputs[2], axis=p["axis"], epsilon=p["epsilon"],
                                        eps_outside_sqrt=bool(p["eps_outside_sqrt"]), skip=inputs[1], bias=inputs[3],
                                        normalize_float32_sum=bool(p["normalize_float32_sum"]))
                reference_y = expected_y.astype(np.float32).astype(x.dtype)
            expected_sum, reference_sum = h.astype(np.float64), h
        for name, expected, reference_value, exact in ((y_name, expected_y, reference_y, False),
                                                       (sum_name, expected_sum, reference_sum, True)):
            if not name:
                continue
            if name in produced:
                actual = produced[name]
                if isinstance(expected, Placeholder):
                    same = tuple(actual.shape) == expected.shape
                    problem = None if same else f"shape {actual.shape} != {expected.shape}"
                elif exact and not isinstance(actual, Placeholder):
                    problem = None if _same_values(actual, reference_value) else \
                        "sum differs from round_T((x + skip) + bias)"
                else:
                    problem = compare(actual, expected, x.dtype, inputs[2])
                if problem:
                    return {"ok": False, "outcome": "mismatch", "detail": f"node {node['name']!r} output {name!r}: "
                            f"{problem}"}
                arrays[name] = actual
            else:  # not a graph output (run_case exposes every node output before calling this)
                arrays[name] = reference_value
    return {"ok": True, "outcome": "match"}


def consistent_and_valid(case: dict, arrays: dict) -> bool:
    """Whether the contract accepts every node and the model declares the fed tensors truthfully (then an error is
    a wrong rejection)."""
    if not all(declared_consistent(spec) for spec in case["inputs"]):
        return False
    # onnxruntime multiplies dims left to right with overflow checks: it refuses such an (empty) tensor itself
    for spec in case["inputs"] + case["initializers"]:
        count = 1
        for dim in spec["shape"]:
            count *= dim
            if count >= 2**63:
                return False
    if not case["outputs"]:
        return False
    arrays = dict(arrays)
    for node in case["nodes"]:
        reason, p = judge(node, arrays)
        if reason:
            return False
        x = arrays[p["x"]]
        for name in node["outputs"]:
            if name:
                arrays[name] = Placeholder(x.shape, x.dtype)
    return True


def _run(case: dict, library: str, feeds: dict, valid: bool):
    """(produced {output name: array}, None) or (None, the verdict of the error)."""
    model, _ = build(case)
    try:
        options = session_options(library, case.get("threads", 1))
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as error:  # noqa: BLE001 - every onnxruntime error type is judged by its text
        return None, classify_error("creation", error, valid)
    try:
        ort_feeds = {spec["name"]: to_ort_value(spec, feeds[spec["name"]]) for spec in case["inputs"]}
    except Exception as error:  # noqa: BLE001 - onnxruntime cannot make a tensor of that shape (its size overflows)
        return None, {"ok": True, "outcome": "error-runtime", "stage": "feeds", "detail": str(error)[:300]}
    try:
        outputs = session.run_with_ort_values(case["outputs"], ort_feeds)
    except Exception as error:  # noqa: BLE001
        return None, classify_error("run", error, valid)
    return {name: to_numpy(value) for name, value in zip(case["outputs"], outputs)}, None


def _same_bits(a, b) -> bool:
    if isinstance(a, Placeholder) or isinstance(b, Placeholder):
        return tuple(a.shape) == tuple(b.shape)
    return a.dtype == b.dtype and a.shape == b.shape and np.asarray(a).tobytes() == np.asarray(b).tobytes()


def run_case(case: dict, library: str) -> dict:
    _, feeds = build(case)
    arrays = {}
    for spec in case["inputs"]:
        array = feeds[spec["name"]]
        arrays[spec["name"]] = array if array is not None else Placeholder(spec["shape"], DTYPES[spec["dtype"]])
    for spec in case["initializers"]:
        array = values(case, spec)
        arrays[spec["name"]] = array if array is not None else Placeholder(spec["shape"], DTYPES[spec["dtype"]])
    valid = consistent_and_valid(case, arrays)
    produced, verdict = _run(case, library, feeds, valid)
    if verdict:
        return verdict
    inputs = {spec["name"] for spec in case["inputs"]} | {spec["name"] for spec in case["initializers"]}
    every_output = list(dict.fromkeys(n for node in case["nodes"] for n in node["outputs"] if n and n not in inputs))
    if every_output == case["outputs"]:
        return check_outputs(case, arrays, produced)
    # Values only nodes read (onnxruntime may let a node write into their buffers): the same model with every node
    # output a graph output is checked against the reference, and the graph's outputs must have the same bits.
    exposed = dict(case, outputs=every_output)
    exposed_produced, verdict = _run(exposed, library, feeds, False)
    if verdict:
        return {"ok": False, "outcome": "mismatch", "detail": "the model fails once every node output is a graph "
                f"output: {verdict.get('detail', '')}"}
    verdict = check_outputs(exposed, arrays, exposed_produced)
    if not verdict["ok"]:
        return verdict
    for name in case["outputs"]:
        if not _same_bits(produced[name], exposed_produced[name]):
            return {"ok": False, "outcome": "mismatch",
                    "detail": f"output {name!r} differs from the same model with every node output exposed"}
    return verdict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--library", required=True)
    args = parser.parse_args()
    for line in sys.stdin:
        seed, index = (int(part) for part in line.split())
        case = generate(seed, index)
        print(f"BEGIN {case['id']}", flush=True)
        try:
            verdict = run_case(case, args.library)
        except Exception as error:  # noqa: BLE001 - a harness problem, reported as a failing case
            verdict = {"ok": False, "outcome": "harness-error", "detail": f"{type(error).__name__}: {error}"}
        verdict["tags"] = case["tags"]
        print(f"END {case['id']} {json.dumps(verdict)}", flush=True)


if __name__ == "__main__":
    main()
