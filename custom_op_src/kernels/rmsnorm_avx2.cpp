// AVX2 + FMA + F16C kernels (8 float lanes). Compiled with -mavx2 -mfma -mf16c; run only when the CPU has them.
#include <immintrin.h>

#include "isa_kernels.h"

namespace ort_rmsnorm {
namespace {

struct Avx2Lanes {
  using F = __m256;
  static constexpr int64_t kWidth = 8;
  static F Zero() { return _mm256_setzero_ps(); }
  static F Set1(float v) { return _mm256_set1_ps(v); }
  static F Add(F a, F b) { return _mm256_add_ps(a, b); }
  static F Mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F Fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static float ReduceAdd(F v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }

  static F Load(const float* p) { return _mm256_loadu_ps(p); }
  static F Load(const Float16* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static F Load(const BFloat16* p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }

  static void Store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static void Store(Float16* p, F v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), ToFloat16(v)); }
  static void Store(BFloat16* p, F v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), ToBFloat16(v)); }

  static void StoreStreaming(float* p, F v) { _mm256_stream_ps(p, v); }
  static void StoreStreaming(Float16* p, F v) { _mm_stream_si128(reinterpret_cast<__m128i*>(p), ToFloat16(v)); }
  static void StoreStreaming(BFloat16* p, F v) { _mm_stream_si128(reinterpret_cast<__m128i*>(p), ToBFloat16(v)); }
  // Two vectors of 16-bit values fill half a cache line: one 32-byte store instead of two of 16 bytes, and for
  // bfloat16 one pack and one permutation for both instead of one each.
  static void StoreStreamingPair(Float16* p, F a, F b) { _mm256_stream_si256(Line(p), Join(ToFloat16(a), ToFloat16(b))); }
  static void StoreStreamingPair(BFloat16* p, F a, F b) { _mm256_stream_si256(Line(p), ToBFloat16Pair(a, b)); }
  static void StorePair(BFloat16* p, F a, F b) { _mm256_storeu_si256(Line(p), ToBFloat16Pair(a, b)); }
  // For values known not to be NaN: the rounding alone (a quarter of the narrowing's instructions go to NaN lanes).
  static void StoreStreamingPairNoNaN(BFloat16* p, F a, F b) {
    _mm256_stream_si256(Line(p), ToBFloat16Pair<false>(a, b));
  }
  static void StorePairNoNaN(BFloat16* p, F a, F b) { _mm256_storeu_si256(Line(p), ToBFloat16Pair<false>(a, b)); }
  static void StreamingFence() { _mm_sfence(); }
  static constexpr bool kPipelineRows = true;

  template <typename T>
  static F Round(F v) {
    if constexpr (std::is_same_v<T, Float16>) return _mm256_cvtph_ps(ToFloat16(v));
    if constexpr (std::is_same_v<T, BFloat16>) {
      return _mm256_castsi256_ps(_mm256_and_si256(BFloat16High(v), _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
    }
    return v;
  }

 private:
  static __m128i ToFloat16(F v) { return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }

  // Each lane's bfloat16 (rounded to nearest-even on the bit pattern) in its upper 16 bits; NaN lanes are made
  // quiet instead of rounded (rounding could carry them into infinity) unless kNaN is false: no lane is NaN.
  template <bool kNaN = true>
  static __m256i BFloat16High(F v) {
    const __m256i bits = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)));
    if constexpr (!kNaN) return rounded;
    const __m256i quiet_nan = _mm256_or_si256(bits, _mm256_set1_epi32(0x00400000));
    const __m256 is_nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    return _mm256_blendv_epi8(rounded, quiet_nan, _mm256_castps_si256(is_nan));
  }

  template <typename T>
  static __m256i* Line(T* p) { return reinterpret_cast<__m256i*>(p); }
  static __m256i Join(__m128i low, __m128i high) { return _mm256_inserti128_si256(_mm256_castsi128_si256(low), high, 1); }

  // a's bfloat16 values, then b's.
  template <bool kNaN = true>
  static __m256i ToBFloat16Pair(F a, F b) {
    const __m256i packed = _mm256_packus_epi32(_mm256_srli_epi32(BFloat16High<kNaN>(a), 16),
                                               _mm256_srli_epi32(BFloat16High<kNaN>(b), 16));
    // [a0..3 b0..3 | a4..7 b4..7] -> quadwords 0, 2, 1, 3.
    return _mm256_permute4x64_epi64(packed, 0xD8);
  }

  static __m128i ToBFloat16(F v) {
    const __m256i halves = _mm256_srli_epi32(BFloat16High(v), 16);
    // packus works per 128-bit lane: [a0..3 b0..3 | a4..7 b4..7] -> reorder quadwords 0,2.
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(halves, halves), 0x08));
  }
};

}  // namespace

extern const CpuKernels kAvx2Kernels = MakeCpuKernels<Avx2Lanes>(CpuIsa::kAvx2);

}  // namespace ort_rmsnorm
