// AArch64 NEON kernels (4 float lanes). float16 uses the native widening/narrowing conversions (FCVTL/FCVTN,
// round-to-nearest-even under the default FPCR); bfloat16 is widened by a shift and rounded on the bit pattern.
#include <arm_neon.h>

#include "row_algorithm.h"

namespace ort_rmsnorm {
namespace {

struct NeonLanes {
  using F = float32x4_t;
  static constexpr int64_t kWidth = 4;
  static F Zero() { return vdupq_n_f32(0.0f); }
  static F Set1(float v) { return vdupq_n_f32(v); }
  static F Add(F a, F b) { return vaddq_f32(a, b); }
  static F Mul(F a, F b) { return vmulq_f32(a, b); }
  static F Fma(F a, F b, F c) { return vfmaq_f32(c, a, b); }
  static float ReduceAdd(F v) { return vaddvq_f32(v); }

  static F Load(const float* p) { return vld1q_f32(p); }
  static F Load(const Float16* p) {
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(reinterpret_cast<const uint16_t*>(p))));
  }
  static F Load(const BFloat16* p) {
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(reinterpret_cast<const uint16_t*>(p)), 16));
  }

  static void Store(float* p, F v) { vst1q_f32(p, v); }
  static void Store(Float16* p, F v) {
    vst1_u16(reinterpret_cast<uint16_t*>(p), vreinterpret_u16_f16(vcvt_f16_f32(v)));
  }
  static void Store(BFloat16* p, F v) {
    const uint32x4_t bits = vreinterpretq_u32_f32(v);
    const uint32x4_t lsb = vandq_u32(vshrq_n_u32(bits, 16), vdupq_n_u32(1));
    const uint32x4_t rounded = vaddq_u32(bits, vaddq_u32(lsb, vdupq_n_u32(0x7FFF)));
    const uint32x4_t quiet_nan = vorrq_u32(bits, vdupq_n_u32(0x00400000));
    const uint32x4_t is_number = vceqq_f32(v, v);
    const uint32x4_t chosen = vbslq_u32(is_number, rounded, quiet_nan);
    vst1_u16(reinterpret_cast<uint16_t*>(p), vshrn_n_u32(chosen, 16));
  }
};

}  // namespace

extern const CpuKernels kNeonKernels = MakeCpuKernels<NeonLanes>("neon");

}  // namespace ort_rmsnorm
