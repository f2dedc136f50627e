// Robustness tests of the CPU kernels, without onnxruntime, for every instruction set this CPU runs:
//
//   random      random N-d shapes (empty and length-1 dims included), axes, scale shapes (valid ones broadcast
//               through the same shape rules the onnxruntime glue uses; invalid ones must be rejected), epsilons
//               and their placement, magnitudes across each type's range, RMSNorm and SkipRMSNorm with and without
//               the sum output, NaN/Inf at random places; checked against a float64 reference computed on the N-d
//               tensor (its own index arithmetic, not the kernels' 2-D view)
//   narrowing   y = round_T(scale) (rows of ones, epsilon 0) for every 16-bit value, every midpoint between
//               neighbours and the float32 values on either side of it, beyond the largest finite value, NaNs:
//               bit-exact versus the scalar round-to-nearest-even conversion, with ordinary and streaming stores
//   widening    SkipRMSNorm's sum = round_T(x + skip) for every 16-bit x, with skip = 0 (exact widening) and with
//               random skips: bit-exact versus the scalar conversions; with --all-float16-sums, every float16
//               pair (x, skip), 2^32 sums, the same bits from every vector instruction set
//   limits      rows of 1M elements (4096 with --quick) and rows of length 1 with values near the largest and the
//               smallest (subnormal) values of each type: the result must be the representable one, never inf/0
//   threads     many threads normalizing disjoint row ranges of one batch: bit-identical to one thread
//
//   kernel_robustness_tests [--quick] [--cases N] [--seed S] [--all-float16-sums]
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernel_test_support.h"
#include "norm_geometry.h"

using namespace ort_rmsnorm;

namespace {

struct Options {
  bool quick = false;
  bool all_float16_sums = false;
  int cases = -1;  // random shapes per element type: 3000, or 600 with --quick
  uint32_t seed = 20240611;
};

// ---- random cases ------------------------------------------------------------------------------------------

struct RandomCase {
  Shape x_shape;
  int64_t axis = -1;
  bool has_scale = false;
  Shape scale_shape;
  float epsilon = 1e-5f;
  bool eps_outside_sqrt = false;
  bool skip = false;
  bool sum_output = false;
  bool bias = false;         // SkipRMSNorm: a bias row (one value per element of the normalized dims)
  bool float32_sum = false;  // SkipRMSNorm: normalize_float32_sum
  double magnitude = 1.0;
  int specials = 0;  // NaN/Inf values planted in X
};

std::string Describe(const RandomCase& c) {
  char text[200];
  std::snprintf(text, sizeof text,
                " axis=%lld eps=%g outside=%d skip=%d sum=%d bias=%d float32_sum=%d magnitude=%g specials=%d",
                static_cast<long long>(c.axis), c.epsilon, c.eps_outside_sqrt, c.skip, c.sum_output, c.bias,
                c.float32_sum, c.magnitude, c.specials);
  return "X" + ShapeToString(c.x_shape) + (c.has_scale ? " scale" + ShapeToString(c.scale_shape) : " no-scale") +
         text;
}

// "" when every y is within tolerance of the float64 reference, else ": y[k]=... reference=..." for the first k.
template <typename T>
std::string FirstMismatch(const std::vector<T>& y, const std::vector<double>& reference) {
  for (size_t k = 0; k < y.size(); ++k) {
    if (WithinTolerance<T>(ToFloat(y[k]), reference[k])) continue;
    char text[96];
    std::snprintf(text, sizeof text, ": y[%zu]=%.9g reference=%.9g", k, ToFloat(y[k]), reference[k]);
    return text;
  }
  return "";
}

int64_t ElementCount(const Shape& shape) {
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  return count;
}

template <typename T>
RandomCase MakeRandomCase(std::mt19937& rng) {
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto chance = [&](double p) { return std::bernoulli_distribution(p)(rng); };
  RandomCase c;
  const int rank = uniform(1, 4);
  for (int i = 0; i < rank; ++i) {
    int64_t dim = chance(0.2) ? 1 : uniform(1, 9);
    if (chance(0.08)) dim = uniform(10, 700);  // long rows: full vectors, partial tails, several sum blocks
    if (chance(0.02)) dim = 0;                 // empty tensors
    c.x_shape.push_back(dim);
  }
  while (ElementCount(c.x_shape) > 40000) {
    auto largest = std::max_element(c.x_shape.begin(), c.x_shape.end());
    *largest = (*largest + 1) / 2;
  }
  c.axis = uniform(-rank, rank - 1);
  const size_t normalized_rank = static_cast<size_t>(c.axis < 0 ? -c.axis : rank - c.axis);
  c.has_scale = chance(0.75);
  if (c.has_scale) {
    // Right-aligned: each normalized dim kept or 1; sometimes fewer dims, sometimes extra leading 1s.
    const size_t scale_rank = static_cast<size_t>(uniform(1, rank));
    for (size_t k = scale_rank; k >= 1; --k) {  // k-th dim from the right
      const int64_t target = k <= normalized_rank ? c.x_shape[static_cast<size_t>(rank) - k] : 1;
      c.scale_shape.push_back(chance(0.25) ? 1 : target);
    }
  }
  const int epsilon_kind = uniform(0, 3);
  c.epsilon = epsilon_kind == 0 ? 0.0f : static_cast<float>(std::pow(10.0, -uniform(1, 12)));
  c.eps_outside_sqrt = chance(0.3);
  c.skip = chance(0.4);
  c.sum_output = c.skip && chance(0.6);
  c.bias = c.skip && chance(0.4);
  c.float32_sum = c.skip && chance(0.5);
  // log-uniform over most of the range of T (float16: 1e-7 .. 1e4; bfloat16/float32: 1e-40 .. 1e36).
  const double lo = std::is_same_v<T, Float16> ? -7 : -40, hi = std::is_same_v<T, Float16> ? 4 : 36;
  c.magnitude = std::pow(10.0, std::uniform_real_distribution<double>(lo, hi)(rng));
  c.specials = chance(0.1) ? uniform(1, 3) : 0;
  return c;
}

// A scale shape that violates the rules in one place: a dim that is neither the normalized dim nor 1, a leading
// dim beyond the normalized ones that is not 1, or one dim more than X has.
Shape MakeInvalidScaleShape(const RandomCase& c, std::mt19937& rng) {
  const size_t rank = c.x_shape.size();
  const size_t normalized_rank = rank - static_cast<size_t>(c.axis < 0 ? c.axis + static_cast<int64_t>(rank) : c.axis);
  const int kind = std::uniform_int_distribution<int>(0, 2)(rng);
  if (kind == 0 || (kind == 1 && normalized_rank == rank)) {  // bad normalized dim
    Shape shape(c.x_shape.end() - static_cast<std::ptrdiff_t>(normalized_rank), c.x_shape.end());
    const size_t k = std::uniform_int_distribution<size_t>(0, normalized_rank - 1)(rng);
    shape[k] = shape[k] + 1 == 1 ? 2 : shape[k] + 1;
    return shape;
  }
  if (kind == 1) {  // a non-1 dim over a row dim
    Shape shape(c.x_shape.end() - static_cast<std::ptrdiff_t>(normalized_rank + 1), c.x_shape.end());
    shape[0] = 2;
    return shape;
  }
  return Shape(rank + 1, 1);  // rank above X's
}

// float64 reference on the N-d tensor (NormReference): per row (the leading dims), mean of squares over the
// normalized dims; the scale index of each element from its own multi-index and the right-aligned scale shape.
template <typename T>
std::vector<double> NdReference(const RandomCase& c, const std::vector<T>& h, const std::vector<float>& scale) {
  // h: the normalized values (x, round_T(s), or the float32 sum s itself)
  const size_t rank = c.x_shape.size();
  const size_t axis = static_cast<size_t>(c.axis < 0 ? c.axis + static_cast<int64_t>(rank) : c.axis);
  int64_t row_size = 1;
  for (size_t d = axis; d < rank; ++d) row_size *= c.x_shape[d];
  const auto gain = [&](int64_t i) {
    if (!c.has_scale) return 1.0;
    // Digits of i in the normalized dims, last dim first, matched to the scale's dims from the right.
    int64_t rest = i, scale_index = 0, scale_stride = 1;
    for (size_t k = 1; k <= c.scale_shape.size(); ++k) {
      const int64_t digit = k <= rank - axis ? rest % c.x_shape[rank - k] : 0;
      if (k <= rank - axis) rest /= c.x_shape[rank - k];
      const int64_t scale_dim = c.scale_shape[c.scale_shape.size() - k];
      if (scale_dim != 1) scale_index += digit * scale_stride;
      scale_stride *= scale_dim;
    }
    return static_cast<double>(scale[static_cast<size_t>(scale_index)]);
  };
  return NormReference(h, row_size, c.epsilon, c.eps_outside_sqrt, gain);
}

template <typename T>
std::vector<T> RandomTensor(std::mt19937& rng, size_t n, double magnitude) {
  std::normal_distribution<double> normal(0.3 * magnitude, magnitude);  // non-zero mean: nothing may center it
  std::vector<T> values(n);
  for (auto& v : values) v = FromFloat<T>(static_cast<float>(normal(rng)));
  return values;
}

template <typename T>
void RunRandomCases(const std::vector<const CpuKernels*>& isas, const Options& options, std::mt19937& rng) {
  int tried = 0, rejected = 0, failed = 0;
  for (int n = 0; n < options.cases; ++n) {
    const RandomCase c = MakeRandomCase<T>(rng);
    NormGeometry geometry;
    if (!ResolveGeometry(c.x_shape, c.axis, &geometry).empty()) {
      Expect(false, "valid axis rejected: " + Describe(c));
      continue;
    }
    ScaleLayout layout = ScaleLayout::kPerElement;
    if (c.has_scale && !CheckScaleShape(c.scale_shape, c.x_shape, geometry, &layout).empty()) {
      Expect(false, "valid scale rejected: " + Describe(c));
      continue;
    }
    const Shape invalid = MakeInvalidScaleShape(c, rng);
    ScaleLayout unused;
    const std::string error = CheckScaleShape(invalid, c.x_shape, geometry, &unused);
    Expect(!error.empty() && error.find(ShapeToString(invalid)) != std::string::npos &&
               error.find(ShapeToString(c.x_shape)) != std::string::npos,
           "invalid scale " + ShapeToString(invalid) + " not rejected with both shapes named: " + Describe(c));
    ++rejected;

    const size_t count = static_cast<size_t>(ElementCount(c.x_shape));
    std::vector<T> x = RandomTensor<T>(rng, count, c.magnitude);
    const std::vector<T> skip = RandomTensor<T>(rng, count, c.magnitude);
    const float specials[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity()};
    for (int s = 0; s < c.specials && count > 0; ++s) {
      x[std::uniform_int_distribution<size_t>(0, count - 1)(rng)] = FromFloat<T>(specials[s % 3]);
    }
    std::vector<float> scale(static_cast<size_t>(c.has_scale ? ElementCount(c.scale_shape) : 0));
    for (auto& g : scale) g = std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng);
    // What the glue hands the kernels: the scale itself when it is laid out per element, else its broadcast.
    std::vector<float> expanded;
    const float* row_scale = nullptr;
    if (c.has_scale) {
      if (layout == ScaleLayout::kPerElement) {
        row_scale = scale.data();
      } else {
        ScaleBroadcast broadcast;
        if (!MakeScaleBroadcast(c.scale_shape, geometry.Normalized(c.x_shape), &broadcast)) {
          Expect(false, "no broadcast for a scale of at most 4 dims: " + Describe(c));
          continue;
        }
        expanded.resize(static_cast<size_t>(geometry.cols));
        ExpandScale(scale.data(), broadcast, geometry.cols, expanded.data());
        row_scale = expanded.data();
      }
    }

    // SkipRMSNorm: s = (x + skip) + bias in float32, sum = round_T(s); normalized: round_T(s), or s.
    std::vector<float> bias;
    if (c.bias) {
      for (const T& b : RandomTensor<T>(rng, static_cast<size_t>(geometry.cols), c.magnitude)) {
        bias.push_back(ToFloat(b));
      }
    }
    std::vector<T> h = x;
    std::vector<float> s;
    if (c.skip) SkipSum(x, skip, bias, geometry.cols, &s, &h);
    const std::vector<double> reference =
        c.skip && c.float32_sum ? NdReference(c, s, scale) : NdReference(c, h, scale);

    for (const CpuKernels* kernels : isas) {
      std::vector<T> y(count), sum(count);
      RowBatch<T> batch;
      batch.x = x.data();
      batch.skip = c.skip ? skip.data() : nullptr;
      batch.sum = c.sum_output ? sum.data() : nullptr;
      batch.bias = c.bias ? bias.data() : nullptr;
      batch.normalize_float32_sum = c.float32_sum;
      batch.y = y.data();
      batch.scale = row_scale;
      batch.cols = geometry.cols;
      batch.epsilon = c.epsilon;
      batch.eps_outside_sqrt = c.eps_outside_sqrt;
      Normalize<T>(*kernels, batch, 0, geometry.rows);
      ++tried;
      const std::string mismatch = FirstMismatch(y, reference);
      bool sum_ok = true;
      for (size_t k = 0; c.sum_output && k < count; ++k) sum_ok = sum_ok && SameBits(ToFloat(sum[k]), ToFloat(h[k]));
      if (!mismatch.empty() || !sum_ok) ++failed;
      const std::string name = std::string(kernels->isa) + " " + TypeName<T>() + " " + Describe(c);
      Expect(mismatch.empty(), name + mismatch);
      Expect(sum_ok, name + ": sum output differs from round_T(x + skip)");
    }
  }
  std::printf("random %s: %d kernel runs (%d shapes x %zu instruction sets), %d invalid scale shapes rejected, "
              "%d failed\n", TypeName<T>(), tried, options.cases, isas.size(), rejected, failed);
}

// ---- exact conversions through the kernels -----------------------------------------------------------------

// float32 values probing the rounding to T: every 16-bit value, the midpoints between neighbours and their float32
// neighbours, values beyond the largest finite one, float32 subnormals, NaNs with payloads.
template <typename T>
std::vector<float> NarrowingProbes() {
  std::vector<float> probes;
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const float v = ToFloat(T{static_cast<uint16_t>(bits)});
    if (std::isnan(v)) continue;
    probes.push_back(v);
    const uint32_t next_bits = bits + 1;
    if ((next_bits & 0x7FFF) == 0) continue;  // crossed into the other sign
    const float next = ToFloat(T{static_cast<uint16_t>(next_bits)});
    if (std::isnan(next) || std::isinf(next)) continue;
    const float midpoint = static_cast<float>((static_cast<double>(v) + next) / 2);  // exact in float32
    probes.push_back(midpoint);
    probes.push_back(std::nextafter(midpoint, 0.0f));
    probes.push_back(std::nextafter(midpoint, 2 * midpoint));
  }
  const float largest = static_cast<float>(LargestFinite<T>());
  for (float sign : {1.0f, -1.0f}) {
    for (float v : {largest, std::nextafter(largest, FLT_MAX), largest * 1.0009765625f, largest * 2, FLT_MAX,
                    std::numeric_limits<float>::infinity(), FLT_MIN, std::nextafter(FLT_MIN, 0.0f),
                    std::numeric_limits<float>::denorm_min(), 3 * std::numeric_limits<float>::denorm_min()}) {
      probes.push_back(sign * v);
    }
  }
  for (uint32_t nan_bits : {0x7FC00000u, 0x7F800001u, 0x7FBFFFFFu, 0xFFC00001u, 0xFFFFFFFFu, 0x7F80FFFFu}) {
    probes.push_back(BitsToFloat(nan_bits));
  }
  return probes;
}

template <typename T>
void RunExactConversions(const std::vector<const CpuKernels*>& isas, std::mt19937& rng) {
  // Padded with ones to whole cache lines, so that the row can also be written with streaming stores (which
  // narrow two vectors at a time on AVX-512).
  std::vector<float> probes = NarrowingProbes<T>();
  probes.resize((probes.size() + 31) / 32 * 32, 1.0f);
  const auto cols = static_cast<int64_t>(probes.size());
  // Rows of ones with epsilon 0: the factor is exactly 1, so y = round_T(1 * 1 * scale) = round_T(scale).
  const std::vector<T> ones(probes.size(), FromFloat<T>(1.0f));
  // Every 16-bit pattern as X; skip = 0 (sum = X widened and narrowed back) and random 16-bit patterns.
  std::vector<T> patterns(0x10000), zeros(0x10000, FromFloat<T>(0.0f)), random_skip(0x10000);
  for (uint32_t bits = 0; bits < 0x10000; ++bits) patterns[bits] = T{static_cast<uint16_t>(bits)};
  for (auto& s : random_skip) s = T{static_cast<uint16_t>(rng() & 0xFFFF)};

  for (const CpuKernels* kernels : isas) {
    const std::string name = std::string(kernels->isa) + " " + TypeName<T>();
    for (bool streaming : {false, true}) {
      AlignedBuffer<T> y(probes.size());
      RowBatch<T> batch;
      batch.x = ones.data();
      batch.y = y.data();
      batch.scale = probes.data();
      batch.cols = cols;
      batch.epsilon = 0.0f;
      batch.streaming_stores = streaming;
      Normalize<T>(*kernels, batch, 0, 1);
      size_t mismatches = 0, first = 0;
      for (size_t k = 0; k < probes.size(); ++k) {
        const T want = FromFloat<T>(probes[k]);
        const bool ok = std::isnan(probes[k]) ? std::isnan(ToFloat(y[k])) : y[k].bits == want.bits;
        if (!ok && mismatches++ == 0) first = k;
      }
      char detail[128] = "";
      if (mismatches) {
        std::snprintf(detail, sizeof detail, ": %zu of %zu differ, first %a -> 0x%04x (want 0x%04x)", mismatches,
                      probes.size(), probes[first], y[first].bits, FromFloat<T>(probes[first]).bits);
      }
      Expect(mismatches == 0, name + (streaming ? " streaming" : "") + " narrowing of " +
                                  std::to_string(probes.size()) + " probes" + detail);
    }

    for (const std::vector<T>* skip : {&zeros, &random_skip}) {
      std::vector<T> sum(patterns.size()), out(patterns.size());
      RowBatch<T> add;
      add.x = patterns.data();
      add.skip = skip->data();
      add.sum = sum.data();
      add.y = out.data();
      add.cols = 256;  // 256 rows of 256
      Normalize<T>(*kernels, add, 0, 256);
      size_t wrong = 0;
      for (size_t k = 0; k < patterns.size(); ++k) {
        wrong += !SameBits(ToFloat(sum[k]), ToFloat(FromFloat<T>(ToFloat(patterns[k]) + ToFloat((*skip)[k]))));
      }
      Expect(wrong == 0, name + " sum = round_T(x + skip) for every x, skip " +
                             (skip == &zeros ? "0" : "random") + ": " + std::to_string(wrong) + " wrong");
    }
  }
}

// Every pair of float16 bit patterns as (x, skip), 2^32 sums: each vector ISA's sum output has the bits of the first
// vector ISA's (float32 add, F16C rounding; checked against the scalar conversions above), whichever way it adds
// (the avx512fp16 kernels add in float16). Finite and non-finite skips go in separate rows, so that fewer rows take
// the double path (a NaN or inf sends its whole row there). About a minute of CPU time: only with --all-float16-sums.
void RunAllFloat16Sums(const std::vector<const CpuKernels*>& isas) {
  std::vector<const CpuKernels*> vector_isas;
  for (const CpuKernels* kernels : isas) {
    if (std::strcmp(kernels->isa, "scalar") != 0) vector_isas.push_back(kernels);
  }
  if (vector_isas.size() < 2) return;
  std::vector<Float16> finite, special;
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const Float16 v{static_cast<uint16_t>(bits)};
    ((v.bits & 0x7C00) == 0x7C00 ? special : finite).push_back(v);
  }
  constexpr int64_t kRows = 64;  // row r of a chunk: x = pattern (chunk + r), skip = each pattern of the group
  const unsigned workers = std::clamp(std::thread::hardware_concurrency(), 1u, 8u);  // 60 MB of buffers each
  std::vector<std::vector<size_t>> wrong(workers, std::vector<size_t>(vector_isas.size(), 0));
  const auto work = [&](unsigned worker) {
    const auto is_nan = [](Float16 v) { return (v.bits & 0x7C00) == 0x7C00 && (v.bits & 0x03FF) != 0; };
    for (const std::vector<Float16>* skips : {&finite, &special}) {
      const auto cols = static_cast<int64_t>(skips->size());
      std::vector<Float16> x(kRows * cols), skip(kRows * cols), y(kRows * cols);
      const std::vector<float> ones(static_cast<size_t>(cols), 1.0f);
      std::vector<std::vector<Float16>> sums(vector_isas.size(), std::vector<Float16>(kRows * cols));
      for (int64_t k = 0; k < kRows * cols; ++k) skip[k] = (*skips)[k % cols];
      for (int64_t chunk = kRows * worker; chunk < 0x10000; chunk += kRows * workers) {
        for (int64_t r = 0; r < kRows; ++r) {
          std::fill(x.begin() + r * cols, x.begin() + (r + 1) * cols, Float16{static_cast<uint16_t>(chunk + r)});
        }
        for (size_t i = 0; i < vector_isas.size(); ++i) {
          RowBatch<Float16> batch;
          batch.x = x.data();
          batch.skip = skip.data();
          batch.sum = sums[i].data();
          batch.y = y.data();
          batch.scale = ones.data();
          batch.cols = cols;
          Normalize<Float16>(*vector_isas[i], batch, 0, kRows);
          if (i == 0 || std::memcmp(sums[i].data(), sums[0].data(), sums[0].size() * sizeof(Float16)) == 0) continue;
          for (int64_t k = 0; k < kRows * cols; ++k) {
            const Float16 a = sums[i][k], b = sums[0][k];
            wrong[worker][i] += a.bits != b.bits && !(is_nan(a) && is_nan(b));  // NaN + NaN: either payload
          }
        }
      }
    }
  };
  std::vector<std::thread> threads;
  for (unsigned worker = 0; worker < workers; ++worker) threads.emplace_back(work, worker);
  for (std::thread& thread : threads) thread.join();
  for (size_t i = 1; i < vector_isas.size(); ++i) {
    size_t differ = 0;
    for (const auto& counts : wrong) differ += counts[i];
    Expect(differ == 0, std::string(vector_isas[i]->isa) + " float16 sum for all 2^32 (x, skip) pairs: " +
                            std::to_string(differ) + " differ from " + vector_isas[0]->isa);
  }
  std::printf("float16 sums of all 2^32 (x, skip) pairs: %zu instruction sets against %s\n",
              vector_isas.size() - 1, vector_isas[0]->isa);
}

// ---- limits: huge rows, rows of length 1 ---------------------------------------------------------------------

template <typename T>
void CheckAgainstRowReference(const CpuKernels& kernels, const std::vector<T>& x, int64_t cols, float epsilon,
                              const std::string& what) {
  RandomCase c;
  c.x_shape = {static_cast<int64_t>(x.size()) / cols, cols};
  c.epsilon = epsilon;
  c.has_scale = true;
  c.scale_shape = {cols};
  std::vector<float> scale(static_cast<size_t>(cols));
  for (size_t i = 0; i < scale.size(); ++i) scale[i] = i % 3 == 0 ? -1.5f : 0.75f;
  const std::vector<double> reference = NdReference(c, x, scale);
  std::vector<T> y(x.size());
  RowBatch<T> batch;
  batch.x = x.data();
  batch.y = y.data();
  batch.scale = scale.data();
  batch.cols = cols;
  batch.epsilon = epsilon;
  Normalize<T>(kernels, batch, 0, c.x_shape[0]);
  // Within tolerance also means finite wherever the float64 result is: no inf from an overflowed float32
  // statistic, no 0 or NaN from an underflowed one.
  const std::string mismatch = FirstMismatch(y, reference);
  Expect(mismatch.empty(), std::string(kernels.isa) + " " + TypeName<T>() + " " + what + mismatch);
}

template <typename T>
void RunLimits(const std::vector<const CpuKernels*>& isas, const Options& options, std::mt19937& rng) {
  const int64_t huge = options.quick ? 4096 : int64_t{1} << 20;
  const double largest = LargestFinite<T>(), smallest = SmallestSubnormal<T>();
  std::uniform_real_distribution<double> fraction(0.5, 1.0);
  // Magnitudes near the top of the range, near the smallest normal, and subnormal; both signs.
  const double ranges[][2] = {{largest / 2, largest}, {smallest * 2, smallest * 1e3}, {1e-3, 1e3}};
  int checked = 0;
  for (const auto& range : ranges) {
    std::vector<T> row(static_cast<size_t>(huge));
    for (size_t i = 0; i < row.size(); ++i) {
      const double v = range[0] + (range[1] - range[0]) * fraction(rng);
      row[i] = FromFloat<T>(static_cast<float>(i % 2 ? v : -v));
    }
    for (float epsilon : {0.0f, 1e-6f}) {
      char what[96];
      std::snprintf(what, sizeof what, "row of %lld in [%g, %g] eps=%g", static_cast<long long>(huge), range[0],
                    range[1], epsilon);
      for (const CpuKernels* kernels : isas) {
        CheckAgainstRowReference(*kernels, row, huge, epsilon, what);
        ++checked;
      }
    }
    // The same values as 4096 rows of length 1: y = x / sqrt(x^2 + eps) * scale.
    const std::vector<T> column(row.begin(), row.begin() + 4096);
    for (float epsilon : {0.0f, 1e-6f}) {
      char what[96];
      std::snprintf(what, sizeof what, "rows of length 1 in [%g, %g] eps=%g", range[0], range[1], epsilon);
      for (const CpuKernels* kernels : isas) {
        CheckAgainstRowReference(*kernels, column, 1, epsilon, what);
        ++checked;
      }
    }
  }
  std::printf("limits %s: %d runs (rows of %lld and of 1 near the largest, smallest and subnormal values)\n",
              TypeName<T>(), checked, static_cast<long long>(huge));
}

// ---- threads -------------------------------------------------------------------------------------------------

template <typename T>
void RunThreads(const std::vector<const CpuKernels*>& isas, std::mt19937& rng) {
  constexpr int64_t kRows = 96, kCols = 1000;
  constexpr int kThreads = 8;
  const std::vector<T> x = RandomTensor<T>(rng, kRows * kCols, 2.0), skip = RandomTensor<T>(rng, kRows * kCols, 2.0);
  std::vector<float> scale(kCols);
  for (auto& g : scale) g = std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng);
  for (const CpuKernels* kernels : isas) {
    auto make_batch = [&](std::vector<T>& y, std::vector<T>& sum) {
      RowBatch<T> batch;
      batch.x = x.data();
      batch.skip = skip.data();
      batch.sum = sum.data();
      batch.y = y.data();
      batch.scale = scale.data();
      batch.cols = kCols;
      return batch;
    };
    std::vector<T> y1(x.size()), sum1(x.size()), yn(x.size()), sumn(x.size());
    Normalize<T>(*kernels, make_batch(y1, sum1), 0, kRows);
    const RowBatch<T> shared = make_batch(yn, sumn);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {  // interleaved single rows: neighbouring threads write neighbouring rows
        for (int repeat = 0; repeat < 3; ++repeat) {
          for (int64_t r = t; r < kRows; r += kThreads) Normalize<T>(*kernels, shared, r, r + 1);
        }
      });
    }
    for (auto& thread : threads) thread.join();
    const bool same = std::memcmp(y1.data(), yn.data(), y1.size() * sizeof(T)) == 0 &&
                      std::memcmp(sum1.data(), sumn.data(), sum1.size() * sizeof(T)) == 0;
    Expect(same, std::string(kernels->isa) + " " + TypeName<T>() + ": " + std::to_string(kThreads) +
                     " threads differ from one");
  }
}

template <typename T>
void RunAll(const std::vector<const CpuKernels*>& isas, const Options& options) {
  std::mt19937 rng(options.seed);
  RunRandomCases<T>(isas, options, rng);
  if constexpr (!std::is_same_v<T, float>) RunExactConversions<T>(isas, rng);
  if constexpr (std::is_same_v<T, Float16>) {
    if (options.all_float16_sums) RunAllFloat16Sums(isas);
  }
  RunLimits<T>(isas, options, rng);
  RunThreads<T>(isas, rng);
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      options.quick = true;
    } else if (std::strcmp(argv[i], "--all-float16-sums") == 0) {
      options.all_float16_sums = true;
    } else if (std::strcmp(argv[i], "--cases") == 0 && i + 1 < argc) {
      options.cases = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--seed") == 0 && i + 1 < argc) {
      options.seed = static_cast<uint32_t>(std::strtoul(argv[++i], nullptr, 10));
    } else {
      std::fprintf(stderr, "usage: %s [--quick] [--cases N] [--seed S] [--all-float16-sums]\n", argv[0]);
      return 2;
    }
  }
  if (options.cases < 0) options.cases = options.quick ? 600 : 3000;
  std::printf("seed %u\n", options.seed);
  const std::vector<const CpuKernels*> isas = AvailableIsas();
  RunAll<float>(isas, options);
  RunAll<Float16>(isas, options);
  RunAll<BFloat16>(isas, options);
  return Summary();
}
