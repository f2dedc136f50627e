// The numerics of the standalone CUDA check (gpu_check.h): every type pair, row length (odd sizes, scalar fallback,
// two-pass), both epsilon placements, epsilon 0, SkipRMSNorm with and without `sum`, in place, misaligned pointers,
// scale layouts (none, per element, one value, broadcast), rows whose statistic needs float64, NaN/inf, against a
// float64 reference computed on the host; the coverage of the kernel variants; CUDA graph capture.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "contract_checks.h"
#include "gpu_check.h"
#include "scalar_convert.h"  // the CPU kernels' conversions: the reference does not use CUDA's

namespace gpu_check {

// ---- element types ------------------------------------------------------------------------------------------

// The element types as the launchers name them; names, tolerances and random inputs come from contract_checks.h.
template <typename T>
struct TypeOf;
template <>
struct TypeOf<float> {
  static constexpr ElementType kType = ElementType::kFloat32;
};
template <>
struct TypeOf<Float16> {
  static constexpr ElementType kType = ElementType::kFloat16;
};
template <>
struct TypeOf<BFloat16> {
  static constexpr ElementType kType = ElementType::kBFloat16;
};

// ---- cases and the float64 reference -----------------------------------------------------------------------------

enum class ScaleKind { kNone, kPerElement, kSingle, kBroadcast };

const char* ScaleKindName(ScaleKind kind) {
  switch (kind) {
    case ScaleKind::kNone: return "none";
    case ScaleKind::kPerElement: return "per-element";
    case ScaleKind::kSingle: return "single";
    case ScaleKind::kBroadcast: return "broadcast";
  }
  return "?";
}

struct Case {
  int64_t rows = 1;
  int64_t cols = 1;
  bool skip = false;
  bool sum_output = false;
  ScaleKind scale = ScaleKind::kPerElement;
  Shape normalized;   // kBroadcast: the normalized dims (product = cols)
  Shape scale_shape;  // kBroadcast: the scale's shape
  float epsilon = 1e-5f;
  bool eps_outside_sqrt = false;
  bool misaligned = false;  // x, skip, y, sum start one element past a 16-byte boundary
  bool in_place = false;    // y over x, sum over skip
  bool bias = false;        // SkipRMSNorm: a float32 bias per column (values of T)
  bool float32_sum = false; // SkipRMSNorm: normalize_float32_sum
  int other_plan = -1;      // >= 0: launched with AlternativePlans(...)[other_plan] instead of PlanLaunch's plan

  int64_t ScaleCount() const {
    switch (scale) {
      case ScaleKind::kNone: return 0;
      case ScaleKind::kPerElement: return cols;
      case ScaleKind::kSingle: return 1;
      case ScaleKind::kBroadcast: {
        int64_t count = 1;
        for (int64_t d : scale_shape) count *= d;
        return count;
      }
    }
    return 0;
  }
};

template <typename T, typename S>
std::string Describe(const Case& c, const cuda::LaunchPlan& plan) {
  const std::string broadcast =
      c.scale == ScaleKind::kBroadcast ? ShapeToString(c.scale_shape) + " over " + ShapeToString(c.normalized) : "";
  char text[400];
  std::snprintf(text, sizeof text,
                "%s/%s rows=%lld cols=%lld skip=%d sum=%d bias=%d float32_sum=%d scale=%s %s eps=%g outside=%d "
                "misaligned=%d in_place=%d (plan: width %d, vecs %d, group %d, block %d, grid %lld)",
                TypeName<T>(), TypeName<S>(), static_cast<long long>(c.rows), static_cast<long long>(c.cols),
                c.skip, c.sum_output, c.bias, c.float32_sum, ScaleKindName(c.scale), broadcast.c_str(),
                static_cast<double>(c.epsilon), c.eps_outside_sqrt, c.misaligned, c.in_place, plan.width, plan.vecs,
                plan.group, plan.block, static_cast<long long>(plan.grid));
  return text;
}

// The scale's gain for each column, from the shapes alone (independent of MakeScaleBroadcast).
template <typename S>
std::vector<double> ReferenceGains(const Case& c, const std::vector<S>& scale) {
  std::vector<double> gains(static_cast<size_t>(c.cols), 1.0);
  for (int64_t i = 0; i < c.cols; ++i) {
    switch (c.scale) {
      case ScaleKind::kNone: break;
      case ScaleKind::kPerElement: gains[static_cast<size_t>(i)] = ToFloat(scale[static_cast<size_t>(i)]); break;
      case ScaleKind::kSingle: gains[static_cast<size_t>(i)] = ToFloat(scale[0]); break;
      case ScaleKind::kBroadcast: {
        int64_t rest = i, index = 0, stride = 1;
        for (size_t k = 1; k <= c.normalized.size(); ++k) {  // from the last dim
          const int64_t dim = c.normalized[c.normalized.size() - k];
          const int64_t coordinate = rest % dim;
          rest /= dim;
          const int64_t scale_dim = k <= c.scale_shape.size() ? c.scale_shape[c.scale_shape.size() - k] : 1;
          if (scale_dim != 1) index += coordinate * stride;
          stride *= scale_dim;
        }
        gains[static_cast<size_t>(i)] = ToFloat(scale[static_cast<size_t>(index)]);
        break;
      }
    }
  }
  return gains;
}

std::string VariantName(const std::string& type, const cuda::LaunchPlan& plan, bool float32_sum) {
  return type + (float32_sum ? " float32-sum" : "") + (plan.width == 1 ? " scalar" : " vector") + " vecs " +
         std::to_string(plan.vecs);
}
bool SameBits(float a, float b) {
  uint32_t ua, ub;
  std::memcpy(&ua, &a, 4);
  std::memcpy(&ub, &b, 4);
  return ua == ub || (std::isnan(a) && std::isnan(b));
}

// Runs one case and compares y with the float64 reference and `sum` with round_T(x + skip + bias) bit for bit.
// Returns y (as computed), for callers that check more; nothing when the call has no alternative plan
// `c.other_plan`. `bias`: `cols` values of T, as float32 (used when c.bias).
template <typename T, typename S>
std::vector<T> RunCase(Executor& executor, Results& results, const Case& c, const std::vector<T>& x,
                       const std::vector<T>& skip, const std::vector<S>& scale, const std::vector<float>& bias = {}) {
  const size_t n = static_cast<size_t>(c.rows * c.cols);
  const size_t bytes = n * sizeof(T);
  const size_t offset = c.misaligned ? sizeof(T) : 0;
  auto place = [&](const std::vector<T>& values) {
    char* p = static_cast<char*>(executor.Alloc(bytes + 16)) + offset;
    if (!values.empty()) executor.Upload(p, values.data(), bytes);
    return p;
  };
  cuda::NormArgs args;
  args.type = TypeOf<T>::kType;
  args.rows = c.rows;
  args.cols = c.cols;
  args.epsilon = c.epsilon;
  args.eps_outside_sqrt = c.eps_outside_sqrt;
  args.normalize_float32_sum = c.float32_sum;
  if (c.skip && c.bias) {
    float* bias_device = static_cast<float*>(executor.Alloc(bias.size() * sizeof(float)));
    executor.Upload(bias_device, bias.data(), bias.size() * sizeof(float));
    args.bias = bias_device;
  }
  char* x_device = place(x);
  char* skip_device = c.skip ? place(skip) : nullptr;
  args.x = x_device;
  args.skip = skip_device;
  args.y = c.in_place ? x_device : place({});
  if (c.skip && c.sum_output) args.sum = c.in_place ? skip_device : place({});
  if (c.scale != ScaleKind::kNone) {
    void* scale_device = executor.Alloc(scale.size() * sizeof(S));
    executor.Upload(scale_device, scale.data(), scale.size() * sizeof(S));
    args.scale = scale_device;
    args.scale_type = TypeOf<S>::kType;
    args.scale_per_element = c.scale != ScaleKind::kSingle;
    if (c.scale == ScaleKind::kBroadcast) {
      ScaleBroadcast broadcast;
      const bool made = MakeScaleBroadcast(c.scale_shape, c.normalized, &broadcast);
      results.Expect(made, "MakeScaleBroadcast " + ShapeToString(c.scale_shape) + " over " + ShapeToString(c.normalized));
      float* expanded = static_cast<float*>(executor.Alloc(static_cast<size_t>(c.cols) * sizeof(float)));
      executor.Expand(scale_device, TypeOf<S>::kType, broadcast, c.cols, expanded);
      args.scale = expanded;
      args.scale_type = ElementType::kFloat32;
    }
  }
  const bool other = c.other_plan >= 0;
  const auto other_plans = other ? AlternativePlans(args, executor.device())
                                 : std::vector<std::pair<std::string, cuda::LaunchPlan>>();
  if (other && c.other_plan >= static_cast<int>(other_plans.size())) {
    executor.FreeAll();
    return {};
  }
  const cuda::LaunchPlan plan =
      executor.Launch(args, other ? &other_plans[static_cast<size_t>(c.other_plan)].second : nullptr);
  const bool normalizes_float32_sum = c.skip && c.float32_sum && sizeof(T) < sizeof(float);
  results.variants.insert(other ? std::string(TypeName<T>()) + " other plan"
                                : VariantName(TypeName<T>(), plan, normalizes_float32_sum));
  std::vector<T> y(n), sum(args.sum ? n : 0);
  executor.Download(y.data(), args.y, bytes);
  if (args.sum) executor.Download(sum.data(), args.sum, bytes);
  executor.FreeAll();

  const std::vector<double> gains = ReferenceGains(c, scale);
  const double rtol = RelativeTolerance<T>(), atol = SmallestSubnormal<T>();
  bool y_ok = true, sum_ok = true;
  size_t worst = 0;
  double worst_excess = 0.0;
  // SkipRMSNorm: s = (x + skip) + bias in float32, `sum` = round_T(s); normalized: round_T(s), or s itself.
  std::vector<double> normalized(static_cast<size_t>(c.cols));
  for (int64_t r = 0; r < c.rows; ++r) {
    double sum_squares = 0.0;
    for (int64_t i = 0; i < c.cols; ++i) {
      const size_t k = static_cast<size_t>(r * c.cols + i);
      float s = ToFloat(x[k]);
      if (c.skip) {
        s += ToFloat(skip[k]);
        if (c.bias) s += bias[static_cast<size_t>(i)];
      }
      const T h = c.skip ? FromFloat<T>(s) : x[k];
      const double v = c.skip && c.float32_sum ? s : ToFloat(h);
      normalized[static_cast<size_t>(i)] = v;
      sum_squares += v * v;
      if (args.sum) sum_ok = sum_ok && SameBits(ToFloat(sum[k]), ToFloat(h));
    }
    const double mean_square = sum_squares / static_cast<double>(c.cols);
    const double rms = c.eps_outside_sqrt ? std::sqrt(mean_square) + c.epsilon : std::sqrt(mean_square + c.epsilon);
    for (int64_t i = 0; i < c.cols; ++i) {
      const size_t k = static_cast<size_t>(r * c.cols + i);
      const double want = normalized[static_cast<size_t>(i)] / rms * gains[static_cast<size_t>(i)];
      const double got = ToFloat(y[k]);
      if (std::isnan(want) || std::isnan(got)) {
        if (std::isnan(want) != std::isnan(got)) {
          y_ok = false;
          worst = k;
          worst_excess = std::numeric_limits<double>::infinity();
        }
        continue;
      }
      const double excess = std::fabs(got - want) - (atol + rtol * std::fabs(want));
      if (!(excess <= 0.0) && !(excess <= worst_excess)) {
        y_ok = false;
        worst = k;
        worst_excess = excess;
      }
    }
  }
  const std::string name = Describe<T, S>(c, plan);
  if (!y_ok) {
    char detail[160];
    std::snprintf(detail, sizeof detail, ": y[%zu] = %.9g, beyond tolerance by %.3g", worst,
                  static_cast<double>(ToFloat(y[worst])), worst_excess);
    results.Expect(false, name + detail);
  } else {
    results.Expect(true, name);
  }
  if (args.sum) results.Expect(sum_ok, name + ": sum differs from round_T(x + skip + bias)");
  return y;
}

template <typename S>
std::vector<S> Gains(std::mt19937& rng, size_t n) {
  std::uniform_real_distribution<float> gain(-2.0f, 2.0f);
  std::vector<S> values(n);
  for (auto& v : values) v = FromFloat<S>(gain(rng));
  return values;
}

template <typename T, typename S>
void RunRandomCase(Executor& executor, Results& results, std::mt19937& rng, const Case& c, double sigma = 1.0) {
  const size_t n = static_cast<size_t>(c.rows * c.cols);
  const auto x = RandomValues<T>(rng, n, sigma, 0.3 * sigma);  // non-zero mean: RMS is about zero, no centering
  // With the float32 sum, skip small against x: rounding the sum to T would then change many outputs.
  const auto skip = c.skip ? RandomValues<T>(rng, n, c.float32_sum ? sigma / 64 : sigma) : std::vector<T>();
  const auto scale = Gains<S>(rng, static_cast<size_t>(c.ScaleCount()));
  std::vector<float> bias;
  if (c.bias) {
    for (const T& b : RandomValues<T>(rng, static_cast<size_t>(c.cols), sigma / 8)) bias.push_back(ToFloat(b));
  }
  RunCase<T, S>(executor, results, c, x, skip, scale, bias);
}

// A split of `cols` into two dims > 1, for the broadcast cases.
bool Factor(int64_t cols, int64_t* outer, int64_t* inner) {
  for (int64_t d = 2; d * d <= cols; ++d) {
    if (cols % d == 0) {
      *outer = cols / d;
      *inner = d;
      return true;
    }
  }
  return false;
}

template <typename T, typename S>
void RunMatrix(Executor& executor, Results& results, bool quick) {
  std::mt19937 rng(1234);
  std::vector<int64_t> sizes = {1,    2,    3,    4,    7,    8,    15,   16,    17,    31,    32,   33,
                                63,   64,   65,   100,  127,  128,  255,  256,   257,   511,   512,  513,
                                767,  768,  1000, 1023, 1024, 1025, 2047, 2048,  2049,  4095,  4096, 4097,
                                8192, 12288, 16384, 16385, 32768, 40000, 65536, 131072};
  if (quick) {
    sizes = {1, 3, 8, 17, 33, 64, 100, 256, 257, 512, 768, 1024, 2048, 4095, 4096, 4097, 8192, 16384, 32768, 40000};
  }
  for (int64_t cols : sizes) {
    for (int variant = 0; variant < 13; ++variant) {
      Case c;
      c.cols = cols;
      c.rows = variant % 3 + 1;
      switch (variant) {
        case 0: break;
        case 1: c.scale = ScaleKind::kNone, c.epsilon = 0.0f, c.eps_outside_sqrt = true; break;
        case 2: c.scale = ScaleKind::kSingle, c.eps_outside_sqrt = true; break;
        case 3: c.skip = c.sum_output = true; break;
        case 4: c.skip = true, c.epsilon = 0.0f; break;
        case 5: c.skip = c.sum_output = c.in_place = true; break;
        case 6: c.misaligned = true, c.skip = c.sum_output = true; break;
        case 9: c.skip = c.sum_output = c.bias = c.float32_sum = true; break;
        case 10: c.skip = c.float32_sum = c.in_place = true; break;
        case 11: c.skip = c.sum_output = c.bias = c.in_place = true; break;
        case 12: c.skip = c.sum_output = c.bias = c.float32_sum = c.misaligned = true; break;
        case 7:
        case 8: {
          int64_t outer = 0, inner = 0;
          if (!Factor(cols, &outer, &inner)) continue;
          c.scale = ScaleKind::kBroadcast;
          c.normalized = Shape{outer, inner};
          c.scale_shape = variant == 7 ? Shape{inner} : Shape{outer, 1};  // as with axis = -2
          c.skip = variant == 8;
          break;
        }
      }
      RunRandomCase<T, S>(executor, results, rng, c);
    }
  }
  // Epsilon comparable to the mean square: its value and placement visibly change the result.
  for (bool outside : {false, true}) {
    Case c;
    c.rows = 4, c.cols = 64, c.epsilon = 1e-2f, c.eps_outside_sqrt = outside;
    RunRandomCase<T, S>(executor, results, rng, c, 0.05);
  }
  // Many rows: every grid-stride loop goes round (warp rows, wider groups, two-pass).
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{quick ? 3000 : 20000, 24},
                                   {quick ? 300 : 3000, 4096},
                                   {quick ? 20 : 70, 16384},
                                   {quick ? 9 : 40, 40000}}) {
    for (bool float32_sum : {false, true}) {
      Case c;
      c.rows = rows, c.cols = cols, c.skip = c.sum_output = true;
      c.bias = c.float32_sum = float32_sum;
      RunRandomCase<T, S>(executor, results, rng, c, 3.0);
      // The same under the other launch plans that --plans times.
      for (c.other_plan = 0; c.other_plan < kMaxAlternativePlans; ++c.other_plan) {
        RunRandomCase<T, S>(executor, results, rng, c, 3.0);
      }
    }
  }
  // A 3-D normalized block (axis = -3) with a scale varying along the middle dim only.
  Case c;
  c.rows = 3, c.cols = 4 * 6 * 8, c.scale = ScaleKind::kBroadcast;
  c.normalized = Shape{4, 6, 8}, c.scale_shape = Shape{6, 1};
  RunRandomCase<T, S>(executor, results, rng, c);
}

// Values whose squares overflow or underflow float32, or near the float16 limits; NaN/inf; all-zero rows.
template <typename T>
void RunExtremes(Executor& executor, Results& results) {
  const std::vector<float> scale(1, 1.5f);
  for (int64_t cols : {64, 4096, 40000}) {
    for (double magnitude : {6.0e4, 1.0e-6, 1.0e20, 1.0e36, 3.0e38, 1.0e-30, 1.0e-38}) {
      const float m = ToFloat(FromFloat<T>(static_cast<float>(magnitude)));
      if (m == 0.0f || std::isinf(m)) continue;  // not representable in T
      for (float epsilon : {0.0f, 1e-6f}) {
        // None; with `sum`; without (h staged in y); the float32 sum and a bias, with and without `sum`.
        for (int skip_mode = 0; skip_mode < 5; ++skip_mode) {
          const bool skip = skip_mode > 0;
          if (skip && magnitude > 1e30) continue;  // x + skip would overflow float32
          Case c;
          c.rows = 2, c.cols = cols, c.skip = skip, c.sum_output = skip_mode == 1 || skip_mode == 3;
          c.epsilon = epsilon;
          c.bias = c.float32_sum = skip_mode >= 3;
          c.scale = ScaleKind::kSingle;
          std::vector<T> x(static_cast<size_t>(2 * cols)), s(x.size());
          for (size_t k = 0; k < x.size(); ++k) {
            x[k] = FromFloat<T>(static_cast<float>(magnitude * (k % 2 ? 1.0 : -0.5)));
            s[k] = FromFloat<T>(static_cast<float>(magnitude * 0.25));
          }
          // float16 at 6e4: x + skip + bias overflows float16 (sum = inf), not float32 (the float32 sum's y is finite).
          const std::vector<float> bias(static_cast<size_t>(cols),
                                        ToFloat(FromFloat<T>(static_cast<float>(magnitude * 0.125))));
          RunCase<T, float>(executor, results, c, x, s, scale, bias);
        }
      }
    }
  }
  // NaN and inf propagate within their row only.
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (float special : {nan, inf, -inf}) {
    for (int64_t cols : {8, 4096, 40000}) {
      Case c;
      c.rows = 3, c.cols = cols, c.scale = ScaleKind::kNone;
      std::vector<T> x(static_cast<size_t>(3 * cols), FromFloat<T>(1.0f));
      x[static_cast<size_t>(cols + 1)] = FromFloat<T>(special);
      const std::vector<T> y = RunCase<T, float>(executor, results, c, x, {}, {});
      results.Expect(ToFloat(y[0]) > 0.99f && ToFloat(y.back()) > 0.99f,
                     std::string(TypeName<T>()) + ": a special value leaked into other rows");
    }
  }
  // All-zero rows: 0 with eps > 0, 0/0 = NaN with eps = 0.
  for (float epsilon : {1e-5f, 0.0f}) {
    Case c;
    c.rows = 2, c.cols = 16, c.scale = ScaleKind::kNone, c.epsilon = epsilon;
    RunCase<T, float>(executor, results, c, std::vector<T>(32, FromFloat<T>(0.0f)), {}, {});
  }
}

// The launch captured in a CUDA graph gives the same bits as a direct launch (the op must be graph-capturable).
void CheckGraphCapture(Executor& executor, Results& results) {
  const int64_t rows = 64, cols = 4096;
  const size_t bytes = static_cast<size_t>(rows * cols) * sizeof(BFloat16);
  std::mt19937 rng(9);
  const auto x = RandomValues<BFloat16>(rng, static_cast<size_t>(rows * cols), 1.0);
  const auto scale = Gains<BFloat16>(rng, static_cast<size_t>(cols));
  cuda::NormArgs args;
  args.type = args.scale_type = ElementType::kBFloat16;
  args.rows = rows, args.cols = cols;
  void* x_device = executor.Alloc(bytes);
  void* scale_device = executor.Alloc(static_cast<size_t>(cols) * sizeof(BFloat16));
  void* direct = executor.Alloc(bytes);
  void* captured = executor.Alloc(bytes);
  executor.Upload(x_device, x.data(), bytes);
  executor.Upload(scale_device, scale.data(), static_cast<size_t>(cols) * sizeof(BFloat16));
  args.x = x_device;
  args.scale = scale_device;
  args.y = direct;
  executor.Launch(args);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  args.y = captured;
  CHECK_CUDA(cudaStreamBeginCapture(executor.stream(), cudaStreamCaptureModeGlobal));
  CHECK_CUDA(cuda::LaunchRmsNorm(args, executor.device(), executor.stream()));
  CHECK_CUDA(cudaStreamEndCapture(executor.stream(), &graph));
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  CHECK_CUDA(cudaGraphLaunch(exec, executor.stream()));
  CHECK_CUDA(cudaStreamSynchronize(executor.stream()));
  std::vector<BFloat16> a(static_cast<size_t>(rows * cols)), b(a.size());
  executor.Download(a.data(), direct, bytes);
  executor.Download(b.data(), captured, bytes);
  results.Expect(std::memcmp(a.data(), b.data(), bytes) == 0, "CUDA graph replay equals a direct launch");
  CHECK_CUDA(cudaGraphExecDestroy(exec));
  CHECK_CUDA(cudaGraphDestroy(graph));
  executor.FreeAll();
}

// Every kernel variant was run for every element type.
void CheckCoverage(Results& results) {
  for (const char* type : {"float32", "float16", "bfloat16"}) {
    for (const char* variant : {"vector vecs 1", "vector vecs 2", "vector vecs 4", "vector vecs 8", "vector vecs 0",
                                "scalar vecs 4", "scalar vecs 0"}) {
      const std::string name = std::string(type) + " " + variant;
      results.Expect(results.variants.count(name) == 1, "kernel variant exercised: " + name);
    }
    results.Expect(results.variants.count(std::string(type) + " other plan") == 1,
                   std::string("alternative launch plans exercised: ") + type);
  }
  for (const char* type : {"float16", "bfloat16"}) {  // SkipRMSNorm normalizing the float32 sum
    for (const char* variant : {"vector vecs 1", "vector vecs 2", "vector vecs 4", "vector vecs 8", "vector vecs 0",
                                "scalar vecs 4", "scalar vecs 0"}) {
      const std::string name = std::string(type) + " float32-sum " + variant;
      results.Expect(results.variants.count(name) == 1, "kernel variant exercised: " + name);
    }
  }
}

void RunNumerics(Executor& executor, Results& results, bool quick) {
  RunMatrix<float, float>(executor, results, quick);
  RunMatrix<Float16, Float16>(executor, results, quick);
  RunMatrix<Float16, float>(executor, results, quick);
  RunMatrix<BFloat16, BFloat16>(executor, results, quick);
  RunMatrix<BFloat16, float>(executor, results, quick);
  RunExtremes<float>(executor, results);
  RunExtremes<Float16>(executor, results);
  RunExtremes<BFloat16>(executor, results);
  CheckCoverage(results);
  if (!executor.emulate()) CheckGraphCapture(executor, results);
}

}  // namespace gpu_check
