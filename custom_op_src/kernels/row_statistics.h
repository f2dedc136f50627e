// The per-row statistic shared by the CPU and CUDA kernels: when the float32 sum of squares can be trusted, and
// the row factor computed from it. Compiles as host code everywhere and as __host__ __device__ under nvcc.
// Internal linkage for the same reason as scalar_convert.h (included by translation units with different flags).
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define ORT_RMSNORM_HOST_DEVICE __host__ __device__
#else
#define ORT_RMSNORM_HOST_DEVICE
#endif

namespace ort_rmsnorm {
namespace {

// When is the float32 statistic trustworthy? A sum that is not finite has overflowed (|x| > 1.8e19) or met inf/NaN.
// A sum below kMinFastSumSquares may have lost terms to underflow (squares of |x| < 1e-19 are subnormal); that
// matters only when epsilon does not dominate it (epsilon < kMinEpsilonForTinySums). Other rows are redone in
// double. All-zero padding rows with the usual epsilon stay on the fast path.
constexpr double kMinFastSumSquares = 0x1p-60;
constexpr double kMinEpsilonForTinySums = 0x1p-40;

ORT_RMSNORM_HOST_DEVICE inline bool FastPathIsAccurate(double sum_squares, float epsilon) {
  return sum_squares <= DBL_MAX &&
         (sum_squares >= kMinFastSumSquares || static_cast<double>(epsilon) >= kMinEpsilonForTinySums);
}

// 1 / sqrt(mean + eps), or 1 / (sqrt(mean) + eps) with eps_outside_sqrt; computed once per row, in double.
ORT_RMSNORM_HOST_DEVICE inline double InverseRms(double sum_squares, int64_t cols, float epsilon,
                                                 bool eps_outside_sqrt) {
  const double mean_square = sum_squares / static_cast<double>(cols);
  const double eps = static_cast<double>(epsilon);
  return eps_outside_sqrt ? 1.0 / (sqrt(mean_square) + eps) : 1.0 / sqrt(mean_square + eps);
}

}  // namespace
}  // namespace ort_rmsnorm
