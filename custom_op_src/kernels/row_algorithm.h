// The RMSNorm row algorithm, written once over a vector-traits class `V` and instantiated by each
// instruction-set translation unit (rmsnorm_<isa>.cpp) with its own compiler flags.
//
// V provides, for float32 lanes of width V::kWidth:
//   using F;  static F Zero();  static F Set1(float);  static F Add(F, F);  static F Mul(F, F);
//   static F Fma(F a, F b, F c) /* a*b + c */;  static float ReduceAdd(F);
//   for T in {float, Float16, BFloat16}:
//     static F Load(const T*), static void Store(T*, F): Load widens exactly, Store rounds to nearest-even;
//     template <T> static F Round(F): the values rounded to T (nearest-even) and widened back, narrowing the way
//       Store does, so that a Store and a Round of one value share the narrowing (SkipSumRow does both);
//     static void StoreStreaming(T*, F): Store with a non-temporal hint, to an address aligned to the vector's
//       bytes (a plain Store where the ISA has no such store);
//   static void StreamingFence(): orders the streaming stores before later ones (a no-op without them).
//
// Everything is in an anonymous namespace: see scalar_convert.h for why.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "rmsnorm_kernels.h"
#include "row_statistics.h"
#include "scalar_convert.h"

namespace ort_rmsnorm {
namespace {

// Squares are summed in float32 lanes over blocks of this many elements, then added in double: the vector loop
// stays float32-fast, each float32 partial sum adds at most 512 / (4 * kWidth) terms (32 with 4-wide lanes), and
// million-element rows keep float64-like accuracy.
constexpr int64_t kSumBlock = 512;

// Partial vectors at a row's end go through a zero-padded stack buffer, so V needs only full-width loads/stores.
template <class V, typename T>
typename V::F LoadPartial(const T* p, int64_t n) {
  T buffer[V::kWidth];
  std::memset(static_cast<void*>(buffer), 0, sizeof buffer);
  std::memcpy(static_cast<void*>(buffer), p, static_cast<size_t>(n) * sizeof(T));
  return V::Load(buffer);
}

template <class V, typename T>
void StorePartial(T* p, typename V::F v, int64_t n) {
  T buffer[V::kWidth];
  V::Store(buffer, v);
  std::memcpy(static_cast<void*>(p), buffer, static_cast<size_t>(n) * sizeof(T));
}

// Where a row's values come from, as float32 vectors of values exact in T: the tensor itself (X, or SkipRMSNorm's
// staged h), or SkipSumRow below.
template <class V, typename T>
struct InputRow {
  const T* x;
  typename V::F Load(int64_t i) const { return V::Load(x + i); }
  typename V::F LoadPartial(int64_t i, int64_t m) const { return ort_rmsnorm::LoadPartial<V>(x + i, m); }
  float Value(int64_t i) const { return ToFloat(x[i]); }
};

// Full-vector stores: streaming (non-temporal) ones for large calls, see RowBatch::streaming_stores.
template <class V, bool kStreaming, typename T>
void StoreVector(T* p, typename V::F v) {
  if constexpr (kStreaming) {
    V::StoreStreaming(p, v);
  } else {
    V::Store(p, v);
  }
}

// Where the first pass leaves SkipRMSNorm's h = round_T(x + skip): `stage`, cached memory the second pass reads h
// back from (reading it is cheaper than forming it again: two loads, an add and a rounding, which for 16-bit
// types cost more than the rest of the pass), and, with streaming stores, `streamed`, the `sum` output written
// around the cache (null when there is no `sum` or no streaming).
template <class V, bool kStreaming, typename T>
struct HSink {
  T* stage;
  T* streamed;

  void Store(int64_t i, typename V::F v) const {
    V::Store(stage + i, v);
    if constexpr (kStreaming) {
      if (streamed) V::StoreStreaming(streamed + i, v);
    }
  }
  void StorePartial(int64_t i, typename V::F v, int64_t m) const {
    ort_rmsnorm::StorePartial<V>(stage + i, v, m);
    if (kStreaming && streamed) ort_rmsnorm::StorePartial<V>(streamed + i, v, m);
  }
};

// SkipRMSNorm's first-pass row: h = round_T(x + skip), staged to `h` as it is formed. The sum is handed unrounded
// to both the store (which rounds) and Round, so the compiler computes the rounding once for the two.
template <class V, bool kStreaming, typename T>
struct SkipSumRow {
  const T* x;
  const T* skip;
  HSink<V, kStreaming, T> h;
  typename V::F Load(int64_t i) const {
    const typename V::F sum = V::Add(V::Load(x + i), V::Load(skip + i));
    h.Store(i, sum);
    return V::template Round<T>(sum);
  }
  typename V::F LoadPartial(int64_t i, int64_t m) const {
    const typename V::F sum =
        V::Add(ort_rmsnorm::LoadPartial<V>(x + i, m), ort_rmsnorm::LoadPartial<V>(skip + i, m));
    h.StorePartial(i, sum, m);
    return V::template Round<T>(sum);
  }
};

// Whether V has `F DotSquares(const BFloat16* p, F acc)`: acc + the squares of 2 * kWidth bfloat16 values straight
// from memory, two per lane (AVX512-BF16's vdpbf16ps: exact products, no widening). Used for plain bfloat16 rows.
template <class V, class Row, class = void>
struct HasDotSquares : std::false_type {};
template <class V, class Row>
struct HasDotSquares<V, Row, decltype(static_cast<void>(V::DotSquares(std::declval<const BFloat16*>(), V::Zero())))>
    : std::is_same<Row, InputRow<V, BFloat16>> {};

// Sum of squares of a row.
template <class V, class Row>
double SumSquares(const Row row, int64_t n) {
  using F = typename V::F;
  constexpr int64_t W = V::kWidth;
  double total = 0.0;
  for (int64_t block = 0; block < n; block += kSumBlock) {
    const int64_t end = block + kSumBlock < n ? block + kSumBlock : n;
    F a0 = V::Zero(), a1 = V::Zero(), a2 = V::Zero(), a3 = V::Zero();
    int64_t i = block;
    if constexpr (HasDotSquares<V, Row>::value) {
      for (; i + 8 * W <= end; i += 8 * W) {
        a0 = V::DotSquares(row.x + i, a0);
        a1 = V::DotSquares(row.x + i + 2 * W, a1);
        a2 = V::DotSquares(row.x + i + 4 * W, a2);
        a3 = V::DotSquares(row.x + i + 6 * W, a3);
      }
    }
    for (; i + 4 * W <= end; i += 4 * W) {
      const F v0 = row.Load(i), v1 = row.Load(i + W), v2 = row.Load(i + 2 * W), v3 = row.Load(i + 3 * W);
      a0 = V::Fma(v0, v0, a0);
      a1 = V::Fma(v1, v1, a1);
      a2 = V::Fma(v2, v2, a2);
      a3 = V::Fma(v3, v3, a3);
    }
    for (; i + W <= end; i += W) {
      const F v = row.Load(i);
      a0 = V::Fma(v, v, a0);
    }
    if (i < end) {
      const F v = row.LoadPartial(i, end - i);
      a1 = V::Fma(v, v, a1);
    }
    total += V::ReduceAdd(V::Add(V::Add(a0, a1), V::Add(a2, a3)));
  }
  return total;
}

// The next row's inputs, prefetched into L2 while the current row is finished from cache, so that its first pass
// finds them there instead of waiting on memory. Both pointers are always valid (the last row of a task points at
// itself, RMSNorm at X twice), which keeps the loop free of branches.
template <typename T>
struct NextRow {
  const T* a;
  const T* b;
  void Prefetch(int64_t i) const {
    __builtin_prefetch(a + i, 0, 2);
    __builtin_prefetch(b + i, 0, 2);
  }
};

// y = round_T(row * factor * scale).
template <class V, bool kStreaming, class Row, typename T>
void ScaleRow(const Row row, T* y, int64_t n, float factor, const float* scale, const NextRow<T> next) {
  using F = typename V::F;
  constexpr int64_t W = V::kWidth;
  // One cache line of T per iteration (at least one vector), with one prefetch.
  constexpr int64_t kVectors = 64 / (W * sizeof(T)) > 1 ? 64 / (W * sizeof(T)) : 1;
  const F f = V::Set1(factor);
  int64_t i = 0;
  if (scale) {
    for (; i + kVectors * W <= n; i += kVectors * W) {
      next.Prefetch(i);
#pragma GCC unroll 4
      for (int64_t k = i; k < i + kVectors * W; k += W) {
        StoreVector<V, kStreaming>(y + k, V::Mul(V::Mul(row.Load(k), f), V::Load(scale + k)));
      }
    }
    for (; i + W <= n; i += W) StoreVector<V, kStreaming>(y + i, V::Mul(V::Mul(row.Load(i), f), V::Load(scale + i)));
  } else {
    for (; i + kVectors * W <= n; i += kVectors * W) {
      next.Prefetch(i);
#pragma GCC unroll 4
      for (int64_t k = i; k < i + kVectors * W; k += W) StoreVector<V, kStreaming>(y + k, V::Mul(row.Load(k), f));
    }
    for (; i + W <= n; i += W) StoreVector<V, kStreaming>(y + i, V::Mul(row.Load(i), f));
  }
  if (i < n) {
    F v = V::Mul(row.LoadPartial(i, n - i), f);
    if (scale) v = V::Mul(v, LoadPartial<V>(scale + i, n - i));
    StorePartial<V>(y + i, v, n - i);
  }
}

// The whole row in double: for rows whose float32 statistic is not trustworthy (see row_statistics.h).
// Results are rounded double -> float -> T.
template <class Row, typename T>
void NormalizeRowInDouble(const Row row, T* y, int64_t n, const float* scale, float epsilon, bool eps_outside_sqrt) {
  double sum_squares = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double v = row.Value(i);
    sum_squares += v * v;
  }
  const double factor = InverseRms(sum_squares, n, epsilon, eps_outside_sqrt);
  for (int64_t i = 0; i < n; ++i) {
    const double v = static_cast<double>(row.Value(i)) * factor * (scale ? scale[i] : 1.0f);
    y[i] = FromFloat<T>(static_cast<float>(v));
  }
}

// One row: statistic from `stat_row`, output from `out_row`.
template <class V, bool kStreaming, class StatRow, class OutRow, typename T>
void NormalizeRow(const RowBatch<T>& batch, const StatRow stat_row, const OutRow out_row, T* y,
                  const NextRow<T> next) {
  const int64_t n = batch.cols;
  const double sum_squares = SumSquares<V>(stat_row, n);
  if (FastPathIsAccurate(sum_squares, batch.epsilon)) {
    const double factor = InverseRms(sum_squares, n, batch.epsilon, batch.eps_outside_sqrt);
    ScaleRow<V, kStreaming>(out_row, y, n, static_cast<float>(factor), batch.scale, next);
  } else {
    NormalizeRowInDouble(out_row, y, n, batch.scale, batch.epsilon, batch.eps_outside_sqrt);
  }
}

// A per-thread row of n elements, reused across calls.
template <typename T>
T* ScratchRow(int64_t n) {
  thread_local std::vector<T> row;
  if (row.size() < static_cast<size_t>(n)) row.resize(static_cast<size_t>(n));
  return row.data();
}

template <class V, bool kStreaming, typename T>
void NormalizeRowsWith(const RowBatch<T>& batch, int64_t begin, int64_t end) {
  const int64_t n = batch.cols;
  // SkipRMSNorm stages h in `sum`, else in `y` (its second pass overwrites it in place); with streaming stores
  // neither stays in cache, so in a per-thread scratch row. Every staging target is written at index i only after
  // x[i] and skip[i] were read, so any aliasing onnxruntime chooses (Y over X, sum over skip) is safe.
  T* const scratch = kStreaming && batch.skip ? ScratchRow<T>(n) : nullptr;
  for (int64_t r = begin; r < end; ++r) {
    const int64_t offset = r * n;
    const int64_t next_offset = r + 1 < end ? offset + n : offset;
    const T* next_x = batch.x + next_offset;
    const NextRow<T> next{next_x, batch.skip ? batch.skip + next_offset : next_x};
    T* y = batch.y + offset;
    if (!batch.skip) {
      const InputRow<V, T> row{batch.x + offset};
      NormalizeRow<V, kStreaming>(batch, row, row, y, next);
      continue;
    }
    T* const sum = batch.sum ? batch.sum + offset : nullptr;
    const HSink<V, kStreaming, T> h = kStreaming ? HSink<V, kStreaming, T>{scratch, sum}
                                                 : HSink<V, kStreaming, T>{sum ? sum : y, nullptr};
    NormalizeRow<V, kStreaming>(batch, SkipSumRow<V, kStreaming, T>{batch.x + offset, batch.skip + offset, h},
                                InputRow<V, T>{h.stage}, y, next);
  }
  if constexpr (kStreaming) V::StreamingFence();  // make the weakly ordered stores visible before the task ends
}

template <class V, typename T>
void NormalizeRows(const RowBatch<T>& batch, int64_t begin, int64_t end) {
  if (batch.cols == 0) return;
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
constexpr CpuKernels MakeCpuKernels(const char* isa) {
  return CpuKernels{isa,
                    &NormalizeRows<V, float>,
                    &NormalizeRows<V, Float16>,
                    &NormalizeRows<V, BFloat16>,
                    &Widen<V, Float16>,
                    &Widen<V, BFloat16>};
}

}  // namespace
}  // namespace ort_rmsnorm
