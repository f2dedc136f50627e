"""Side-by-side benchmark of the CUDA kernels against torch.nn.functional.rms_norm and a device-to-device copy.

Run by scripts/gpu-check on a machine with an NVIDIA GPU and torch::

    python tests/cuda/bench_torch.py --capi BUILD/libort_rmsnorm_cuda_capi.so --json OUT/torch.json

Our kernels are called through the C entry point of tests/cuda/launcher_capi.cc on torch's tensors and stream, so
the three contenders are timed the same way in one process: CUDA graphs of back-to-back calls, CUDA events, inputs
rotating through pools much larger than L2. SkipRMSNorm is compared with torch's ``x + skip`` followed by
``rms_norm`` (what the unfused model does). Our outputs are also checked against a float64 reference; the exit
status is 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys

import torch
import torch.nn.functional as F

TYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
SMALLEST_SUBNORMAL = {torch.float32: 2.0**-149, torch.float16: 2.0**-24, torch.bfloat16: 2.0**-133}
ROWS = (1, 32, 4096, 16384)
HIDDEN = (768, 1024, 2048, 4096, 8192, 16384)
POOL_BYTES = 1 << 30  # the largest tensor: 16384 x 16384 float32
EPSILON = 1e-6


def element_size(dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


class Kernels:
    """The CUDA launchers through ort_rmsnorm_cuda_launch (tests/cuda/launcher_capi.cc)."""

    def __init__(self, path: str):
        self._lib = ctypes.CDLL(path)
        launch = self._lib.ort_rmsnorm_cuda_launch
        launch.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                           ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64,
                           ctypes.c_float, ctypes.c_int, ctypes.c_void_p]
        launch.restype = ctypes.c_int
        self._lib.ort_rmsnorm_cuda_error_string.argtypes = [ctypes.c_int]
        self._lib.ort_rmsnorm_cuda_error_string.restype = ctypes.c_char_p

    def rms_norm(self, x, weight, y, eps, skip=None, sum_out=None):
        """y = RMSNorm(x [+ skip]) * weight over the last dim, on torch's current stream."""
        cols = x.shape[-1]
        error = self._lib.ort_rmsnorm_cuda_launch(
            TYPE_CODES[x.dtype], x.data_ptr(), skip.data_ptr() if skip is not None else None,
            sum_out.data_ptr() if sum_out is not None else None, y.data_ptr(), weight.data_ptr(),
            TYPE_CODES[weight.dtype], 1, x.numel() // cols, cols, eps, 0, torch.cuda.current_stream().cuda_stream)
        if error:
            raise RuntimeError(f"ort_rmsnorm_cuda_launch: {self._lib.ort_rmsnorm_cuda_error_string(error).decode()}")


def microseconds_per_call(fn, calls: int, reps: int = 3) -> float:
    """Time per call of fn(i), `calls` of them captured in one CUDA graph, replayed `reps` times."""
    fn(0)  # outside the capture: lazy loading, workspace allocation
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(i)
    graph.replay()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    stop.record()
    stop.synchronize()
    del graph
    return start.elapsed_time(stop) * 1000.0 / (calls * reps)


class Pool:
    """A 1 GiB tensor cut into slots of one [rows, cols] tensor each, 256-byte aligned."""

    def __init__(self, dtype, fill: bool):
        self.tensor = torch.empty(POOL_BYTES // element_size(dtype), dtype=dtype, device="cuda")
        if fill:
            self.tensor.uniform_(-2.0, 2.0)

    def slots(self, rows: int, cols: int):
        size = self.tensor.element_size()
        stride = -(-rows * cols * size // 256) * 256 // size
        count = max(1, self.tensor.numel() // stride)
        return lambda i: self.tensor[(i % count) * stride:(i % count) * stride + rows * cols].view(rows, cols)


def check_numerics(kernels: Kernels, dtype, rows: int, cols: int, skip: bool) -> dict:
    """Ours against a float64 reference (fails on a mismatch); torch's error reported for information."""
    generator = torch.Generator(device="cuda").manual_seed(rows * 7919 + cols)
    x = (torch.randn(rows, cols, device="cuda", generator=generator) + 0.3).to(dtype)
    s = torch.randn(rows, cols, device="cuda", generator=generator).to(dtype) if skip else None
    w = (torch.rand(cols, device="cuda", generator=generator) * 4 - 2).to(dtype)
    y, h_out = torch.empty_like(x), torch.empty_like(x) if skip else None
    kernels.rms_norm(x, w, y, EPSILON, skip=s, sum_out=h_out)
    h = (x.float() + s.float()).to(dtype) if skip else x
    hd = h.double()
    reference = hd * torch.rsqrt(hd.square().mean(-1, keepdim=True) + EPSILON) * w.double()
    allowed = SMALLEST_SUBNORMAL[dtype] + (UNIT_ROUNDOFF[dtype] + 40 * 2.0**-24) * reference.abs()
    ours_excess = ((y.double() - reference).abs() - allowed).max().item()
    theirs = F.rms_norm(h, (cols,), w, EPSILON)
    result = {
        "dtype": str(dtype).removeprefix("torch."), "rows": rows, "hidden": cols, "skip": skip,
        "ours_within_tolerance": ours_excess <= 0.0,
        "ours_max_abs_error": (y.double() - reference).abs().max().item(),
        "torch_max_abs_error": (theirs.double() - reference).abs().max().item(),
        "sum_exact": bool(torch.equal(h_out, h)) if skip else None,
    }
    return result


def run(kernels: Kernels, quick: bool) -> tuple[list[dict], list[dict]]:
    rows_out, numerics = [], []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for rows, cols, skip in ((1, 768, False), (4096, 4096, True), (32, 16384, False), (3, 4097, True)):
            numerics.append(check_numerics(kernels, dtype, rows, cols, skip))
        pools = {name: Pool(dtype, fill=name in ("x", "skip")) for name in ("x", "skip", "y", "sum")}
        weight = (torch.rand(max(HIDDEN), device="cuda") * 4 - 2).to(dtype)
        for rows in ROWS:
            for cols in HIDDEN:
                if quick and rows * cols > 1 << 26:
                    continue
                at = {name: pool.slots(rows, cols) for name, pool in pools.items()}
                w = weight[:cols]
                bytes_per_tensor = rows * cols * element_size(dtype)
                for skip in (False, True):
                    moved = bytes_per_tensor * (4 if skip else 2)
                    calls = int(min(1000, max(10, 4000 / max(2.0, moved / 3.0e6))))
                    if skip:
                        ours = lambda i: kernels.rms_norm(at["x"](i), w, at["y"](i), EPSILON, skip=at["skip"](i),
                                                          sum_out=at["sum"](i))
                        theirs = lambda i: F.rms_norm(at["x"](i) + at["skip"](i), (cols,), w, EPSILON)

                        def copy(i):
                            at["y"](i).copy_(at["x"](i))
                            at["sum"](i).copy_(at["skip"](i))
                    else:
                        ours = lambda i: kernels.rms_norm(at["x"](i), w, at["y"](i), EPSILON)
                        theirs = lambda i: F.rms_norm(at["x"](i), (cols,), w, EPSILON)
                        copy = lambda i: at["y"](i).copy_(at["x"](i))
                    ours_us = microseconds_per_call(ours, calls)
                    torch_us = microseconds_per_call(theirs, calls)
                    copy_us = microseconds_per_call(copy, calls)
                    rows_out.append({
                        "op": "SkipRMSNorm" if skip else "RMSNorm", "dtype": str(dtype).removeprefix("torch."),
                        "rows": rows, "hidden": cols, "bytes": moved, "ours_us": ours_us, "torch_us": torch_us,
                        "copy_us": copy_us, "speedup_vs_torch": torch_us / ours_us,
                        "fraction_of_copy": copy_us / ours_us,
                    })
        del pools
        torch.cuda.empty_cache()
    return rows_out, numerics


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--capi", required=True, help="path of libort_rmsnorm_cuda_capi.so")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--quick", action="store_true", help="skip tensors above 64M elements")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("torch sees no GPU", file=sys.stderr)
        return 2
    kernels = Kernels(args.capi)
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    rows, numerics = run(kernels, args.quick)

    print(f"\n{'op':12} {'dtype':9} {'rows':>6} {'H':>6} {'ours_us':>9} {'torch_us':>9} {'copy_us':>9} "
          f"{'vs torch':>9} {'%copy':>7}")
    for r in rows:
        print(f"{r['op']:12} {r['dtype']:9} {r['rows']:6} {r['hidden']:6} {r['ours_us']:9.2f} {r['torch_us']:9.2f} "
              f"{r['copy_us']:9.2f} {r['speedup_vs_torch']:8.2f}x {100 * r['fraction_of_copy']:6.1f}%")
    slowest = min(rows, key=lambda r: r["speedup_vs_torch"])
    print(f"\ntarget faster than torch everywhere: slowest ratio {slowest['speedup_vs_torch']:.2f}x "
          f"({slowest['op']} {slowest['dtype']} {slowest['rows']}x{slowest['hidden']}) -> "
          f"{'met' if slowest['speedup_vs_torch'] > 1.0 else 'NOT met'}")
    failures = [n for n in numerics if not n["ours_within_tolerance"] or n["sum_exact"] is False]
    for n in numerics:
        print(f"numerics {n['dtype']:9} {n['rows']}x{n['hidden']} skip={n['skip']}: ours max |err| "
              f"{n['ours_max_abs_error']:.3g} ({'FAIL' if n in failures else 'ok'}), "
              f"torch max |err| {n['torch_max_abs_error']:.3g}")
    if args.json:
        temporary = args.json + ".tmp"
        with open(temporary, "w") as f:
            json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name(),
                       "timing": "CUDA graph of back-to-back calls, CUDA events; inputs rotate through 1 GiB pools",
                       "bench": rows, "numerics": numerics}, f, indent=1)
        os.replace(temporary, args.json)
    print(f"{len(numerics) - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
