// AVX-512 kernels (16 float lanes). This file is compiled three times (see CMakeLists.txt):
//   - with -mavx512f -mavx512bw -mavx512vl                       -> kAvx512Kernels
//   - with those and -mavx512bf16, ORT_RMSNORM_AVX512_BF16 defined -> kAvx512Bf16Kernels
//   - with those and -mavx512fp16, ORT_RMSNORM_AVX512_FP16 defined too -> kAvx512Fp16Kernels
// They differ only in how float32 is rounded to bfloat16, how bfloat16 squares are summed (to the same bits) and
// how SkipRMSNorm adds float16 rows.
#include <immintrin.h>

#include <type_traits>

#include "bfloat16_square_pairs.h"
#include "isa_kernels.h"

namespace ort_rmsnorm {
namespace {

// Each lane's bfloat16, rounded to nearest-even on the bit pattern, in its upper 16 bits; NaN lanes are made quiet
// instead of rounded (rounding could carry them into infinity).
inline __m512i BFloat16High(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  const __mmask16 is_nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_or_epi32(rounded, is_nan, bits, _mm512_set1_epi32(0x00400000));
}

struct Avx512Lanes {
  using F = __m512;
  static constexpr int64_t kWidth = 16;
  static F Zero() { return _mm512_setzero_ps(); }
  static F Set1(float v) { return _mm512_set1_ps(v); }
  static F Add(F a, F b) { return _mm512_add_ps(a, b); }
  static F Mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F Fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static float ReduceAdd(F v) { return _mm512_reduce_add_ps(v); }
  // Faster than two widenings without AVX512-BF16, and than vdpbf16ps in one place (see NormalizeRowRange).
  static F SquarePairs(const BFloat16* p, F acc) { return SquarePairsAvx512(p, acc); }
#ifdef ORT_RMSNORM_AVX512_BF16
  // Products of bfloat16 values are exact in float32; vdpbf16ps treats subnormal inputs and results as zero, which
  // only touches sums far below the fast path's threshold (those rows are redone in double).
  static F DotSquares(const BFloat16* p, F acc) {
    const __m512bh v = (__m512bh)_mm512_loadu_si512(p);
    return _mm512_dpbf16_ps(acc, v, v);
  }
#endif

#ifdef ORT_RMSNORM_AVX512_FP16
  // SkipRMSNorm's h = round(x + skip) for 16 float16 values, added in float16 (one instruction instead of two
  // widenings, a float32 add and a narrowing), staged, and returned widened. The same bits as rounding the float32
  // sum: that sum is exact unless the exponents differ by more than 13, and then it lies too far from any float16
  // rounding boundary for the second rounding to matter (checked for all 2^32 pairs; only NaN + NaN may return the
  // other input's payload, which neither path fixes). FP16 arithmetic ignores MXCSR's DAZ/FTZ, as F16C does.
  template <bool kStreaming>
  static F StageSum(const Float16* x, const Float16* skip, Float16* stage, Float16* streamed) {
    const __m256h h = _mm256_add_ph(_mm256_loadu_ph(x), _mm256_loadu_ph(skip));
    _mm256_storeu_ph(stage, h);
    if (kStreaming && streamed) _mm256_stream_si256(reinterpret_cast<__m256i*>(streamed), _mm256_castph_si256(h));
    return _mm512_cvtph_ps(_mm256_castph_si256(h));
  }
#endif

  static F Load(const float* p) { return _mm512_loadu_ps(p); }
  static F Load(const Float16* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static F Load(const BFloat16* p) { return WidenBFloat16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }

  static void Store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static void Store(Float16* p, F v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), ToFloat16(v)); }
  static void Store(BFloat16* p, F v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), ToBFloat16(v)); }

  static void StoreStreaming(float* p, F v) { _mm512_stream_ps(p, v); }
  static void StoreStreaming(Float16* p, F v) { _mm256_stream_si256(reinterpret_cast<__m256i*>(p), ToFloat16(v)); }
  static void StoreStreaming(BFloat16* p, F v) { _mm256_stream_si256(reinterpret_cast<__m256i*>(p), ToBFloat16(v)); }
  // 32 narrowed values fill a cache line: one 64-byte streaming store instead of two halves.
  static void StoreStreamingPair(Float16* p, F a, F b) { StreamLine(p, Join(ToFloat16(a), ToFloat16(b))); }
  static void StoreStreamingPair(BFloat16* p, F a, F b) { StreamLine(p, ToBFloat16Pair(a, b)); }
#ifdef ORT_RMSNORM_AVX512_BF16
  // With rows in cache a join alone does not pay (float16), but one conversion for two vectors does.
  static void StorePair(BFloat16* p, F a, F b) { _mm512_storeu_si512(p, ToBFloat16Pair(a, b)); }
#endif
  static void StreamingFence() { _mm_sfence(); }
  static constexpr bool kPipelineRows = true;

  template <typename T>
  static F Round(F v) {
    if constexpr (std::is_same_v<T, Float16>) return _mm512_cvtph_ps(ToFloat16(v));
    if constexpr (std::is_same_v<T, BFloat16>) return WidenBFloat16(ToBFloat16(v));
    return v;
  }

 private:
  static void StreamLine(void* p, __m512i line) { _mm512_stream_si512(static_cast<__m512i*>(p), line); }
  static __m512i Join(__m256i low, __m256i high) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
  }
  static F WidenBFloat16(__m256i bits) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
  }
  static __m256i ToFloat16(F v) { return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }

  static __m256i ToBFloat16(F v) {
#ifdef ORT_RMSNORM_AVX512_BF16
    // vcvtneps2bf16 rounds to nearest-even but flushes subnormal inputs and outputs to zero; vectors holding a
    // subnormal (rare) take the exact integer path instead.
    if (_mm512_fpclass_ps_mask(v, 0x20) == 0) return (__m256i)_mm512_cvtneps_pbh(v);
#endif
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(BFloat16High(v), 16));
  }

  // a's bfloat16 values, then b's: with AVX512-BF16, one vcvtne2ps2bf16 for both where neither holds a subnormal
  // (one conversion instead of two, and no join, per cache line).
  static __m512i ToBFloat16Pair(F a, F b) {
#ifdef ORT_RMSNORM_AVX512_BF16
    if ((_mm512_fpclass_ps_mask(a, 0x20) | _mm512_fpclass_ps_mask(b, 0x20)) == 0) {
      return (__m512i)_mm512_cvtne2ps_pbh(b, a);
    }
#endif
    return Join(ToBFloat16(a), ToBFloat16(b));
  }
};

}  // namespace

#if defined(ORT_RMSNORM_AVX512_FP16)
extern const CpuKernels kAvx512Fp16Kernels = MakeCpuKernels<Avx512Lanes>(CpuIsa::kAvx512Fp16);
#elif defined(ORT_RMSNORM_AVX512_BF16)
extern const CpuKernels kAvx512Bf16Kernels = MakeCpuKernels<Avx512Lanes>(CpuIsa::kAvx512Bf16);
#else
extern const CpuKernels kAvx512Kernels = MakeCpuKernels<Avx512Lanes>(CpuIsa::kAvx512);
#endif

}  // namespace ort_rmsnorm
