"""Independent float64 reference for RMSNorm/SkipRMSNorm and the tolerances that follow from the op's numerics.

Kept free of the package under test: only numpy and ml_dtypes.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
FLOAT_TYPES = (np.dtype(np.float32), np.dtype(np.float16), BFLOAT16)

# Unit roundoff (half an ulp at 1) and smallest positive subnormal of each element type.
UNIT_ROUNDOFF = {np.dtype(np.float32): 2.0**-24, np.dtype(np.float16): 2.0**-11, BFLOAT16: 2.0**-8}
SMALLEST_SUBNORMAL = {np.dtype(np.float32): 2.0**-149, np.dtype(np.float16): 2.0**-24, BFLOAT16: 2.0**-133}


def rmsnorm(x, scale=None, axis=-1, epsilon=1e-5, eps_outside_sqrt=False, skip=None, bias=None,
            normalize_float32_sum=False):
    """(y in float64, h). RMSNorm: h = x, normalized. SkipRMSNorm (skip given): s = (f32(x) + f32(skip)) + f32(bias)
    formed in float32 (bias broadcast like scale, its term only when given), h = round_T(s) (the `sum` output), and
    the normalized values are h, or s itself with normalize_float32_sum."""
    x = np.asarray(x)
    if skip is not None:
        s = x.astype(np.float32) + np.asarray(skip).astype(np.float32)
        if bias is not None:
            s = s + np.asarray(bias).astype(np.float32)
        with np.errstate(over="ignore"):  # a float32 sum beyond T's range rounds to inf, as the op's does
            h = s.astype(x.dtype)
        normalized = s if normalize_float32_sum else h
    else:
        h = normalized = x
    hd = normalized.astype(np.float64)
    axes = tuple(range(axis % hd.ndim, hd.ndim))
    mean_square = np.mean(hd * hd, axis=axes, keepdims=True) if hd.size else np.zeros_like(hd)
    eps = float(np.float32(epsilon))
    with np.errstate(divide="ignore", invalid="ignore"):
        denominator = np.sqrt(mean_square) + eps if eps_outside_sqrt else np.sqrt(mean_square + eps)
        y = hd / denominator
    if scale is not None:
        y = y * np.asarray(scale).astype(np.float64)
    return y, h


def tolerance(dtype) -> tuple[float, float]:
    """(rtol, atol) of the op versus the float64 reference: one rounding to T plus float32 arithmetic
    (factor, two products, float32 partial sums of <= 32 terms): u_T + 40 * 2^-24, floor = smallest subnormal."""
    dtype = np.dtype(dtype)
    return UNIT_ROUNDOFF[dtype] + 40 * 2.0**-24, SMALLEST_SUBNORMAL[dtype]


def assert_matches_reference(actual, expected64, dtype, what=""):
    """Elementwise |actual - expected| <= atol + rtol * |expected|, NaN where and only where expected is NaN."""
    actual64 = np.asarray(actual).astype(np.float64)
    expected64 = np.asarray(expected64, dtype=np.float64)
    assert actual64.shape == expected64.shape, f"{what}: shape {actual64.shape} != {expected64.shape}"
    nan_expected = np.isnan(expected64)
    assert np.array_equal(np.isnan(actual64), nan_expected), f"{what}: NaN pattern differs from the reference"
    rtol, atol = tolerance(dtype)
    a, e = actual64[~nan_expected], expected64[~nan_expected]
    with np.errstate(invalid="ignore"):
        error = np.abs(a - e)
        error[a == e] = 0.0  # equal infinities
        bound = atol + rtol * np.abs(e)
    if error.size and not np.all(error <= bound):
        worst = int(np.argmax(error - bound))
        raise AssertionError(
            f"{what}: {int(np.sum(~(error <= bound)))} of {error.size} elements outside tolerance "
            f"(rtol={rtol:.3g}, atol={atol:.3g}); worst: got {a.flat[worst]!r}, want {e.flat[worst]!r}"
        )


def random_array(rng: np.random.Generator, shape, dtype, magnitude=1.0, offset=0.3):
    """Normal values with a non-zero mean (an RMSNorm must not center them), rounded to dtype."""
    return (rng.standard_normal(shape) * magnitude + offset * magnitude).astype(np.float32).astype(dtype)
