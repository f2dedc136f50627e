// RMSNorm / SkipRMSNorm CPU kernels: plain C++, no onnxruntime types.
//
//   y = x * factor * scale,   factor = 1 / sqrt(mean(x^2) + eps)      (eps_outside_sqrt = false)
//                             factor = 1 / (sqrt(mean(x^2)) + eps)    (eps_outside_sqrt = true)
//
// Each row of `cols` contiguous elements is one statistic. The sum of squares is accumulated in float32 vector
// lanes and combined in double; the factor is computed once per row in double; the product is formed in float32
// and rounded once to the element type (round-to-nearest-even). Rows whose float32 statistic overflows,
// underflows or is not finite are redone entirely in double, so inputs near the float16/bfloat16 limits give the
// representable result instead of inf/0.
//
// This header is included by the instruction-set translation units (rmsnorm_<isa>.cpp, compiled with their own
// flags), so it declares no inline function, template definition or standard container that could be emitted
// there: a weak definition in one of those objects is shared by the linker with every other object, and an
// AVX-512-compiled copy would then run on CPUs without AVX-512 (scripts/check-isa-symbols checks the objects).
// What callers compute (RowsPerTask, ScratchBytes, the table accessors) is defined in row_batch.cc and
// dispatch.cpp, compiled with the baseline flags.
#pragma once

#include <cstdint>

namespace ort_rmsnorm {

// 16-bit storage types: bit patterns only, converted by the kernels.
struct Float16 {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

// One kernel call over a 2-D view [rows, cols] of the input. The kernels use no memory but what a batch points to.
//
// SkipRMSNorm (skip set) forms s = (x + skip) + bias per element in float32 (each addition rounded to float32, the
// bias term only when there is one), writes round_T(s) to `sum`, and normalizes round_T(s), or s itself when
// normalize_float32_sum (the same computation for float32).
template <typename T>
struct RowBatch {
  const T* x = nullptr;
  const T* skip = nullptr;     // SkipRMSNorm: nullptr for RMSNorm
  T* sum = nullptr;            // SkipRMSNorm: receives round_T(s) when not nullptr
  T* y = nullptr;
  const float* scale = nullptr;  // `cols` float32 gains, already broadcast (ones for a node without a scale)
  const float* bias = nullptr;   // SkipRMSNorm: nullptr, or `cols` float32 values (exact T values), already broadcast
  bool normalize_float32_sum = false;  // SkipRMSNorm: normalize s rather than round_T(s)
  int64_t cols = 0;
  float epsilon = 1e-5f;
  bool eps_outside_sqrt = false;
  // Write y (and sum) with non-temporal stores: for outputs too large to stay in cache for the next op, where an
  // ordinary store would first read each line of y from memory. Requires y and sum rows aligned to 64 bytes.
  bool streaming_stores = false;
  // ScratchBytes(*this) bytes, 64-byte aligned, for the calling thread alone (nullptr when that is 0): where
  // SkipRMSNorm stages the rows it normalizes when its outputs cannot hold them. Disjoint row ranges of one batch
  // run concurrently, so each thread passes a copy of the batch with its own scratch.
  void* scratch = nullptr;
};

// Bytes of RowBatch::scratch a call of `batch` needs on each thread (0 for most calls).
template <typename T>
int64_t ScratchBytes(const RowBatch<T>& batch);

// How many rows one task of a call takes when threads share the call, for rows moving `bytes_per_row` bytes each
// (all tensors read and written). Ordinary calls are cut into tasks of about 64 KB, claimed dynamically. Streaming
// calls into about 64 tasks of at least 256 KB: each task starts without a next row in flight (the kernels pipeline
// and prefetch rows only within it) and ends with a fence that drains its streaming stores, which cost 10-25% with
// rows of 64-128 KB in tasks of one or two rows.
int64_t RowsPerTask(int64_t rows, int64_t bytes_per_row, bool streaming_stores);

// Normalizes rows [begin, end) of `batch`. Rows are independent: disjoint ranges may run concurrently.
template <typename T>
using RowsFn = void (*)(const RowBatch<T>& batch, int64_t begin, int64_t end);

// Widens n 16-bit values to float32 (exact): for scales that arrive per call in float16/bfloat16.
template <typename T>
using WidenFn = void (*)(const T* src, float* dst, int64_t n);

// The kernels of one instruction set.
struct CpuKernels {
  const char* isa;  // its name in kCpuIsaNames
  RowsFn<float> f32;
  RowsFn<Float16> f16;
  RowsFn<BFloat16> bf16;
  WidenFn<Float16> widen_f16;
  WidenFn<BFloat16> widen_bf16;

  template <typename T>
  RowsFn<T> get() const;
  template <typename T>
  WidenFn<T> widen() const;
};

// Defined in dispatch.cpp.
template <>
RowsFn<float> CpuKernels::get<float>() const;
template <>
RowsFn<Float16> CpuKernels::get<Float16>() const;
template <>
RowsFn<BFloat16> CpuKernels::get<BFloat16>() const;
template <>
WidenFn<Float16> CpuKernels::widen<Float16>() const;
template <>
WidenFn<BFloat16> CpuKernels::widen<BFloat16>() const;

enum class CpuIsa { kScalar, kNeon, kAvx2, kAvx512, kAvx512Bf16, kAvx512Fp16 };
constexpr CpuIsa kAllCpuIsas[] = {CpuIsa::kScalar,  CpuIsa::kNeon,       CpuIsa::kAvx2,
                                  CpuIsa::kAvx512,  CpuIsa::kAvx512Bf16, CpuIsa::kAvx512Fp16};
// The one table of the instruction sets' names, by CpuIsa (ORT_RMSNORM_CPU_ISA, build_info.json, test output). A
// const array at namespace scope has internal linkage, as everything the instruction-set objects share must.
constexpr const char* kCpuIsaNames[] = {"scalar", "neon", "avx2", "avx512", "avx512bf16", "avx512fp16"};
static_assert(sizeof(kCpuIsaNames) / sizeof(kCpuIsaNames[0]) == sizeof(kAllCpuIsas) / sizeof(kAllCpuIsas[0]),
              "one name per instruction set");

const char* CpuIsaName(CpuIsa isa);

// The kernels for `isa`, or nullptr when they are not compiled in or this CPU/OS cannot run them.
const CpuKernels* CpuKernelsFor(CpuIsa isa);

// The best kernels this CPU runs, or those named by `requested` (a name of kCpuIsaNames; nullptr or "" = best).
// Returns nullptr and sets `*error` when `requested` is unknown or unavailable here.
const CpuKernels* SelectCpuKernels(const char* requested, const char** error);

}  // namespace ort_rmsnorm
