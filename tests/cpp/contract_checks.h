// What the CPU kernel tests and the CUDA check (tests/cuda/gpu_check.cu) share: the kernels' tolerance versus a
// float64 reference (README, "Numerics": one rounding to T plus float32 arithmetic, factor and two products, and
// float32 partial sums of at most 32 terms) and their random inputs. Inline templates only, so a program may use
// any part of it.
#pragma once

#include <cmath>
#include <cstddef>
#include <random>
#include <vector>

#include "rmsnorm_kernels.h"
#include "scalar_convert.h"

namespace ort_rmsnorm {
namespace {

template <typename T>
inline const char* TypeName();
template <>
inline const char* TypeName<float>() { return "float32"; }
template <>
inline const char* TypeName<Float16>() { return "float16"; }
template <>
inline const char* TypeName<BFloat16>() { return "bfloat16"; }

// Unit roundoff of T (half an ulp at 1).
template <typename T>
inline double UnitRoundoff();
template <>
inline double UnitRoundoff<float>() { return std::ldexp(1.0, -24); }
template <>
inline double UnitRoundoff<Float16>() { return std::ldexp(1.0, -11); }
template <>
inline double UnitRoundoff<BFloat16>() { return std::ldexp(1.0, -8); }

// Smallest positive subnormal of T: the absolute error floor of rounding to T.
template <typename T>
inline double SmallestSubnormal();
template <>
inline double SmallestSubnormal<float>() { return std::ldexp(1.0, -149); }
template <>
inline double SmallestSubnormal<Float16>() { return std::ldexp(1.0, -24); }
template <>
inline double SmallestSubnormal<BFloat16>() { return std::ldexp(1.0, -133); }

template <typename T>
inline double RelativeTolerance() {
  return UnitRoundoff<T>() + 40.0 * std::ldexp(1.0, -24);
}

// n values of T drawn from a normal distribution, rounded to T.
template <typename T>
std::vector<T> RandomValues(std::mt19937& rng, size_t n, double sigma, double mean = 0.0) {
  std::normal_distribution<double> normal(mean, sigma);
  std::vector<T> values(n);
  for (auto& v : values) v = FromFloat<T>(static_cast<float>(normal(rng)));
  return values;
}

}  // namespace
}  // namespace ort_rmsnorm
