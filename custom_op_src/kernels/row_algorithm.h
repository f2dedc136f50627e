// The RMSNorm row algorithm, written once over a vector-traits class `V`: a row's sum of squares, its scaling, the
// pipelining of one row's loads under another's arithmetic, and the rows in float64. SkipRMSNorm's staging path over
// it is skip_rows.h; what each instruction-set translation unit (rmsnorm_<isa>.cpp) instantiates with its own
// compiler flags is isa_kernels.h.
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
//     optionally static void StoreStreamingPair(T*, F, F) and StorePair(T*, F, F): two vectors' values as one
//       streaming or ordinary store, where that is cheaper than two stores of half a cache line (see HasPairStore);
//     optionally, with those, StoreStreamingPairNoNaN and StorePairNoNaN: the same for values known not to be NaN,
//       where handling NaN costs instructions (see HasNoNaNPairStore);
//   static void StreamingFence(): orders the streaming stores before later ones (a no-op without them);
//   static constexpr bool kPipelineRows: whether streaming calls may be pipelined (NormalizeRowsWith decides);
//   optionally, for T where it is cheaper, template <bool kStreaming> static F StageSum(const T* x, const T* skip,
//     T* stage, T* streamed): SkipRMSNorm's h = round_T(x + skip) for kWidth values, stored to `stage` (and with a
//     streaming store to `streamed` when kStreaming and it is not null), returned widened (see HasStageSum).
//
// Everything is in an anonymous namespace (see scalar_convert.h for why), and nothing here uses a standard
// container or algorithm, whose inline functions have external linkage: the memory a call needs beyond its tensors
// comes from the caller, in RowBatch::scratch (staging.h).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "prefetch_order.h"
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

// A row read later is prefetched into L2 one row ahead (see NormalizeRowRange), so that its sum of squares
// finds it there instead of waiting on memory.
//
// The empty volatile asm keeps the prefetch: GCC counts a function that only prefetches (StepPrefetcher) as free of
// side effects and removes the calls to it.
inline void PrefetchToL2(const void* p) {
  __builtin_prefetch(p, 0, 2);
  __asm__ volatile("" : : "r"(p));
}

// Where a row's values come from, as float32 vectors of values exact in T: the tensor itself (X, or SkipRMSNorm's
// staged h), or SkipSumRow below. Prefetch(i) fetches the line of every input at element i.
template <class V, typename T>
struct InputRow {
  const T* x;
  typename V::F Load(int64_t i) const { return V::Load(x + i); }
  typename V::F LoadPartial(int64_t i, int64_t m) const { return ort_rmsnorm::LoadPartial<V>(x + i, m); }
  float Value(int64_t i) const { return ToFloat(x[i]); }
  void Prefetch(int64_t i) const { PrefetchToL2(x + i); }
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

// Whether V stores two vectors of T as one line, with streaming stores (StoreStreamingPair) or without (StorePair):
// AVX-512's 16-bit narrowing gives half a line per vector.
template <class V, bool kStreaming, typename T, class = void>
struct HasPairStore : std::false_type {};
template <class V, typename T>
struct HasPairStore<V, true, T, decltype(V::StoreStreamingPair(std::declval<T*>(), V::Zero(), V::Zero()))>
    : std::true_type {};
template <class V, typename T>
struct HasPairStore<V, false, T, decltype(V::StorePair(std::declval<T*>(), V::Zero(), V::Zero()))>
    : std::true_type {};

// Whether V also has the pair stores for values that are not NaN (AVX2's bfloat16 rounding needs no NaN lanes then).
template <class V, bool kStreaming, typename T, class = void>
struct HasNoNaNPairStore : std::false_type {};
template <class V, typename T>
struct HasNoNaNPairStore<V, true, T,
                         decltype(V::StoreStreamingPairNoNaN(std::declval<T*>(), V::Zero(), V::Zero()))>
    : std::true_type {};
template <class V, typename T>
struct HasNoNaNPairStore<V, false, T, decltype(V::StorePairNoNaN(std::declval<T*>(), V::Zero(), V::Zero()))>
    : std::true_type {};

// kNoNaN: neither a nor b holds a NaN (see NormalizeRowsWith).
template <class V, bool kStreaming, bool kNoNaN, typename T>
void StorePairOfVectors(T* p, typename V::F a, typename V::F b) {
  if constexpr (kNoNaN && kStreaming) {
    V::StoreStreamingPairNoNaN(p, a, b);
  } else if constexpr (kNoNaN) {
    V::StorePairNoNaN(p, a, b);
  } else if constexpr (kStreaming) {
    V::StoreStreamingPair(p, a, b);
  } else {
    V::StorePair(p, a, b);
  }
}

// Whether V has `F SquarePairs(const BFloat16* p, F acc)`: acc + the squares of 2 * kWidth bfloat16 values, two per
// lane, in the order AVX512-BF16's vdpbf16ps adds them; and whether it has `F DotSquares(const BFloat16* p, F acc)`,
// that instruction (see rmsnorm_avx512.cpp). Both give the same sums (bfloat16_square_pairs.h says where not); they
// serve plain bfloat16 rows.
template <class V, class Row, class = void>
struct HasSquarePairs : std::false_type {};
template <class V, class Row>
struct HasSquarePairs<V, Row, decltype(static_cast<void>(V::SquarePairs(std::declval<const BFloat16*>(), V::Zero())))>
    : std::is_same<Row, InputRow<V, BFloat16>> {};
template <class V, class = void>
struct HasDotSquares : std::false_type {};
template <class V>
struct HasDotSquares<V, decltype(static_cast<void>(V::DotSquares(std::declval<const BFloat16*>(), V::Zero())))>
    : std::true_type {};

// Sum of squares of a row. `alongside(i)` is called once per full step of four vectors, [i, i + 4 * kWidth), which
// covers [0, n - n % (4 * kWidth)): NormalizeRowRange scales the previous row there when pipelined. It comes after
// the step's own loads, so that they are under way (from L2, L3 or memory) while the other row is scaled: with the
// call first, streamed 16-bit rows were up to 15% slower on a Zen 4 core (docs/benchmarks.md, "What limits the
// kernels"). kDotSquares: whether bfloat16 pairs are summed with V::DotSquares, where V has it, or with
// V::SquarePairs.
//
// `alongside` is taken by value: a copy local to this function, which no store through the output pointers it holds
// can change, so that the compiler keeps its fields (pointers, the factor) in registers instead of reloading them
// after every store.
template <class V, bool kDotSquares = true, class Row, class Alongside>
double SumSquares(const Row row, int64_t n, const Alongside alongside) {
  using F = typename V::F;
  constexpr int64_t W = V::kWidth;
  double total = 0.0;
  for (int64_t block = 0; block < n; block += kSumBlock) {
    const int64_t end = block + kSumBlock < n ? block + kSumBlock : n;
    F a0 = V::Zero(), a1 = V::Zero(), a2 = V::Zero(), a3 = V::Zero();
    int64_t i = block;
    if constexpr (HasSquarePairs<V, Row>::value) {
      const auto pairs = [&](int64_t at, F acc) {
        if constexpr (kDotSquares && HasDotSquares<V>::value) return V::DotSquares(row.x + at, acc);
        return V::SquarePairs(row.x + at, acc);
      };
      for (; i + 8 * W <= end; i += 8 * W) {
        a0 = pairs(i, a0);
        a1 = pairs(i + 2 * W, a1);
        alongside(i);
        a2 = pairs(i + 4 * W, a2);
        a3 = pairs(i + 6 * W, a3);
        alongside(i + 4 * W);
      }
    }
    for (; i + 4 * W <= end; i += 4 * W) {
      const F v0 = row.Load(i), v1 = row.Load(i + W), v2 = row.Load(i + 2 * W), v3 = row.Load(i + 3 * W);
      a0 = V::Fma(v0, v0, a0);
      a1 = V::Fma(v1, v1, a1);
      a2 = V::Fma(v2, v2, a2);
      a3 = V::Fma(v3, v3, a3);
      alongside(i);
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

// Whether the row loops keep their operands in registers (a local copy that no store can change) or read them
// through a reference after every store. Registers made rows in cache up to 40% faster, and streamed 16-bit rows
// faster too; but float32 rows written with streaming stores, which are bound by memory, became 10-25% slower on a
// Zen 4 core (AVX2 and AVX-512, old and new kernels alternated in one process; the cause was not found without
// hardware counters), so those keep the reloads (docs/benchmarks.md, "What limits the kernels").
template <bool kStreaming, typename T>
constexpr bool RegistersPay() {
  return !(kStreaming && std::is_same_v<T, float>);
}

// Prefetches the lines of one step of SumSquares' loop (four vectors, kStep elements) of `row` per call, step s of
// the loop taking step order.StepAt(s) of the row: what a row loop does for the row it sums next.
template <class V, typename T, class Row>
struct StepPrefetcher {
  static constexpr int64_t kStep = 4 * V::kWidth;
  static constexpr int kStepLog2 = __builtin_ctzll(kStep);  // i >> kStepLog2 == i / kStep for i >= 0
  static_assert((int64_t{1} << kStepLog2) == kStep, "kStep is a power of two");
  Row row;
  PrefetchOrder order;  // Order(n)

  static PrefetchOrder Order(int64_t n) { return PrefetchOrder::Of(n * static_cast<int64_t>(sizeof(T)), n / kStep); }

  void operator()(int64_t i) const {
    const int64_t at = order.StepAt(i >> kStepLog2) * kStep;
    for (int64_t byte = 0; byte < kStep * static_cast<int64_t>(sizeof(T)); byte += 64) {
      row.Prefetch(at + byte / static_cast<int64_t>(sizeof(T)));
    }
  }
};

struct NoPrefetch {
  void operator()(int64_t) const {}
};

// y = round_T(row * factor * scale), in SumSquares' steps of four vectors (so that a row can be scaled inside the
// next row's sum of squares), calling `prefetch` once per step. kNoNaN: no product is NaN (see NormalizeRowsWith).
template <class V, bool kStreaming, bool kNoNaN, class Row, typename T, class Prefetch>
struct RowScaler {
  using F = typename V::F;
  static constexpr int64_t W = V::kWidth;
  static constexpr int64_t kStep = 4 * W;
  Row row;
  T* y;
  F factor;
  const float* scale;  // never nullptr (RowBatch::scale)
  Prefetch prefetch;

  void Step(int64_t i) const {
    prefetch(i);
    if constexpr (HasPairStore<V, kStreaming, T>::value) {
      for (int64_t k = i; k < i + kStep; k += 2 * W) {
        StorePairOfVectors<V, kStreaming, kNoNaN>(y + k, At(k), At(k + W));
      }
    } else {
      for (int64_t k = i; k < i + kStep; k += W) StoreVector<V, kStreaming>(y + k, At(k));
    }
  }
  // Elements [begin, n), begin a multiple of kStep. Works on a local copy, for the reason SumSquares takes
  // `alongside` by value, except where that was measured slower (RegistersPay).
  void Rest(int64_t begin, int64_t n) const {
    using Self = std::conditional_t<RegistersPay<kStreaming, T>(), const RowScaler, const RowScaler&>;
    Self self = *this;
    int64_t i = begin;
    for (; i + kStep <= n; i += kStep) self.Step(i);
    for (; i + W <= n; i += W) StoreVector<V, kStreaming>(self.y + i, self.At(i));
    if (i < n) {
      StorePartial<V>(self.y + i, self.Scaled(self.row.LoadPartial(i, n - i), LoadPartial<V>(self.scale + i, n - i)),
                      n - i);
    }
  }

 private:
  F Scaled(F v, F gain) const { return V::Mul(V::Mul(v, factor), gain); }
  F At(int64_t i) const { return Scaled(row.Load(i), V::Load(scale + i)); }
};

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
    const double v = static_cast<double>(row.Value(i)) * factor * scale[i];
    y[i] = FromFloat<T>(static_cast<float>(v));
  }
}

// Rows [begin, end): row r's statistic from `stat(r)`, its output from `out(r)` (a StatRow and an OutRow). Row r is
// summed, then scaled; `pipeline` sums row r + 1 in the steps of row r's scaling (one loop) so that row r + 1's loads,
// from outside the core's caches, overlap row r's arithmetic. The sums and products are the same either way
// (DotSquares and SquarePairs alike): results are bit-identical. The loop that scales a row prefetches the row summed
// next (r + 1, or r + 2 when r + 1 is summed in that loop).
template <class V, bool kStreaming, bool kNoNaN, typename T, class StatAt, class OutAt>
void NormalizeRowRange(const RowBatch<T>& batch, int64_t begin, int64_t end, bool pipeline, const StatAt& stat,
                       const OutAt& out) {
  const int64_t n = batch.cols;
  using Ahead = StepPrefetcher<V, T, decltype(stat(begin))>;
  const PrefetchOrder order = Ahead::Order(n);  // the same for every row
  // The row prefetched ahead of row `from`: the last row of a task prefetches itself, which keeps the loops free of
  // branches.
  const auto ahead = [&](int64_t from) { return Ahead{stat(from < end ? from : end - 1), order}; };
  double sum_squares = 0.0;
  bool summed = false;  // row r's sum of squares was formed alongside row r - 1
  for (int64_t r = begin; r < end; ++r) {
    if (!summed) sum_squares = SumSquares<V>(stat(r), n, NoPrefetch{});
    summed = false;
    const bool pipelined = pipeline && r + 1 < end;
    T* const y = batch.y + r * n;
    const auto row = out(r);
    if (!FastPathIsAccurate(sum_squares, batch.epsilon)) {
      NormalizeRowInDouble(row, y, n, batch.scale, batch.epsilon, batch.eps_outside_sqrt);
      continue;
    }
    const float factor = static_cast<float>(InverseRms(sum_squares, n, batch.epsilon, batch.eps_outside_sqrt));
    if (pipelined) {
      // Row r + 1 is summed here, so row r + 2 is prefetched.
      const RowScaler<V, kStreaming, kNoNaN, decltype(row), T, Ahead> scaler{row, y, V::Set1(factor), batch.scale,
                                                                            ahead(r + 2)};
      const auto by_copy = [scaler](int64_t i) { scaler.Step(i); };  // see SumSquares and RegistersPay
      const auto by_reference = [&scaler](int64_t i) { scaler.Step(i); };
      const auto step = [&] {
        if constexpr (RegistersPay<kStreaming, T>()) {
          return by_copy;
        } else {
          return by_reference;
        }
      }();
      // With the next row prefetched in parts, bfloat16 sums with vdpbf16ps made one Zen 4 core 10-35% slower than
      // the same sums in FMAs, whose bits are the instruction's (SquarePairs); elsewhere vdpbf16ps is faster.
      sum_squares = order.InParts() ? SumSquares<V, false>(stat(r + 1), n, step) : SumSquares<V>(stat(r + 1), n, step);
      summed = true;
      scaler.Rest(n - n % scaler.kStep, n);
    } else {
      const RowScaler<V, kStreaming, kNoNaN, decltype(row), T, Ahead> scaler{row, y, V::Set1(factor), batch.scale,
                                                                            ahead(r + 1)};
      scaler.Rest(0, n);
    }
  }
}

}  // namespace
}  // namespace ort_rmsnorm
