// What the CPU kernel tests and the CUDA check (tests/cuda/gpu_check_numerics.cu) share: the facts of each element
// format, the kernels' tolerance versus a float64 reference (docs/ops.md, "Numerics": one rounding to T plus float32
// arithmetic, factor and two products, and float32 partial sums of at most 32 terms) and their random inputs. Inline
// templates only, so a program may use any part of it.
#pragma once

#include <cmath>
#include <cstddef>
#include <random>
#include <vector>

#include "rmsnorm_kernels.h"
#include "scalar_convert.h"

namespace ort_rmsnorm {
namespace {

// What the checks need of T's format: its name, its significand digits p (with the implicit bit) and the exponent
// range of its normal numbers, value = 1.f * 2^e with kMinExponent <= e <= kMaxExponent.
template <typename T>
struct Format;
template <>
struct Format<float> {
  static constexpr const char* kName = "float32";
  static constexpr int kDigits = 24, kMinExponent = -126, kMaxExponent = 127;
};
template <>
struct Format<Float16> {
  static constexpr const char* kName = "float16";
  static constexpr int kDigits = 11, kMinExponent = -14, kMaxExponent = 15;
};
template <>
struct Format<BFloat16> {
  static constexpr const char* kName = "bfloat16";
  static constexpr int kDigits = 8, kMinExponent = -126, kMaxExponent = 127;
};

template <typename T>
inline const char* TypeName() {
  return Format<T>::kName;
}

// Unit roundoff of T (half an ulp at 1).
template <typename T>
inline double UnitRoundoff() {
  return std::ldexp(1.0, -Format<T>::kDigits);
}

// Smallest positive subnormal of T: the absolute error floor of rounding to T.
template <typename T>
inline double SmallestSubnormal() {
  return std::ldexp(1.0, Format<T>::kMinExponent - (Format<T>::kDigits - 1));
}

// Largest finite value of T: (2 - ulp(1)) * 2^kMaxExponent.
template <typename T>
inline double LargestFinite() {
  return std::ldexp(2.0 - std::ldexp(1.0, 1 - Format<T>::kDigits), Format<T>::kMaxExponent);
}

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
