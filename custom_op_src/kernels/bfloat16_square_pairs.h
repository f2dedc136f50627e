// The sum of squares of bfloat16 pairs in the AVX-512 kernels (rmsnorm_avx512.cpp), in a header with a target
// attribute instead of translation-unit flags so that kernel_tests can check it against vdpbf16ps bit for bit.
// Internal linkage for the same reason as scalar_convert.h.
#pragma once

#include <immintrin.h>

#include "rmsnorm_kernels.h"

namespace ort_rmsnorm {
namespace {

// acc + the squares of 32 bfloat16 values in the order Intel's manual gives for vdpbf16ps: lane i adds x[2i + 1]^2,
// then x[2i]^2 (products exact, each sum rounded), so that the two give the same bits. Unlike the instruction it
// keeps subnormal partial sums, which only squares of |x| < 1e-19 make.
__attribute__((target("avx512f"))) inline __m512 SquarePairsAvx512(const BFloat16* p, __m512 acc) {
  const __m512i bits = _mm512_loadu_si512(p);
  const __m512 odd = _mm512_castsi512_ps(_mm512_and_si512(bits, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
  const __m512 even = _mm512_castsi512_ps(_mm512_slli_epi32(bits, 16));
  return _mm512_fmadd_ps(even, even, _mm512_fmadd_ps(odd, odd, acc));
}

}  // namespace
}  // namespace ort_rmsnorm
