// Chooses the kernels for this CPU once, MLAS-style: each instruction set lives in its own translation unit,
// compiled with its own flags, and is only called after the CPU (and OS) have been checked to support it.
#include <cstring>
#include <string>

#include "rmsnorm_kernels.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#endif

namespace ort_rmsnorm {

extern const CpuKernels kScalarKernels;

// The kernel tables this build has: the table, or nullptr where its instruction set was not compiled in.
#ifdef ORT_RMSNORM_HAVE_AVX2
extern const CpuKernels kAvx2Kernels;
constexpr const CpuKernels* kBuiltAvx2 = &kAvx2Kernels;
#else
constexpr const CpuKernels* kBuiltAvx2 = nullptr;
#endif
#ifdef ORT_RMSNORM_HAVE_AVX512
extern const CpuKernels kAvx512Kernels;
constexpr const CpuKernels* kBuiltAvx512 = &kAvx512Kernels;
#else
constexpr const CpuKernels* kBuiltAvx512 = nullptr;
#endif
#ifdef ORT_RMSNORM_HAVE_AVX512_BF16
extern const CpuKernels kAvx512Bf16Kernels;
constexpr const CpuKernels* kBuiltAvx512Bf16 = &kAvx512Bf16Kernels;
#else
constexpr const CpuKernels* kBuiltAvx512Bf16 = nullptr;
#endif
#ifdef ORT_RMSNORM_HAVE_AVX512_FP16
extern const CpuKernels kAvx512Fp16Kernels;
constexpr const CpuKernels* kBuiltAvx512Fp16 = &kAvx512Fp16Kernels;
#else
constexpr const CpuKernels* kBuiltAvx512Fp16 = nullptr;
#endif
#ifdef ORT_RMSNORM_HAVE_NEON
extern const CpuKernels kNeonKernels;
constexpr const CpuKernels* kBuiltNeon = &kNeonKernels;
#else
constexpr const CpuKernels* kBuiltNeon = nullptr;
#endif

namespace {

struct CpuFeatures {
  bool avx2_fma_f16c = false;
  bool avx512 = false;  // F + BW + VL, with the OS saving ZMM state
  bool avx512_bf16 = false;  // with DQ (vfpclassps) too
  bool avx512_fp16 = false;  // with BF16 too (every CPU with FP16 has it)
};

CpuFeatures DetectCpuFeatures() {
  CpuFeatures features;
#if defined(__x86_64__) || defined(_M_X64)
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return features;
  const bool osxsave = ecx & (1u << 27), avx = ecx & (1u << 28), fma = ecx & (1u << 12), f16c = ecx & (1u << 29);
  if (!osxsave || !avx) return features;
  unsigned xcr0_low, xcr0_high;
  __asm__("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0));
  const bool os_saves_ymm = (xcr0_low & 0x06u) == 0x06u;
  const bool os_saves_zmm = (xcr0_low & 0xE6u) == 0xE6u;
  if (!os_saves_ymm || !__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return features;
  const bool avx2 = ebx & (1u << 5);
  features.avx2_fma_f16c = avx2 && fma && f16c;
  const bool avx512f = ebx & (1u << 16), avx512bw = ebx & (1u << 30), avx512vl = ebx & (1u << 31);
  features.avx512 = features.avx2_fma_f16c && os_saves_zmm && avx512f && avx512bw && avx512vl;
  const bool avx512dq = ebx & (1u << 17), avx512fp16 = edx & (1u << 23);
  if (features.avx512 && avx512dq && __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx)) {
    features.avx512_bf16 = eax & (1u << 5);
    features.avx512_fp16 = features.avx512_bf16 && avx512fp16;
  }
#endif
  return features;
}

const CpuFeatures& Features() {
  static const CpuFeatures features = DetectCpuFeatures();
  return features;
}

// "unknown instruction set (expected scalar, neon, ... or avx512fp16)", from kCpuIsaNames.
const char* UnknownIsaMessage() {
  static const std::string message = [] {
    std::string text = "unknown instruction set (expected ";
    const size_t count = sizeof(kCpuIsaNames) / sizeof(kCpuIsaNames[0]);
    for (size_t i = 0; i < count; ++i) {
      text += i == 0 ? "" : i + 1 == count ? " or " : ", ";
      text += kCpuIsaNames[i];
    }
    return text + ")";
  }();
  return message.c_str();
}

}  // namespace

template <>
RowsFn<float> CpuKernels::get<float>() const {
  return f32;
}
template <>
RowsFn<Float16> CpuKernels::get<Float16>() const {
  return f16;
}
template <>
RowsFn<BFloat16> CpuKernels::get<BFloat16>() const {
  return bf16;
}
template <>
WidenFn<Float16> CpuKernels::widen<Float16>() const {
  return widen_f16;
}
template <>
WidenFn<BFloat16> CpuKernels::widen<BFloat16>() const {
  return widen_bf16;
}

const char* CpuIsaName(CpuIsa isa) { return kCpuIsaNames[static_cast<int>(isa)]; }

const CpuKernels* CpuKernelsFor(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar: return &kScalarKernels;
    case CpuIsa::kNeon: return kBuiltNeon;  // Advanced SIMD is mandatory on AArch64
    case CpuIsa::kAvx2: return Features().avx2_fma_f16c ? kBuiltAvx2 : nullptr;
    case CpuIsa::kAvx512: return Features().avx512 ? kBuiltAvx512 : nullptr;
    case CpuIsa::kAvx512Bf16: return Features().avx512_bf16 ? kBuiltAvx512Bf16 : nullptr;
    case CpuIsa::kAvx512Fp16: return Features().avx512_fp16 ? kBuiltAvx512Fp16 : nullptr;
  }
  return nullptr;
}

const CpuKernels* SelectCpuKernels(const char* requested, const char** error) {
  if (requested == nullptr || *requested == '\0') {
    const CpuKernels* best = &kScalarKernels;
    for (CpuIsa isa : kAllCpuIsas) {  // ordered from least to most capable
      if (const CpuKernels* kernels = CpuKernelsFor(isa)) best = kernels;
    }
    return best;
  }
  for (CpuIsa isa : kAllCpuIsas) {
    if (std::strcmp(requested, CpuIsaName(isa)) != 0) continue;
    const CpuKernels* kernels = CpuKernelsFor(isa);
    if (!kernels && error) *error = "the requested instruction set is not supported by this CPU or build";
    return kernels;
  }
  if (error) *error = UnknownIsaMessage();
  return nullptr;
}

}  // namespace ort_rmsnorm
