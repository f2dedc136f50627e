// Kernel tests without onnxruntime: every instruction set this CPU runs, every element type, against a float64
// reference, plus agreement between instruction sets. Exit status 0 = all passed.
//
//   kernel_tests            run everything
//   kernel_tests --quick    skip the million-element rows (for slow emulators)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#ifdef ORT_RMSNORM_TEST_AVX512_BF16
#include "bfloat16_square_pairs.h"
#endif
#include "kernel_test_support.h"
#include "norm_geometry.h"
#include "prefetch_order.h"

using namespace ort_rmsnorm;

namespace {

struct Case {
  int64_t rows;
  int64_t cols;
  bool skip;
  bool sum_output;
  bool scale;
  float epsilon;
  bool eps_outside_sqrt;
  bool bias = false;         // SkipRMSNorm: a bias row added after skip
  bool float32_sum = false;  // SkipRMSNorm: normalize_float32_sum
};

std::string Describe(const char* isa, const char* type, const Case& c) {
  char text[256];
  std::snprintf(text, sizeof text,
                "%s %s rows=%lld cols=%lld skip=%d sum=%d scale=%d eps=%g outside=%d bias=%d float32_sum=%d", isa,
                type, static_cast<long long>(c.rows), static_cast<long long>(c.cols), c.skip, c.sum_output, c.scale,
                c.epsilon, c.eps_outside_sqrt, c.bias, c.float32_sum);
  return text;
}

// float64 reference of the contract (SkipSum, NormReference): y, and the `sum` output h.
template <typename T>
void Reference(const Case& c, const std::vector<T>& x, const std::vector<T>& skip, const std::vector<float>& scale,
               const std::vector<float>& bias, std::vector<double>* y, std::vector<T>* h) {
  const auto gain = [&](int64_t i) { return c.scale ? static_cast<double>(scale[static_cast<size_t>(i)]) : 1.0; };
  if (!c.skip) {
    *h = x;
    *y = NormReference(x, c.cols, c.epsilon, c.eps_outside_sqrt, gain);
    return;
  }
  std::vector<float> s;
  SkipSum(x, skip, c.bias ? bias : std::vector<float>{}, c.cols, &s, h);
  *y = c.float32_sum ? NormReference(s, c.cols, c.epsilon, c.eps_outside_sqrt, gain)
                     : NormReference(*h, c.cols, c.epsilon, c.eps_outside_sqrt, gain);
}

// Runs `kernels` on one case and compares with the reference (and, when given, with another ISA's output). Rows of
// whole cache lines are run a second time with streaming stores, which must give the same bits.
template <typename T>
void RunCase(const CpuKernels& kernels, const Case& c, const std::vector<T>& x, const std::vector<T>& skip,
             const std::vector<float>& scale, std::vector<T>* y_out, const std::vector<float>& bias = {}) {
  const size_t n = x.size();
  AlignedBuffer<T> y(n), sum(n);
  RowBatch<T> batch;
  batch.x = x.data();
  batch.skip = c.skip ? skip.data() : nullptr;
  batch.sum = c.skip && c.sum_output ? sum.data() : nullptr;
  batch.y = y.data();
  batch.scale = c.scale ? scale.data() : nullptr;
  batch.bias = c.skip && c.bias ? bias.data() : nullptr;
  batch.normalize_float32_sum = c.float32_sum;
  batch.cols = c.cols;
  batch.epsilon = c.epsilon;
  batch.eps_outside_sqrt = c.eps_outside_sqrt;
  // Two calls over disjoint row ranges, as the thread pool would make them.
  Normalize<T>(kernels, batch, 0, c.rows / 2);
  Normalize<T>(kernels, batch, c.rows / 2, c.rows);

  const std::string name = Describe(kernels.isa, TypeName<T>(), c);
  if (c.cols * sizeof(T) % 64 == 0) {
    AlignedBuffer<T> streamed_y(n), streamed_sum(n);
    RowBatch<T> streamed = batch;
    streamed.streaming_stores = true;
    streamed.y = streamed_y.data();
    streamed.sum = batch.sum ? streamed_sum.data() : nullptr;
    Normalize<T>(kernels, streamed, 0, c.rows);
    bool same = std::memcmp(streamed_y.data(), y.data(), n * sizeof(T)) == 0;
    if (batch.sum) same = same && std::memcmp(streamed_sum.data(), sum.data(), n * sizeof(T)) == 0;
    Expect(same, name + ": streaming stores change the result");
  }

  std::vector<double> reference;
  std::vector<T> h;
  Reference(c, x, skip, scale, bias, &reference, &h);
  const double rtol = RelativeTolerance<T>(), atol = SmallestSubnormal<T>();
  double worst = 0.0;
  size_t worst_index = 0;
  bool ok = true;
  for (size_t k = 0; k < n; ++k) {
    const double got = ToFloat(y[k]), want = reference[k];
    if (std::isnan(want) || std::isnan(got)) {
      ok = ok && std::isnan(want) && std::isnan(got);
      continue;
    }
    const double excess = std::fabs(got - want) - (atol + rtol * std::fabs(want));
    if (excess > worst || !(excess <= 0.0)) {
      worst = excess;
      worst_index = k;
      ok = false;
    }
  }
  if (!ok) {
    Expect(false, name + ": y[" + std::to_string(worst_index) + "]=" + std::to_string(ToFloat(y[worst_index])) +
                      " reference=" + std::to_string(reference[worst_index]));
  } else {
    Expect(true, name);
  }
  if (batch.sum) {
    bool sum_ok = true;
    for (size_t k = 0; k < n; ++k) sum_ok = sum_ok && SameBits(ToFloat(sum[k]), ToFloat(h[k]));
    Expect(sum_ok, name + ": sum output differs from round_T(x + skip (+ bias))");
  }
  y_out->assign(y.data(), y.data() + n);
}

template <typename T>
void CompareIsas(const std::vector<const CpuKernels*>& isas, const Case& c, std::mt19937& rng, double magnitude) {
  const size_t n = static_cast<size_t>(c.rows * c.cols);
  const auto x = RandomValues<T>(rng, n, magnitude, magnitude * 0.3);  // non-zero mean: no centering
  const auto skip = RandomValues<T>(rng, n, magnitude);
  std::vector<float> scale(static_cast<size_t>(c.cols));
  std::uniform_real_distribution<float> gain(-2.0f, 2.0f);
  for (auto& g : scale) g = gain(rng);
  std::vector<float> bias;  // values of T, as the glue widens them
  for (const T& b : RandomValues<T>(rng, static_cast<size_t>(c.cols), magnitude)) bias.push_back(ToFloat(b));

  std::vector<T> first;
  for (const CpuKernels* kernels : isas) {
    std::vector<T> y;
    RunCase<T>(*kernels, c, x, skip, scale, &y, bias);
    if (first.empty()) {
      first = std::move(y);
      continue;
    }
    // Instruction sets differ only in float32 summation order: at most 1 ulp of T apart (for float32 the
    // partial sums differ, so allow the same relative tolerance as against the reference).
    bool agree = true;
    for (size_t k = 0; k < n && agree; ++k) {
      const double a = ToFloat(first[k]), b = ToFloat(y[k]);
      agree = std::fabs(a - b) <= 2.0 * RelativeTolerance<T>() * std::fabs(a) + SmallestSubnormal<T>();
    }
    Expect(agree, Describe(kernels->isa, TypeName<T>(), c) + ": disagrees with " + isas.front()->isa);
  }
}

template <typename T>
void RunMatrix(const std::vector<const CpuKernels*>& isas, bool quick) {
  std::mt19937 rng(1234);
  const int64_t sizes[] = {1, 2, 3, 4, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 511, 512, 513, 768, 4095, 4096, 4097, 16384};
  for (int64_t cols : sizes) {
    for (int variant = 0; variant < 10; ++variant) {
      Case c{3, cols, variant >= 3, variant == 4 || variant >= 6, variant != 1, variant == 2 ? 0.0f : 1e-5f,
             variant == 5};
      c.bias = variant == 6 || variant == 8 || variant == 9;                   // rounded and float32 sums
      c.float32_sum = variant >= 7;
      c.sum_output = c.sum_output && variant != 9;
      CompareIsas<T>(isas, c, rng, 1.0);
    }
  }
  // Epsilon comparable to the mean square: placement and value visibly change the result.
  for (bool outside : {false, true}) CompareIsas<T>(isas, Case{4, 64, false, false, true, 1e-2f, outside}, rng, 0.05);
  // Many rows, one statistic per row.
  CompareIsas<T>(isas, Case{257, 96, true, true, true, 1e-6f, false}, rng, 3.0);
  CompareIsas<T>(isas, Case{257, 96, true, true, true, 1e-6f, false, true, true}, rng, 3.0);
  if (!quick) {
    CompareIsas<T>(isas, Case{2, 1 << 20, true, true, true, 1e-5f, false}, rng, 1.0);
    CompareIsas<T>(isas, Case{2, 1 << 20, true, true, true, 1e-5f, false, true, true}, rng, 1.0);
  }
}

// Values whose squares overflow or underflow float32 (bfloat16/float32 range) or float16 limits.
template <typename T>
void RunExtremes(const std::vector<const CpuKernels*>& isas) {
  const std::vector<float> scale(64, 1.5f);
  for (double magnitude : {6.0e4, 1.0e-6, 1.0e20, 1.0e36, 3.0e38, 1.0e-30, 1.0e-38}) {
    if (ToFloat(FromFloat<T>(static_cast<float>(magnitude))) == 0.0f ||
        std::isinf(ToFloat(FromFloat<T>(static_cast<float>(magnitude))))) {
      continue;  // not representable in T
    }
    for (float epsilon : {0.0f, 1e-6f}) {
      for (int mode = 0; mode < 3; ++mode) {  // RMSNorm; SkipRMSNorm; with a bias, normalizing the float32 sum
        const bool skip = mode > 0;
        if (skip && magnitude > 1e30) continue;  // x + skip would overflow float32: covered by the inf cases
        std::vector<T> x(2 * 64), s(2 * 64);
        for (size_t k = 0; k < x.size(); ++k) {
          x[k] = FromFloat<T>(static_cast<float>(magnitude * (k % 2 ? 1.0 : -0.5)));
          s[k] = FromFloat<T>(static_cast<float>(magnitude * 0.25));
        }
        // float16 at 6e4: x + skip overflows float16 (sum = inf) but not float32, so with the float32 sum y is finite.
        const std::vector<float> bias(64, ToFloat(FromFloat<T>(static_cast<float>(magnitude * 0.125))));
        Case c{2, 64, skip, skip, true, epsilon, false};
        c.bias = c.float32_sum = mode == 2;
        // With eps = 0 tiny rows are normalized to O(1); with eps > 0 and tiny inputs eps dominates.
        for (const CpuKernels* kernels : isas) {
          std::vector<T> y;
          RunCase<T>(*kernels, c, x, s, scale, &y, bias);
        }
      }
    }
  }
  // NaN and inf propagate through their row only. The row (redone in double) sits between ordinary ones, and its
  // rows are whole cache lines, so RunCase also runs it with streaming stores, where rows are pipelined
  // (each scaled inside the next row's sum of squares).
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (float special : {nan, inf, -inf}) {
    std::vector<T> x(5 * 64, FromFloat<T>(1.0f)), s(5 * 64, FromFloat<T>(0.0f));
    x[2 * 64 + 9] = FromFloat<T>(special);
    for (int mode = 0; mode < 3; ++mode) {  // RMSNorm; SkipRMSNorm; normalizing the float32 sum
      const bool skip = mode > 0;
      Case c{5, 64, skip, skip, false, 1e-5f, false};
      c.float32_sum = mode == 2;
      for (const CpuKernels* kernels : isas) {
        std::vector<T> y;
        RunCase<T>(*kernels, c, x, s, {}, &y);
        bool others_ok = true;
        for (size_t k = 0; k < y.size(); ++k) others_ok = others_ok && (k / 64 == 2 || ToFloat(y[k]) > 0.99f);
        Expect(others_ok, Describe(kernels->isa, TypeName<T>(), c) + ": special value leaked into other rows");
      }
    }
  }
  // All-zero rows: 0 with eps > 0; 0/0 = NaN with eps = 0.
  for (const CpuKernels* kernels : isas) {
    std::vector<T> zeros(2 * 16, FromFloat<T>(0.0f)), y;
    RunCase<T>(*kernels, Case{2, 16, false, false, false, 1e-5f, false}, zeros, zeros, {}, &y);
    RunCase<T>(*kernels, Case{2, 16, false, false, false, 0.0f, false}, zeros, zeros, {}, &y);
  }
}

// Calls of several rows may narrow their outputs without handling NaN once they found the scale finite
// (NormalizeRowsWith; AVX2's bfloat16), while a call of one row never does: the two give the same bits, with products
// that overflow to infinity, signed zeros and subnormal results. With an infinite or NaN gain they give NaN and the
// infinities where the float64 reference has them.
template <typename T>
void TestScaleCheck(const std::vector<const CpuKernels*>& isas) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  constexpr int64_t rows = 8;
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t cols : {int64_t{64}, int64_t{96}, int64_t{100}}) {
    const size_t n = static_cast<size_t>(rows * cols);
    auto x = RandomValues<T>(rng, n, 2.0);
    for (int64_t i = 0; i < cols; i += 7) x[static_cast<size_t>(3 * cols + i)] = FromFloat<T>(0.0f);
    x[static_cast<size_t>(5 * cols + 1)] = FromFloat<T>(-0.0f);
    const auto skip_values = RandomValues<T>(rng, n, 1.0);
    // Gains: ordinary; some near the float32 limit (products overflow); some subnormal; infinities; NaNs.
    for (int gains = 0; gains < 5; ++gains) {
      std::vector<float> scale(static_cast<size_t>(cols));
      for (float& g : scale) g = 1.0f + 0.5f * normal(rng);
      for (int64_t i = 0; i < cols; i += 3) {
        if (gains == 1) scale[static_cast<size_t>(i)] = i % 2 ? -3e38f : 3e38f;
        if (gains == 2) scale[static_cast<size_t>(i)] = 1e-40f;
      }
      if (gains == 3) scale[0] = -inf, scale[static_cast<size_t>(cols / 2)] = inf;
      if (gains == 4) {
        // NaN with every payload bit set: rounding it on the bit pattern would carry into the sign bit.
        scale[static_cast<size_t>(cols / 3)] = nan;
        scale[static_cast<size_t>(cols / 3 + 1)] = BitsToFloat(0x7FFFFFFFu);
        scale[static_cast<size_t>(cols / 3 + 2)] = BitsToFloat(0xFFFFFFFFu);
      }
      for (bool skip : {false, true}) {
        for (bool streaming : {false, true}) {
          if (streaming && cols * static_cast<int64_t>(sizeof(T)) % 64 != 0) continue;
          Case c{rows, cols, skip, skip, true, 1e-5f, false};
          for (const CpuKernels* kernels : isas) {
            AlignedBuffer<T> y_call(n), sum_call(n), y_rows(n), sum_rows(n);
            RowBatch<T> batch;
            batch.x = x.data();
            batch.skip = skip ? skip_values.data() : nullptr;
            batch.scale = scale.data();
            batch.cols = cols;
            batch.streaming_stores = streaming;
            batch.y = y_call.data();
            batch.sum = skip ? sum_call.data() : nullptr;
            Normalize<T>(*kernels, batch, 0, rows);
            batch.y = y_rows.data();
            batch.sum = skip ? sum_rows.data() : nullptr;
            for (int64_t r = 0; r < rows; ++r) Normalize<T>(*kernels, batch, r, r + 1);
            const std::string name = Describe(kernels->isa, TypeName<T>(), c) + " gains " + std::to_string(gains) +
                                     (streaming ? " streaming" : "");
            bool same = std::memcmp(y_call.data(), y_rows.data(), n * sizeof(T)) == 0;
            if (skip) same = same && std::memcmp(sum_call.data(), sum_rows.data(), n * sizeof(T)) == 0;
            Expect(same, name + ": one call and row by row differ");
            if (gains < 3) continue;
            std::vector<double> reference;
            std::vector<T> h;
            Reference(c, x, skip_values, scale, {}, &reference, &h);
            bool special_ok = true;
            for (size_t k = 0; k < n; ++k) {
              const double want = reference[k], got = ToFloat(y_call[k]);
              if (std::isnan(want) || std::isinf(want)) special_ok = special_ok && WithinTolerance<T>(got, want);
            }
            Expect(special_ok, name + ": NaN or infinity not where the reference has it");
          }
        }
      }
    }
  }
}

// Outputs over inputs (Y over X, sum over skip: the aliasing onnxruntime may choose) give the bits of separate
// buffers, with and without streaming stores (rows of whole cache lines for those), with and without `sum`,
// normalizing round_T(s) or the float32 sum, with a bias.
template <typename T>
void RunInPlace(const std::vector<const CpuKernels*>& isas) {
  std::mt19937 rng(7);
  for (const CpuKernels* kernels : isas) {
    for (bool streaming : {false, true}) {
      // RMSNorm; SkipRMSNorm with sum; without sum; both again with a bias and the float32 sum.
      for (int outputs = 0; outputs < 5; ++outputs) {
        const bool skip = outputs > 0, with_sum = outputs == 1 || outputs == 3, float32_sum = outputs >= 3;
        const int64_t rows = 5, cols = streaming ? 96 : 37;
        const size_t n = static_cast<size_t>(rows * cols);
        const auto x_values = RandomValues<T>(rng, n, 2.0);
        const auto skip_values = RandomValues<T>(rng, n, 2.0);
        AlignedBuffer<T> x(n), s(n), expected(n), expected_sum(n);
        std::memcpy(static_cast<void*>(x.data()), x_values.data(), n * sizeof(T));
        std::memcpy(static_cast<void*>(s.data()), skip_values.data(), n * sizeof(T));
        std::vector<float> bias;
        for (const T& b : RandomValues<T>(rng, static_cast<size_t>(cols), 1.0)) bias.push_back(ToFloat(b));
        RowBatch<T> batch;
        batch.x = x.data();
        batch.skip = skip ? s.data() : nullptr;
        batch.sum = with_sum ? expected_sum.data() : nullptr;
        batch.y = expected.data();
        batch.cols = cols;
        batch.streaming_stores = streaming;
        batch.bias = float32_sum ? bias.data() : nullptr;
        batch.normalize_float32_sum = float32_sum;
        Normalize<T>(*kernels, batch, 0, rows);
        batch.y = x.data();
        batch.sum = with_sum ? s.data() : nullptr;
        Normalize<T>(*kernels, batch, 0, rows);
        bool same = std::memcmp(x.data(), expected.data(), n * sizeof(T)) == 0;
        if (with_sum) same = same && std::memcmp(s.data(), expected_sum.data(), n * sizeof(T)) == 0;
        Expect(same, std::string(kernels->isa) + " " + TypeName<T>() + (streaming ? " streaming" : "") +
                         (skip ? (with_sum ? " skip+sum" : " skip") : "") + (float32_sum ? " float32 sum" : "") +
                         ": in-place result differs");
      }
    }
  }
}

// For 16-bit types the two SkipRMSNorm settings normalize different rows. With sums that rounding to T moves (skip
// small against x), each setting's output is within tolerance of its own reference (RunCase) and, in some elements,
// outside the tolerance of the other setting's reference: the tests tell the two apart. Rounding the sum moves an
// output by at most about one unit in the last place of T, so that is what the difference amounts to. For float32
// the two settings are the same computation: the same bits.
template <typename T>
void TestFloat32SumMatters(const std::vector<const CpuKernels*>& isas) {
  std::mt19937 rng(11);
  const int64_t rows = 4, cols = 256;
  const size_t n = static_cast<size_t>(rows * cols);
  const auto x = RandomValues<T>(rng, n, 1.0, 0.3);
  const auto skip = RandomValues<T>(rng, n, 1.0 / 64);
  const std::vector<float> scale(static_cast<size_t>(cols), 1.0f);
  Case rounded_case{rows, cols, true, true, true, 1e-5f, false};
  Case float32_case = rounded_case;
  float32_case.float32_sum = true;
  std::vector<double> rounded_reference, float32_reference;
  std::vector<T> h;
  Reference(rounded_case, x, skip, scale, {}, &rounded_reference, &h);
  Reference(float32_case, x, skip, scale, {}, &float32_reference, &h);
  // Elements of `y` outside the tolerance of `reference`.
  const auto outside = [&](const std::vector<T>& y, const std::vector<double>& reference) {
    size_t count = 0;
    for (size_t k = 0; k < n; ++k) count += !WithinTolerance<T>(ToFloat(y[k]), reference[k]);
    return count;
  };
  for (const CpuKernels* kernels : isas) {
    std::vector<T> rounded, unrounded;
    RunCase<T>(*kernels, rounded_case, x, skip, scale, &rounded);
    RunCase<T>(*kernels, float32_case, x, skip, scale, &unrounded);
    const std::string name = std::string(kernels->isa) + " " + TypeName<T>();
    if constexpr (std::is_same_v<T, float>) {
      Expect(std::memcmp(rounded.data(), unrounded.data(), n * sizeof(T)) == 0,
             name + ": normalize_float32_sum changes float32 results");
    } else {
      const size_t a = outside(unrounded, rounded_reference), b = outside(rounded, float32_reference);
      Expect(a > 0 && b > 0, name + ": the two sums are not told apart (" + std::to_string(a) + " and " +
                                 std::to_string(b) + " of " + std::to_string(n) + " outside the other's tolerance)");
    }
  }
}

#ifdef ORT_RMSNORM_TEST_AVX512_BF16
// The AVX-512 kernels sum bfloat16 squares with vdpbf16ps or with SquarePairsAvx512, by speed (NormalizeRowRange),
// so the two must give the same bits. Outputs hide most differences (the float32 factor rounds away a changed low
// bit of the float64 sum), so the sums are compared directly: random accumulators and values over a wide range of
// exponents, where another order of the additions changes about one lane in twenty.
__attribute__((target("avx512f,avx512bf16"))) bool SquarePairsMatchDpbf16(const BFloat16* x, const float* acc) {
  const __m512 a = _mm512_loadu_ps(acc);
  const __m512bh v = (__m512bh)_mm512_loadu_si512(x);
  const __mmask16 same = _mm512_cmpeq_epi32_mask(_mm512_castps_si512(_mm512_dpbf16_ps(a, v, v)),
                                                 _mm512_castps_si512(SquarePairsAvx512(x, a)));
  return same == 0xFFFF;
}

void TestSquarePairs(const std::vector<const CpuKernels*>& isas) {
  bool has_bf16 = false;
  for (const CpuKernels* kernels : isas) has_bf16 = has_bf16 || kernels == CpuKernelsFor(CpuIsa::kAvx512Bf16);
  if (!has_bf16) return;
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> mantissa(0, (1u << 23) - 1);
  std::uniform_int_distribution<int> exponent(-30, 30), sign(0, 1);
  const auto random_float = [&](int scale) {
    return std::ldexp(1.0f + std::ldexp(static_cast<float>(mantissa(rng)), -23), exponent(rng) * scale / 30) *
           (sign(rng) ? -1.0f : 1.0f);
  };
  bool ok = true;
  for (int trial = 0; trial < 100000 && ok; ++trial) {
    BFloat16 x[32];
    float acc[16];
    for (auto& v : x) v = FromFloat<BFloat16>(random_float(20));
    for (auto& a : acc) a = std::fabs(random_float(30));
    ok = SquarePairsMatchDpbf16(x, acc);
  }
  Expect(ok, "SquarePairsAvx512 gives vdpbf16ps's bits");
}
#else
void TestSquarePairs(const std::vector<const CpuKernels*>&) {}
#endif

// Each ISA's widening of 16-bit scales: every bit pattern, at odd offsets and lengths (vector body and tail).
template <typename T>
void TestWiden(const std::vector<const CpuKernels*>& isas) {
  std::vector<T> all(0x10000);
  for (uint32_t bits = 0; bits <= 0xFFFF; ++bits) all[bits].bits = static_cast<uint16_t>(bits);
  for (const CpuKernels* kernels : isas) {
    std::vector<float> out(all.size());
    kernels->widen<T>()(all.data() + 1, out.data(), static_cast<int64_t>(all.size()) - 4);
    bool ok = true;
    for (size_t i = 0; i + 4 < all.size(); ++i) ok = ok && SameBits(out[i], ToFloat(all[i + 1]));
    Expect(ok, std::string(kernels->isa) + " " + TypeName<T>() + ": widen differs from the scalar conversion");
  }
}

void TestConversions() {
  // Every float16 and bfloat16 bit pattern survives float32 and back; float32 -> 16-bit rounds to nearest-even.
  bool ok = true;
  for (uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    const Float16 h{static_cast<uint16_t>(bits)};
    const float f = ToFloat(h);
    if (!std::isnan(f)) ok = ok && FromFloat<Float16>(f).bits == h.bits;
    const BFloat16 b{static_cast<uint16_t>(bits)};
    const float g = ToFloat(b);
    if (!std::isnan(g)) ok = ok && FromFloat<BFloat16>(g).bits == b.bits;
  }
  Expect(ok, "16-bit round trips");
  Expect(FromFloat<Float16>(65519.0f).bits == 0x7BFF && FromFloat<Float16>(65520.0f).bits == 0x7C00, "float16 overflow");
  Expect(FromFloat<Float16>(1.0f + std::ldexp(1.0f, -11)).bits == 0x3C00, "float16 tie to even (down)");
  Expect(FromFloat<Float16>(1.0f + 3 * std::ldexp(1.0f, -11)).bits == 0x3C02, "float16 tie to even (up)");
  Expect(FromFloat<Float16>(std::ldexp(1.0f, -25)).bits == 0x0000, "float16 subnormal tie to zero");
  Expect(FromFloat<Float16>(std::ldexp(3.0f, -26)).bits == 0x0001, "float16 subnormal rounds up");
  Expect(FromFloat<BFloat16>(1.0f + std::ldexp(1.0f, -8)).bits == 0x3F80, "bfloat16 tie to even");
  Expect(std::isnan(ToFloat(FromFloat<BFloat16>(std::numeric_limits<float>::quiet_NaN()))), "bfloat16 NaN");
  Expect(std::isnan(ToFloat(FromFloat<Float16>(std::numeric_limits<float>::quiet_NaN()))), "float16 NaN");
}

void TestGeometry() {
  NormGeometry g;
  Expect(ResolveGeometry(Shape{2, 3, 4}, -2, &g).empty() && g.rows == 2 && g.cols == 12 && g.axis == 1, "axis -2");
  Expect(!ResolveGeometry(Shape{2, 3, 4}, 3, &g).empty(), "axis 3 out of range");
  Expect(!ResolveGeometry(Shape{2, 3, 4}, -4, &g).empty(), "axis -4 out of range");
  ResolveGeometry(Shape{2, 3, 4}, -2, &g);
  ScaleLayout layout;
  Expect(CheckScaleShape(Shape{3, 4}, Shape{2, 3, 4}, g, &layout).empty() && layout == ScaleLayout::kPerElement, "[3,4]");
  Expect(CheckScaleShape(Shape{1, 1, 3, 4}, Shape{2, 3, 4}, g, &layout).size() > 0, "scale rank above X rank");
  Expect(CheckScaleShape(Shape{1, 3, 4}, Shape{2, 3, 4}, g, &layout).empty() && layout == ScaleLayout::kPerElement, "[1,3,4]");
  Expect(CheckScaleShape(Shape{4}, Shape{2, 3, 4}, g, &layout).empty() && layout == ScaleLayout::kBroadcast, "[4]");
  Expect(CheckScaleShape(Shape{3, 1}, Shape{2, 3, 4}, g, &layout).empty() && layout == ScaleLayout::kBroadcast, "[3,1]");
  Expect(!CheckScaleShape(Shape{2, 3, 4}, Shape{2, 3, 4}, g, &layout).empty(), "scale varying along rows");
  Expect(!CheckScaleShape(Shape{5}, Shape{2, 3, 4}, g, &layout).empty(), "scale [5]");
  std::vector<float> out(12);
  ScaleBroadcast broadcast;
  const float column[3] = {1, 2, 3};
  Expect(MakeScaleBroadcast(Shape{3, 1}, g.Normalized(Shape{2, 3, 4}), &broadcast), "broadcast [3,1]");
  ExpandScale(column, broadcast, g.cols, out.data());
  Expect(out[0] == 1 && out[3] == 1 && out[4] == 2 && out[11] == 3, "expand [3,1] over [3,4]");
  const float row[4] = {5, 6, 7, 8};
  Expect(MakeScaleBroadcast(Shape{4}, g.Normalized(Shape{2, 3, 4}), &broadcast) && broadcast.rank == 2, "broadcast [4]");
  ExpandScale(row, broadcast, g.cols, out.data());
  Expect(out[0] == 5 && out[3] == 8 && out[4] == 5 && out[11] == 8, "expand [4] over [3,4]");
  // Alternating broadcast dims beyond kMaxScaleDims are refused rather than mis-indexed.
  Shape normalized(2 * kMaxScaleDims + 2, 2), alternating(2 * kMaxScaleDims + 2);
  for (size_t i = 0; i < alternating.size(); ++i) alternating[i] = i % 2 ? 2 : 1;
  Expect(!MakeScaleBroadcast(alternating, normalized, &broadcast), "too many alternating dims");
  Expect(MakeScaleBroadcast(Shape{1, 1, 4}, Shape{2, 3, 4}, &broadcast) && broadcast.rank == 2, "merged leading repeats");
}

// The prefetch order (prefetch_order.h) only moves time, never results, so its own properties are checked here: each
// step of a row prefetched exactly once and inside the row, rows of 16 KB or more in parts of at least 8 KB taken
// side by side, shorter rows in order.
void TestPrefetchOrder() {
  for (int64_t row_bytes : {int64_t{64}, int64_t{8192}, int64_t{16383}, int64_t{16384}, int64_t{20480},
                            int64_t{32768}, int64_t{65536}, int64_t{65536 + 192}, int64_t{1} << 22}) {
    for (int64_t step_bytes : {128, 256, 512}) {
      const int64_t steps = row_bytes / step_bytes;
      const PrefetchOrder order = PrefetchOrder::Of(row_bytes, steps);
      const std::string what = "prefetch order of " + std::to_string(row_bytes) + " bytes in steps of " +
                               std::to_string(step_bytes);
      std::vector<int> seen(static_cast<size_t>(steps), 0);
      bool inside = true;
      for (int64_t s = 0; s < steps; ++s) {
        const int64_t at = order.StepAt(s);
        inside = inside && at >= 0 && at < steps;
        if (inside) ++seen[static_cast<size_t>(at)];
      }
      bool once = inside;
      for (int count : seen) once = once && count == 1;
      Expect(once, what + ": not every step prefetched exactly once inside the row");
      const int64_t parts = int64_t{1} << order.parts_log2;
      const int64_t expected_parts = row_bytes >= 4 * PrefetchOrder::kMinPartBytes   ? 4
                                     : row_bytes >= 2 * PrefetchOrder::kMinPartBytes ? 2
                                                                                     : 1;
      Expect(parts == expected_parts, what + ": " + std::to_string(parts) + " parts");
      if (parts > 1 && order.part_steps > 0) {
        Expect(order.StepAt(1) == order.part_steps, what + ": the second step is not the second part's first");
      } else {
        bool in_order = true;
        for (int64_t s = 0; s < steps; ++s) in_order = in_order && order.StepAt(s) == s;
        Expect(in_order, what + ": a row of one part is not prefetched in order");
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const std::vector<const CpuKernels*> isas = AvailableIsas();

  TestConversions();
  TestWiden<Float16>(isas);
  TestWiden<BFloat16>(isas);
  TestGeometry();
  TestPrefetchOrder();
  RunMatrix<float>(isas, quick);
  RunMatrix<Float16>(isas, quick);
  RunMatrix<BFloat16>(isas, quick);
  TestSquarePairs(isas);
  RunExtremes<float>(isas);
  RunExtremes<Float16>(isas);
  RunExtremes<BFloat16>(isas);
  TestFloat32SumMatters<float>(isas);
  TestFloat32SumMatters<Float16>(isas);
  TestFloat32SumMatters<BFloat16>(isas);
  RunInPlace<float>(isas);
  RunInPlace<Float16>(isas);
  RunInPlace<BFloat16>(isas);
  TestScaleCheck<float>(isas);
  TestScaleCheck<Float16>(isas);
  TestScaleCheck<BFloat16>(isas);

  return Summary();
}
