// SkipRMSNorm's staging path over the row algorithm (row_algorithm.h, for the same traits `V`): the first pass forms
// s = (x + skip) + bias and stages the values it normalizes, in `sum`, in `y` or in the caller's scratch (staging.h
// says which, and how much scratch that takes); the second pass normalizes the staged row.
//
// Internal linkage and no standard container or algorithm, as in row_algorithm.h: it is included by translation
// units with different instruction-set flags.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include "rmsnorm_kernels.h"
#include "row_algorithm.h"
#include "staging.h"

namespace ort_rmsnorm {
namespace {

// Where the first pass leaves SkipRMSNorm's normalized row: `stage`, cached memory the second pass reads it back
// from (reading it is cheaper than forming it again: two loads, an add and a rounding, which for 16-bit types cost
// more than the rest of the pass), holding round_T(s) (Stage = T) or the float32 sum s itself (Stage = float, for
// 16-bit T with normalize_float32_sum); and `sum`, the `sum` output, when that is not the stage itself (the stage
// is in scratch, see staging.h): written with streaming stores when kStreaming, null when there is no `sum`.
template <class V, bool kStreaming, typename T, typename Stage>
struct HSink {
  static constexpr bool kSeparateSum = kStreaming || !std::is_same_v<Stage, T>;
  Stage* stage;
  T* sum;

  void Store(int64_t i, typename V::F v) const {
    V::Store(stage + i, v);
    if constexpr (kSeparateSum) {
      if (sum) StoreVector<V, kStreaming>(sum + i, v);
    }
  }
  void StorePartial(int64_t i, typename V::F v, int64_t m) const {
    ort_rmsnorm::StorePartial<V>(stage + i, v, m);
    if (kSeparateSum && sum) ort_rmsnorm::StorePartial<V>(sum + i, v, m);
  }
};

// Whether V has StageSum for T (AVX-512 with FP16 adds float16 rows in float16).
template <class V, typename T, class = void>
struct HasStageSum : std::false_type {};
template <class V, typename T>
struct HasStageSum<V, T,
                   decltype(static_cast<void>(V::template StageSum<false>(
                       std::declval<const T*>(), std::declval<const T*>(), std::declval<T*>(), std::declval<T*>())))>
    : std::true_type {};

// SkipRMSNorm's first-pass row: s = (x + skip) + bias in float32 (the bias term when kBias), staged to `h` as it
// is formed; returns the normalized values, round_T(s) or s (Stage = float). The sum is handed unrounded to both
// the store (which rounds) and Round, so the compiler computes the rounding once for the two.
template <class V, bool kStreaming, typename T, typename Stage, bool kBias>
struct SkipSumRow {
  const T* x;
  const T* skip;
  const float* bias;  // one row for all: it stays in cache, so it is not prefetched
  HSink<V, kStreaming, T, Stage> h;
  void Prefetch(int64_t i) const {
    PrefetchToL2(x + i);
    PrefetchToL2(skip + i);
  }
  typename V::F Load(int64_t i) const {
    // StageSum adds x + skip in T, which rounds to the same bits as the float32 sum: only for round_T(x + skip).
    if constexpr (HasStageSum<V, T>::value && std::is_same_v<Stage, T> && !kBias) {
      return V::template StageSum<kStreaming>(x + i, skip + i, h.stage + i, h.sum ? h.sum + i : nullptr);
    }
    typename V::F sum = V::Add(V::Load(x + i), V::Load(skip + i));
    if constexpr (kBias) sum = V::Add(sum, V::Load(bias + i));
    h.Store(i, sum);
    return Normalized(sum);
  }
  typename V::F LoadPartial(int64_t i, int64_t m) const {
    typename V::F sum = V::Add(ort_rmsnorm::LoadPartial<V>(x + i, m), ort_rmsnorm::LoadPartial<V>(skip + i, m));
    if constexpr (kBias) sum = V::Add(sum, ort_rmsnorm::LoadPartial<V>(bias + i, m));
    h.StorePartial(i, sum, m);
    return Normalized(sum);
  }

 private:
  static typename V::F Normalized(typename V::F sum) {
    if constexpr (std::is_same_v<Stage, T>) {
      return V::template Round<T>(sum);
    } else {
      return sum;
    }
  }
};

// SkipRMSNorm's rows [begin, end): round_T(s) staged in `sum`, else in `y` (its second pass overwrites it in place),
// or in the caller's scratch (StagesInScratch), where the float32 sum is staged too. Every staging target is written
// at index i only after x[i] and skip[i] were read, so any aliasing onnxruntime chooses (Y over X, sum over skip) is
// safe.
template <class V, bool kStreaming, bool kNoNaN, typename Stage, bool kBias, typename T>
void NormalizeSkipRowsStaged(const RowBatch<T>& batch, int64_t begin, int64_t end, bool pipeline) {
  const int64_t n = batch.cols;
  constexpr bool kInScratch = HSink<V, kStreaming, T, Stage>::kSeparateSum;  // StagesInScratch(batch)
  unsigned char* const scratch = static_cast<unsigned char*>(batch.scratch);
  const int64_t staged_row_bytes = StagedRowBytes(batch);
  const auto stage = [&](int64_t r) -> Stage* {
    if constexpr (kInScratch) {
      return reinterpret_cast<Stage*>(scratch + (pipeline ? (r & 1) : 0) * staged_row_bytes);
    } else {
      return (batch.sum ? batch.sum : batch.y) + r * n;
    }
  };
  const auto stat = [&](int64_t r) {
    T* const sum = kInScratch && batch.sum ? batch.sum + r * n : nullptr;
    return SkipSumRow<V, kStreaming, T, Stage, kBias>{batch.x + r * n, batch.skip + r * n, batch.bias, {stage(r), sum}};
  };
  const auto out = [&](int64_t r) { return InputRow<V, Stage>{stage(r)}; };
  NormalizeRowRange<V, kStreaming, kNoNaN>(batch, begin, end, pipeline, stat, out);
}

template <class V, bool kStreaming, bool kNoNaN, bool kBias, typename T>
void NormalizeSkipRows(const RowBatch<T>& batch, int64_t begin, int64_t end, bool pipeline) {
  if constexpr (sizeof(T) < sizeof(float)) {
    if (NormalizesFloat32Sum(batch)) {
      NormalizeSkipRowsStaged<V, kStreaming, kNoNaN, float, kBias>(batch, begin, end, pipeline);
      return;
    }
  }
  NormalizeSkipRowsStaged<V, kStreaming, kNoNaN, T, kBias>(batch, begin, end, pipeline);
}

}  // namespace
}  // namespace ort_rmsnorm
