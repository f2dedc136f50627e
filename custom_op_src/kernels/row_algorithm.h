// The RMSNorm row algorithm, written once over a vector-traits class `V` and instantiated by each
// instruction-set translation unit (rmsnorm_<isa>.cpp) with its own compiler flags.
//
// V provides, for float32 lanes of width V::kWidth:
//   using F;  static F Zero();  static F Set1(float);  static F Add(F, F);  static F Mul(F, F);
//   static F Fma(F a, F b, F c) /* a*b + c */;  static float ReduceAdd(F);
//   static F Load(const T*) and static void Store(T*, F) for T in {float, Float16, BFloat16}
//     (Load widens exactly; Store rounds to nearest-even).
//
// Everything is in an anonymous namespace: see scalar_convert.h for why.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

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

template <class V, typename T>
double SumSquares(const T* x, int64_t n) {
  using F = typename V::F;
  constexpr int64_t W = V::kWidth;
  double total = 0.0;
  for (int64_t block = 0; block < n; block += kSumBlock) {
    const int64_t end = block + kSumBlock < n ? block + kSumBlock : n;
    F a0 = V::Zero(), a1 = V::Zero(), a2 = V::Zero(), a3 = V::Zero();
    int64_t i = block;
    for (; i + 4 * W <= end; i += 4 * W) {
      const F v0 = V::Load(x + i), v1 = V::Load(x + i + W), v2 = V::Load(x + i + 2 * W), v3 = V::Load(x + i + 3 * W);
      a0 = V::Fma(v0, v0, a0);
      a1 = V::Fma(v1, v1, a1);
      a2 = V::Fma(v2, v2, a2);
      a3 = V::Fma(v3, v3, a3);
    }
    for (; i + W <= end; i += W) {
      const F v = V::Load(x + i);
      a0 = V::Fma(v, v, a0);
    }
    if (i < end) {
      const F v = LoadPartial<V>(x + i, end - i);
      a1 = V::Fma(v, v, a1);
    }
    total += V::ReduceAdd(V::Add(V::Add(a0, a1), V::Add(a2, a3)));
  }
  return total;
}

// h = round_T(a + b) is stored, and the sum of squares of the stored (rounded) values is returned, so the
// statistic is exactly that of the unfused graph, where the Add produces a T tensor.
template <class V, typename T>
double AddStoreSumSquares(const T* a, const T* b, T* h, int64_t n) {
  using F = typename V::F;
  constexpr int64_t W = V::kWidth;
  auto rounded = [](const T* stored, F exact) {
    if constexpr (std::is_same_v<T, float>) {
      (void)stored;
      return exact;
    } else {
      return V::Load(stored);  // just stored: read back the rounded value from L1
    }
  };
  double total = 0.0;
  for (int64_t block = 0; block < n; block += kSumBlock) {
    const int64_t end = block + kSumBlock < n ? block + kSumBlock : n;
    F a0 = V::Zero(), a1 = V::Zero();
    int64_t i = block;
    for (; i + 2 * W <= end; i += 2 * W) {
      const F s0 = V::Add(V::Load(a + i), V::Load(b + i));
      const F s1 = V::Add(V::Load(a + i + W), V::Load(b + i + W));
      V::Store(h + i, s0);
      V::Store(h + i + W, s1);
      const F r0 = rounded(h + i, s0), r1 = rounded(h + i + W, s1);
      a0 = V::Fma(r0, r0, a0);
      a1 = V::Fma(r1, r1, a1);
    }
    for (; i < end; i += W) {
      const int64_t m = end - i < W ? end - i : W;
      const F s = V::Add(LoadPartial<V>(a + i, m), LoadPartial<V>(b + i, m));
      StorePartial<V>(h + i, s, m);
      const F r = LoadPartial<V>(h + i, m);
      a0 = V::Fma(r, r, a0);
    }
    total += V::ReduceAdd(V::Add(a0, a1));
  }
  return total;
}

// y = round_T(src * factor * scale). `src` may equal `y` (in-place).
template <class V, typename T>
void ScaleRow(const T* src, T* y, int64_t n, float factor, const float* scale) {
  using F = typename V::F;
  constexpr int64_t W = V::kWidth;
  const F f = V::Set1(factor);
  int64_t i = 0;
  if (scale) {
    for (; i + W <= n; i += W) V::Store(y + i, V::Mul(V::Mul(V::Load(src + i), f), V::Load(scale + i)));
    if (i < n) {
      const F v = V::Mul(V::Mul(LoadPartial<V>(src + i, n - i), f), LoadPartial<V>(scale + i, n - i));
      StorePartial<V>(y + i, v, n - i);
    }
  } else {
    for (; i + W <= n; i += W) V::Store(y + i, V::Mul(V::Load(src + i), f));
    if (i < n) StorePartial<V>(y + i, V::Mul(LoadPartial<V>(src + i, n - i), f), n - i);
  }
}

// The whole row in double: for rows whose float32 statistic is not trustworthy (see kMinFastSumSquares).
// Results are rounded double -> float -> T.
template <typename T>
void NormalizeRowInDouble(const T* src, T* y, int64_t n, const float* scale, float epsilon, bool eps_outside_sqrt) {
  double sum_squares = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double v = ToFloat(src[i]);
    sum_squares += v * v;
  }
  const double factor = InverseRms(sum_squares, n, epsilon, eps_outside_sqrt);
  for (int64_t i = 0; i < n; ++i) {
    const double v = static_cast<double>(ToFloat(src[i])) * factor * (scale ? scale[i] : 1.0f);
    y[i] = FromFloat<T>(static_cast<float>(v));
  }
}

template <class V, typename T>
void NormalizeRows(const RowBatch<T>& batch, int64_t begin, int64_t end) {
  const int64_t n = batch.cols;
  if (n == 0) return;
  for (int64_t r = begin; r < end; ++r) {
    const int64_t offset = r * n;
    T* y = batch.y + offset;
    const T* src = batch.x + offset;
    double sum_squares;
    if (batch.skip) {
      // Without a `sum` output, the rounded sum is staged in y and normalized in place from cache.
      T* h = batch.sum ? batch.sum + offset : y;
      sum_squares = AddStoreSumSquares<V>(src, batch.skip + offset, h, n);
      src = h;
    } else {
      sum_squares = SumSquares<V>(src, n);
    }
    if (FastPathIsAccurate(sum_squares, batch.epsilon)) {
      const double factor = InverseRms(sum_squares, n, batch.epsilon, batch.eps_outside_sqrt);
      ScaleRow<V>(src, y, n, static_cast<float>(factor), batch.scale);
    } else {
      NormalizeRowInDouble(src, y, n, batch.scale, batch.epsilon, batch.eps_outside_sqrt);
    }
  }
}

// The kernel table of one instruction set.
template <class V>
constexpr CpuKernels MakeCpuKernels(const char* isa) {
  return CpuKernels{isa, &NormalizeRows<V, float>, &NormalizeRows<V, Float16>, &NormalizeRows<V, BFloat16>};
}

}  // namespace
}  // namespace ort_rmsnorm
