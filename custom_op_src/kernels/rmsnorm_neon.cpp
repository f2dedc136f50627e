// AArch64 Advanced SIMD (NEON) kernels. Advanced SIMD, including the float16 <-> float32 conversions used here,
// is part of the AArch64 base architecture, so this file needs no extra compiler flags and runs on every AArch64
// CPU.
//
// The algorithm's "vector" is a pair of 128-bit registers (8 float lanes): with the algorithm's four accumulators
// the sum of squares keeps eight independent FMA chains in flight, which is what a core with two 4-cycle FMA pipes
// (Cortex-A7x/X, Neoverse) needs to stay busy, and the 16-bit types move with full 128-bit loads and stores.
//
// float16: widened with FCVTL/FCVTL2 and narrowed with FCVTN/FCVTN2, which round to nearest-even (the default
// FPCR rounding mode) and handle subnormals, infinities and NaN exactly.
// bfloat16: widened by a 16-bit left shift (exact); narrowed by round-to-nearest-even on the bit pattern, NaN lanes
// made quiet instead of rounded (rounding could carry a NaN's payload into infinity).
#include <arm_neon.h>

#include "isa_kernels.h"

namespace ort_rmsnorm {
namespace {

inline const uint16_t* Bits(const Float16* p) { return reinterpret_cast<const uint16_t*>(p); }
inline const uint16_t* Bits(const BFloat16* p) { return reinterpret_cast<const uint16_t*>(p); }
inline uint16_t* Bits(Float16* p) { return reinterpret_cast<uint16_t*>(p); }
inline uint16_t* Bits(BFloat16* p) { return reinterpret_cast<uint16_t*>(p); }

// float32 lanes -> upper 16 bits of the bfloat16 rounded to nearest-even, still in 32-bit lanes.
inline uint32x4_t RoundToBFloat16(float32x4_t v) {
  const uint32x4_t bits = vreinterpretq_u32_f32(v);
  const uint32x4_t lsb = vandq_u32(vshrq_n_u32(bits, 16), vdupq_n_u32(1));
  const uint32x4_t rounded = vaddq_u32(bits, vaddq_u32(lsb, vdupq_n_u32(0x7FFF)));
  const uint32x4_t quiet_nan = vorrq_u32(bits, vdupq_n_u32(0x00400000));
  const uint32x4_t is_number = vceqq_f32(v, v);
  return vbslq_u32(is_number, rounded, quiet_nan);
}

struct NeonLanes {
  struct F {
    float32x4_t lo, hi;
  };
  static constexpr int64_t kWidth = 8;

  static F Zero() { return Set1(0.0f); }
  static F Set1(float v) {
    const float32x4_t s = vdupq_n_f32(v);
    return {s, s};
  }
  static F Add(F a, F b) { return {vaddq_f32(a.lo, b.lo), vaddq_f32(a.hi, b.hi)}; }
  static F Mul(F a, F b) { return {vmulq_f32(a.lo, b.lo), vmulq_f32(a.hi, b.hi)}; }
  static F Fma(F a, F b, F c) { return {vfmaq_f32(c.lo, a.lo, b.lo), vfmaq_f32(c.hi, a.hi, b.hi)}; }
  static float ReduceAdd(F v) { return vaddvq_f32(vaddq_f32(v.lo, v.hi)); }

  static F Load(const float* p) { return {vld1q_f32(p), vld1q_f32(p + 4)}; }
  static F Load(const Float16* p) {
    const float16x8_t h = vreinterpretq_f16_u16(vld1q_u16(Bits(p)));
    return {vcvt_f32_f16(vget_low_f16(h)), vcvt_high_f32_f16(h)};
  }
  static F Load(const BFloat16* p) {
    const uint16x8_t b = vld1q_u16(Bits(p));
    return {vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(b), 16)), vreinterpretq_f32_u32(vshll_high_n_u16(b, 16))};
  }

  static void Store(float* p, F v) {
    vst1q_f32(p, v.lo);
    vst1q_f32(p + 4, v.hi);
  }
  static void Store(Float16* p, F v) {
    vst1q_u16(Bits(p), vreinterpretq_u16_f16(vcvt_high_f16_f32(vcvt_f16_f32(v.lo), v.hi)));
  }
  static void Store(BFloat16* p, F v) {
    vst1q_u16(Bits(p), vshrn_high_n_u32(vshrn_n_u32(RoundToBFloat16(v.lo), 16), RoundToBFloat16(v.hi), 16));
  }

  // No streaming stores: the large-output case they serve is a server-CPU concern.
  template <typename T>
  static void StoreStreaming(T* p, F v) {
    Store(p, v);
  }
  static void StreamingFence() {}
  static constexpr bool kPipelineRows = false;  // not measured on Arm hardware (only under qemu)

  template <typename T>
  static F Round(F v) {
    if constexpr (std::is_same_v<T, Float16>) {
      return {vcvt_f32_f16(vcvt_f16_f32(v.lo)), vcvt_f32_f16(vcvt_f16_f32(v.hi))};
    } else if constexpr (std::is_same_v<T, BFloat16>) {
      const uint32x4_t high = vdupq_n_u32(0xFFFF0000u);
      return {vreinterpretq_f32_u32(vandq_u32(RoundToBFloat16(v.lo), high)),
              vreinterpretq_f32_u32(vandq_u32(RoundToBFloat16(v.hi), high))};
    } else {
      return v;
    }
  }
};

}  // namespace

extern const CpuKernels kNeonKernels = MakeCpuKernels<NeonLanes>(CpuIsa::kNeon);

}  // namespace ort_rmsnorm
