// What an instruction-set translation unit (rmsnorm_<isa>.cpp) instantiates from its vector traits `V` (documented
// in row_algorithm.h): NormalizeRows for each element type, which picks per call the row loop (RMSNorm's rows, or
// SkipRMSNorm's staged ones, skip_rows.h), streaming stores or not, pipelining, and the stores for NaN-free values;
// Widen; and the kernel table of the instruction set.
//
// Internal linkage and no standard container or algorithm, as in row_algorithm.h: each instruction-set unit compiles
// its own copy with its own flags.
#pragma once

#include <cstdint>

#include "rmsnorm_kernels.h"
#include "row_algorithm.h"
#include "skip_rows.h"

namespace ort_rmsnorm {
namespace {

template <class V, bool kStreaming, bool kNoNaN, typename T>
void NormalizeRowsAs(const RowBatch<T>& batch, int64_t begin, int64_t end, bool pipeline) {
  const int64_t n = batch.cols;
  if (!batch.skip) {
    const auto row = [&](int64_t r) { return InputRow<V, T>{batch.x + r * n}; };
    NormalizeRowRange<V, kStreaming, kNoNaN>(batch, begin, end, pipeline, row, row);
  } else if (batch.bias) {
    NormalizeSkipRows<V, kStreaming, kNoNaN, true>(batch, begin, end, pipeline);
  } else {
    NormalizeSkipRows<V, kStreaming, kNoNaN, false>(batch, begin, end, pipeline);
  }
}

// Whether no value of `scale` is infinite or NaN: then no output of a row on the fast path is NaN. There a row's sum
// of squares is finite, so are its values x and the factor, and |x * factor| <= sqrt(cols); times a finite gain that
// is finite or overflows to an infinity, never NaN. (x * 0 is 0 for finite x, NaN for infinities and NaN.)
template <class V>
bool ScaleIsFinite(const float* scale, int64_t n) {
  using F = typename V::F;
  constexpr int64_t W = V::kWidth;
  F a0 = V::Zero(), a1 = V::Zero(), a2 = V::Zero(), a3 = V::Zero();
  int64_t i = 0;
  for (; i + 4 * W <= n; i += 4 * W) {
    a0 = V::Fma(V::Load(scale + i), V::Zero(), a0);
    a1 = V::Fma(V::Load(scale + i + W), V::Zero(), a1);
    a2 = V::Fma(V::Load(scale + i + 2 * W), V::Zero(), a2);
    a3 = V::Fma(V::Load(scale + i + 3 * W), V::Zero(), a3);
  }
  for (; i < n; i += W) a0 = V::Fma(LoadPartial<V>(scale + i, n - i < W ? n - i : W), V::Zero(), a0);
  return V::ReduceAdd(V::Add(V::Add(a0, a1), V::Add(a2, a3))) == 0.0f;
}

template <class V, bool kStreaming, typename T>
void NormalizeRowsWith(const RowBatch<T>& batch, int64_t begin, int64_t end) {
  const int64_t n = batch.cols;
  // Pipelining pays when the rows come from outside L2, which streaming calls imply: rows in L1/L2 were measured
  // slower with it, and so was the compute-bound scalar code. float32 rows gain from 32 KB (H = 8192), once the next
  // row is prefetched in parts; shorter ones were no faster or slower (docs/benchmarks.md, "What limits the
  // kernels").
  constexpr int64_t kMinPipelinedFloatRowBytes = 32 * 1024;
  const bool pipeline = V::kPipelineRows && kStreaming &&
                        (sizeof(T) == 2 || n * static_cast<int64_t>(sizeof(T)) >= kMinPipelinedFloatRowBytes);
  // Where V narrows values known not to be NaN more cheaply (AVX2's bfloat16: 13-19% faster), calls of several rows
  // check the scale once; a single row keeps the general stores rather than read its scale twice.
  constexpr int64_t kMinRowsForScaleCheck = 4;
  if constexpr (HasNoNaNPairStore<V, kStreaming, T>::value) {
    if (end - begin >= kMinRowsForScaleCheck && ScaleIsFinite<V>(batch.scale, n)) {
      NormalizeRowsAs<V, kStreaming, true>(batch, begin, end, pipeline);
      if constexpr (kStreaming) V::StreamingFence();
      return;
    }
  }
  NormalizeRowsAs<V, kStreaming, false>(batch, begin, end, pipeline);
  if constexpr (kStreaming) V::StreamingFence();  // make the weakly ordered stores visible before the task ends
}

template <class V, typename T>
void NormalizeRows(const RowBatch<T>& caller_batch, int64_t begin, int64_t end) {
  if (caller_batch.cols == 0 || begin >= end) return;
  const RowBatch<T> batch = caller_batch;  // a local copy: no store through y or sum can change its fields
  if (batch.streaming_stores) {
    NormalizeRowsWith<V, true>(batch, begin, end);
  } else {
    NormalizeRowsWith<V, false>(batch, begin, end);
  }
}

template <class V, typename T>
void Widen(const T* src, float* dst, int64_t n) {
  constexpr int64_t W = V::kWidth;
  int64_t i = 0;
  for (; i + W <= n; i += W) V::Store(dst + i, V::Load(src + i));
  if (i < n) StorePartial<V>(dst + i, LoadPartial<V>(src + i, n - i), n - i);
}

// The kernel table of one instruction set.
template <class V>
constexpr CpuKernels MakeCpuKernels(CpuIsa isa) {
  return CpuKernels{kCpuIsaNames[static_cast<int>(isa)],
                    &NormalizeRows<V, float>,
                    &NormalizeRows<V, Float16>,
                    &NormalizeRows<V, BFloat16>,
                    &Widen<V, Float16>,
                    &Widen<V, BFloat16>};
}

}  // namespace
}  // namespace ort_rmsnorm
