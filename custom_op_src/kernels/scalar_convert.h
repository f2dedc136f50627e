// Scalar conversions between float32 and the 16-bit storage types, round-to-nearest-even, with subnormals,
// infinities and NaN handled exactly (NaN stays NaN, made quiet).
//
// Internal linkage on purpose: this header is included by translation units compiled with different instruction
// set flags, and an inline function with external linkage could be merged by the linker into a copy compiled with
// AVX-512 and then run on a CPU without it.
#pragma once

#include <cstdint>
#include <cstring>

#include "rmsnorm_kernels.h"

namespace ort_rmsnorm {
namespace {

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline float ToFloat(float v) { return v; }

inline float ToFloat(BFloat16 v) { return BitsToFloat(static_cast<uint32_t>(v.bits) << 16); }

inline float ToFloat(Float16 v) {
  const uint32_t sign = static_cast<uint32_t>(v.bits & 0x8000u) << 16;
  const uint32_t exponent = (v.bits >> 10) & 0x1Fu;
  uint32_t mantissa = v.bits & 0x3FFu;
  if (exponent == 0x1F) return BitsToFloat(sign | 0x7F800000u | (mantissa << 13));  // inf, NaN
  if (exponent != 0) return BitsToFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
  if (mantissa == 0) return BitsToFloat(sign);
  // Subnormal half: value = mantissa * 2^-24, exact in float32.
  const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
  return sign ? -magnitude : magnitude;
}

template <typename T>
T FromFloat(float v);

template <>
inline float FromFloat<float>(float v) {
  return v;
}

template <>
inline BFloat16 FromFloat<BFloat16>(float v) {
  const uint32_t u = FloatBits(v);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return BFloat16{static_cast<uint16_t>((u >> 16) | 0x40u)};  // quiet NaN
  const uint32_t rounding = 0x7FFFu + ((u >> 16) & 1u);
  return BFloat16{static_cast<uint16_t>((u + rounding) >> 16)};
}

template <>
inline Float16 FromFloat<Float16>(float v) {
  const uint32_t u = FloatBits(v);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t magnitude = u & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return Float16{static_cast<uint16_t>(sign | 0x7E00u | ((magnitude >> 13) & 0x3FFu))};
  if (magnitude >= 0x477FF000u) return Float16{static_cast<uint16_t>(sign | 0x7C00u)};  // rounds to >= 65520: inf
  if (magnitude < 0x38800000u) {
    // Result is subnormal (or zero): value / 2^-24 rounded to an integer, nearest-even. Adding 0.5 (as float)
    // performs exactly that rounding in the float32 adder because the sum's ulp is 2^-24.
    const float scaled = BitsToFloat(magnitude) + 0.5f;
    return Float16{static_cast<uint16_t>(sign | (FloatBits(scaled) - FloatBits(0.5f)))};
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits to nearest-even.
  const uint32_t rounded = magnitude + 0x0FFFu + ((magnitude >> 13) & 1u) - (112u << 23);
  return Float16{static_cast<uint16_t>(sign | (rounded >> 13))};
}

}  // namespace
}  // namespace ort_rmsnorm
