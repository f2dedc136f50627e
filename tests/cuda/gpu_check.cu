// Standalone check of the CUDA kernels, without onnxruntime (custom_op_src/cuda launchers called directly).
//
//   ort_rmsnorm_gpu_check [--json FILE] [--quick] [--no-bench] [--plans]
//       on a GPU: numerics of every type pair, row length (odd sizes, scalar fallback, two-pass), both epsilon
//       placements, epsilon 0, SkipRMSNorm with and without `sum`, in place, misaligned pointers, scale layouts
//       (none, per element, one value, broadcast), rows whose statistic needs float64, NaN/inf, against a float64
//       reference computed on the host; CUDA graph capture; then the benchmark (unless --no-bench): RMSNorm and
//       SkipRMSNorm against a device-to-device copy of the same bytes, decode latency against an empty kernel;
//       with --plans, also other launch plans for the same calls (more threads per row, a grid of every row block),
//       the data for tuning PlanLaunch.
//   ort_rmsnorm_gpu_check --emulate [--quick]
//       no GPU needed: the kernels' row code (rmsnorm_kernels.cuh, host-compiled) run by the CPU under the same
//       launch plans, against the same reference. Checks the indexing, plans and numerics, not the GPU.
//
// Exit status: 0 when every numerics check passed, 1 on any mismatch, 2 on a CUDA error.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "rmsnorm_kernels.cuh"
#include "contract_checks.h"
#include "scalar_convert.h"  // the CPU kernels' conversions: the reference does not use CUDA's

// A named namespace: nvcc's kernel stubs cannot tell this file's anonymous namespace from the one in
// scalar_convert.h.
namespace gpu_check {

using namespace ort_rmsnorm;
using cuda::ElementType;

void CheckCudaOrDie(cudaError_t error, const char* what, int line) {
  if (error == cudaSuccess) return;
  std::fprintf(stderr, "CUDA error at gpu_check.cu:%d (%s): %s\n", line, what, cudaGetErrorString(error));
  std::exit(2);
}
#define CHECK_CUDA(call) CheckCudaOrDie((call), #call, __LINE__)

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

// ---- where the kernels run: the GPU, or the host emulation -------------------------------------------------------

// Runs a launch plan's kernel variant on the CPU: the kernels' row code per thread, in the order the GPU runs it
// (every thread of a row loads before any stores), over the same grid-stride loop.
struct Emulator {
  const cuda::NormArgs& args;
  const cuda::LaunchPlan& plan;
  std::vector<int>& row_visits;

  template <typename T, typename S, cuda::Skip kSkip, int E, int N>
  cudaError_t Run() const {
    const cuda::RowArgs<T, S> typed = cuda::TypedArgs<T, S>(args);
    const cuda::ScaleReader<S, E> scale(typed);
    const int rows_per_block = plan.block / plan.group;
    for (int64_t block = 0; block < plan.grid; ++block) {
      for (int64_t first = block * rows_per_block; first < args.rows; first += plan.grid * rows_per_block) {
        for (int r = 0; r < rows_per_block; ++r) {
          const int64_t row = first + r;
          if (row >= args.rows) continue;
          ++row_visits[static_cast<size_t>(row)];
          Row<T, S, kSkip, E, N>(typed, row * args.cols, scale);
        }
      }
    }
    return cudaSuccess;
  }

  template <typename T, typename S, cuda::Skip kSkip, int E, int N>
  void Row(const cuda::RowArgs<T, S>& typed, int64_t base, const cuda::ScaleReader<S, E>& scale) const {
    using TwoPass = cuda::TwoPassRow<T, S, kSkip, E>;
    const int group = plan.group;
    double sum_squares = 0.0;
    if constexpr (N == 0) {
      for (int t = 0; t < group; ++t) sum_squares += TwoPass::Accumulate(typed, base, t, group);
      if (FastPathIsAccurate(sum_squares, typed.epsilon)) {
        const float factor = static_cast<float>(InverseRms(sum_squares, typed.cols, typed.epsilon,
                                                                 typed.eps_outside_sqrt));
        for (int t = 0; t < group; ++t) TwoPass::Store(typed, base, t, group, factor, scale);
        return;
      }
    } else {
      std::vector<cuda::RegisterRow<T, S, kSkip, E, N>> slices(static_cast<size_t>(group));
      for (int t = 0; t < group; ++t) {
        sum_squares += slices[static_cast<size_t>(t)].Load(typed, base, t, group, scale);
      }
      if (FastPathIsAccurate(sum_squares, typed.epsilon)) {
        const float factor = static_cast<float>(InverseRms(sum_squares, typed.cols, typed.epsilon,
                                                                 typed.eps_outside_sqrt));
        for (int t = 0; t < group; ++t) slices[static_cast<size_t>(t)].Store(typed, base, t, group, factor, scale);
        return;
      }
      for (int t = 0; t < group; ++t) slices[static_cast<size_t>(t)].StageForRereading(typed, base, t, group);
    }
    double exact = 0.0;
    for (int t = 0; t < group; ++t) exact += TwoPass::SumSquaresInDouble(typed, base, t, group);
    const double factor = InverseRms(exact, typed.cols, typed.epsilon, typed.eps_outside_sqrt);
    for (int t = 0; t < group; ++t) TwoPass::Store(typed, base, t, group, factor, scale);
  }
};

// AlternativePlans' wider plans: these times the threads per row, as many times fewer accesses each.
constexpr int kWiderFactors[] = {2, 4};
// What AlternativePlans returns at most: the grid of every row block, and one plan per wider factor.
constexpr int kMaxAlternativePlans = 1 + static_cast<int>(std::size(kWiderFactors));

// Launch plans other than PlanLaunch's for a call (vector accesses only; empty for the two-pass kernel): a grid of
// every row block instead of one sized to the GPU, and 2 or 4 times the threads per row with as many times fewer
// accesses each. Each is a plan PlanLaunch makes for some other row length, so the kernels handle it.
std::vector<std::pair<std::string, cuda::LaunchPlan>> AlternativePlans(const cuda::NormArgs& args,
                                                                       const cuda::DeviceInfo& device) {
  const cuda::LaunchPlan plan = cuda::PlanLaunch(args, device);
  std::vector<std::pair<std::string, cuda::LaunchPlan>> plans;
  if (plan.vecs == 0 || plan.width == 1) return plans;
  cuda::LaunchPlan every_block = plan;
  every_block.grid = cuda::RowBlocks(plan, args.rows);
  if (every_block.grid != plan.grid) plans.emplace_back("every row block", every_block);
  for (int factor : kWiderFactors) {
    if (plan.vecs % factor != 0 || plan.group * factor > cuda::kMaxVectorThreads) continue;
    cuda::LaunchPlan wider = plan;
    wider.group = wider.block = plan.group * factor;
    wider.vecs = plan.vecs / factor;
    wider.grid = cuda::GpuSizedGrid(wider, args.rows, device);
    plans.emplace_back(std::to_string(factor) + "x threads per row", wider);
  }
  for (auto& [name, p] : plans) {
    name += " (G " + std::to_string(p.group) + ", N " + std::to_string(p.vecs) + ", grid " + std::to_string(p.grid) +
            ")";
  }
  return plans;
}

class Executor {
 public:
  explicit Executor(bool emulate) : emulate_(emulate) {
    if (emulate_) {
      device_.device = -1;
      device_.sm_count = 3;  // small, so that the grid-stride loops go round
      device_.max_threads_per_sm = 2048;
      return;
    }
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cuda::QueryDeviceInfo(0, &device_));
    CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~Executor() {
    FreeAll();
    if (stream_) cudaStreamDestroy(stream_);
  }
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  bool emulate() const { return emulate_; }
  const cuda::DeviceInfo& device() const { return device_; }
  cudaStream_t stream() const { return stream_; }

  void* Alloc(size_t bytes) {
    bytes = (bytes + 255) / 256 * 256 + 256;
    void* p = nullptr;
    if (emulate_) {
      p = std::aligned_alloc(256, bytes);
    } else {
      CHECK_CUDA(cudaMalloc(&p, bytes));
    }
    allocations_.push_back(p);
    return p;
  }
  void FreeAll() {
    for (void* p : allocations_) {
      if (emulate_) {
        std::free(p);
      } else {
        CHECK_CUDA(cudaFree(p));
      }
    }
    allocations_.clear();
  }
  void Upload(void* target, const void* source, size_t bytes) {
    if (emulate_) {
      std::memcpy(target, source, bytes);
    } else {
      CHECK_CUDA(cudaMemcpy(target, source, bytes, cudaMemcpyHostToDevice));
    }
  }
  void Download(void* target, const void* source, size_t bytes) {
    if (emulate_) {
      std::memcpy(target, source, bytes);
    } else {
      CHECK_CUDA(cudaMemcpy(target, source, bytes, cudaMemcpyDeviceToHost));
    }
  }

  // Through LaunchRmsNorm, or with `other_plan` (one of AlternativePlans) when given. Returns the plan used, for
  // coverage.
  cuda::LaunchPlan Launch(const cuda::NormArgs& args, const cuda::LaunchPlan* other_plan = nullptr) {
    const cuda::LaunchPlan plan = other_plan ? *other_plan : cuda::PlanLaunch(args, device_);
    if (!emulate_) {
      CHECK_CUDA(other_plan ? cuda::LaunchWithPlan(args, plan, stream_) : cuda::LaunchRmsNorm(args, device_, stream_));
      CHECK_CUDA(cudaStreamSynchronize(stream_));
      return plan;
    }
    std::vector<int> visits(static_cast<size_t>(args.rows), 0);
    Emulator emulator{args, plan, visits};
    switch (args.type) {
      case ElementType::kFloat32: cuda::VisitVariant<float>(args, plan, emulator); break;
      case ElementType::kFloat16: cuda::VisitVariant<__half>(args, plan, emulator); break;
      case ElementType::kBFloat16: cuda::VisitVariant<__nv_bfloat16>(args, plan, emulator); break;
    }
    if (std::any_of(visits.begin(), visits.end(), [](int v) { return v != 1; })) {
      std::fprintf(stderr, "emulation: the grid-stride loop did not visit every row exactly once\n");
      std::exit(1);
    }
    return plan;
  }

  void Expand(const void* scale, ElementType type, const ScaleBroadcast& broadcast, int64_t cols,
              float* out) {
    if (!emulate_) {
      CHECK_CUDA(cuda::LaunchExpandScale(scale, type, broadcast, cols, out, stream_));
      CHECK_CUDA(cudaStreamSynchronize(stream_));
      return;
    }
    for (int64_t i = 0; i < cols; ++i) {
      const int64_t source = BroadcastSource(broadcast, i);
      switch (type) {
        case ElementType::kFloat32: out[i] = static_cast<const float*>(scale)[source]; break;
        case ElementType::kFloat16:
          out[i] = cuda::Packed<__half, 1>::Load(static_cast<const __half*>(scale) + source).Get(0);
          break;
        case ElementType::kBFloat16:
          out[i] = cuda::Packed<__nv_bfloat16, 1>::Load(static_cast<const __nv_bfloat16*>(scale) + source).Get(0);
          break;
      }
    }
  }

 private:
  bool emulate_;
  cuda::DeviceInfo device_;
  cudaStream_t stream_ = nullptr;
  std::vector<void*> allocations_;
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

struct Results {
  int checks = 0;
  int failures = 0;
  std::vector<std::string> messages;
  std::set<std::string> variants;  // kernel variants run (VariantName)

  void Expect(bool ok, const std::string& what) {
    ++checks;
    if (ok) return;
    ++failures;
    if (messages.size() < 30) {
      messages.push_back(what);
      std::printf("FAIL: %s\n", what.c_str());
    }
  }
};

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

// ---- benchmark ----------------------------------------------------------------------------------------------------

__global__ void EmptyKernel() {}

template <typename T>
__global__ void FillKernel(T* out, int64_t n, uint32_t seed) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 0x9E3779B9u ^ seed ^ static_cast<uint32_t>(i >> 32) * 0x85EBCA6Bu;
    h ^= h >> 16;
    h *= 0x7FEB352Du;
    h ^= h >> 15;
    const float value[1] = {static_cast<float>(h >> 8) * (4.0f / 16777216.0f) - 2.0f};
    cuda::Packed<T, 1>::Round(value).Store(out + i);
  }
}

void Fill(ElementType type, void* p, int64_t n, uint32_t seed, cudaStream_t stream) {
  switch (type) {
    case ElementType::kFloat32: FillKernel<<<1024, 256, 0, stream>>>(static_cast<float*>(p), n, seed); break;
    case ElementType::kFloat16: FillKernel<<<1024, 256, 0, stream>>>(static_cast<__half*>(p), n, seed); break;
    case ElementType::kBFloat16: FillKernel<<<1024, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(p), n, seed); break;
  }
  CHECK_CUDA(cudaGetLastError());
}

// Microseconds per call of `enqueue(i)`, `calls` of them captured in one CUDA graph, replayed `reps` times.
double MicrosecondsPerCall(cudaStream_t stream, int calls, int reps, const std::function<void(int)>& enqueue) {
  enqueue(0);  // outside the capture: the kernel's module is loaded by then
  CHECK_CUDA(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < calls; ++i) enqueue(i);
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  CHECK_CUDA(cudaGraphLaunch(exec, stream));  // warm-up
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  CHECK_CUDA(cudaEventRecord(start, stream));
  for (int r = 0; r < reps; ++r) CHECK_CUDA(cudaGraphLaunch(exec, stream));
  CHECK_CUDA(cudaEventRecord(stop, stream));
  CHECK_CUDA(cudaEventSynchronize(stop));
  float ms = 0.0f;
  CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  CHECK_CUDA(cudaGraphExecDestroy(exec));
  CHECK_CUDA(cudaGraphDestroy(graph));
  return 1000.0 * ms / (static_cast<double>(calls) * reps);
}

struct BenchRow {
  std::string op;
  ElementType type;
  int64_t rows, cols;
  double bytes;  // read + written
  double norm_us, copy_us;
  double warm_us;  // one row (decode): the same buffers every call, as in a model where x was just written
  std::vector<std::pair<std::string, double>> other_plans_us;  // --plans: AlternativePlans, timed the same way
};

// Rotating pools much larger than L2, so that every call streams from DRAM.
struct Pools {
  static constexpr size_t kBytes = size_t{1} << 30;  // the largest tensor: 16384 x 16384 float32
  void* x = nullptr;
  void* skip = nullptr;
  void* y = nullptr;
  void* sum = nullptr;
  void* scale = nullptr;
};

std::vector<BenchRow> RunBenchmark(Executor& executor, bool quick, bool other_plans, double* empty_us) {
  cudaStream_t stream = executor.stream();
  Pools pools;
  for (void** p : {&pools.x, &pools.skip, &pools.y, &pools.sum}) *p = executor.Alloc(Pools::kBytes);
  pools.scale = executor.Alloc(16384 * sizeof(float));
  std::vector<BenchRow> rows_out;
  const std::vector<int64_t> row_counts = {1, 32, 4096, 16384};
  const std::vector<int64_t> hidden = {768, 1024, 2048, 4096, 8192, 16384};
  for (ElementType type : {ElementType::kBFloat16, ElementType::kFloat16, ElementType::kFloat32}) {
    const size_t size = cuda::ElementSize(type);
    for (void* p : {pools.x, pools.skip}) Fill(type, p, static_cast<int64_t>(Pools::kBytes / size), 17, stream);
    Fill(type, pools.scale, 16384, 5, stream);
    CHECK_CUDA(cudaStreamSynchronize(stream));
    for (int64_t rows : row_counts) {
      for (int64_t cols : hidden) {
        if (quick && rows * cols > (int64_t{1} << 26)) continue;
        const size_t bytes = static_cast<size_t>(rows * cols) * size;
        const size_t stride = (bytes + 255) / 256 * 256;
        const int64_t slots = std::max<int64_t>(1, static_cast<int64_t>(Pools::kBytes / stride));
        auto at = [&](void* pool, int i) { return static_cast<char*>(pool) + (i % slots) * stride; };
        for (bool skip : {false, true}) {
          const double moved = static_cast<double>(bytes) * (skip ? 4 : 2);
          const double estimate_us = std::max(2.0, moved / 3.0e6);  // at ~3 TB/s
          const int calls = static_cast<int>(std::clamp(4000.0 / estimate_us, 10.0, 1000.0));
          cuda::NormArgs args;
          args.type = args.scale_type = type;
          args.rows = rows, args.cols = cols;
          args.scale = pools.scale;
          auto call = [&](int i) {
            cuda::NormArgs c = args;
            c.x = at(pools.x, i);
            c.y = at(pools.y, i);
            if (skip) c.skip = at(pools.skip, i), c.sum = at(pools.sum, i);
            return c;
          };
          const double norm_us = MicrosecondsPerCall(stream, calls, 3, [&](int i) {
            CHECK_CUDA(cuda::LaunchRmsNorm(call(i), executor.device(), stream));
          });
          const double warm_us = rows > 1 ? 0.0 : MicrosecondsPerCall(stream, calls, 3, [&](int) {
            CHECK_CUDA(cuda::LaunchRmsNorm(call(0), executor.device(), stream));
          });
          std::vector<std::pair<std::string, double>> other_plans_us;
          if (other_plans) {
            for (const auto& other : AlternativePlans(call(0), executor.device())) {
              other_plans_us.emplace_back(other.first, MicrosecondsPerCall(stream, calls, 3, [&](int i) {
                                            CHECK_CUDA(cuda::LaunchWithPlan(call(i), other.second, stream));
                                          }));
            }
          }
          const double copy_us = MicrosecondsPerCall(stream, calls, 3, [&](int i) {
            CHECK_CUDA(cudaMemcpyAsync(at(pools.y, i), at(pools.x, i), bytes, cudaMemcpyDeviceToDevice, stream));
            if (skip) {
              CHECK_CUDA(
                  cudaMemcpyAsync(at(pools.sum, i), at(pools.skip, i), bytes, cudaMemcpyDeviceToDevice, stream));
            }
          });
          rows_out.push_back(
              {skip ? "SkipRMSNorm" : "RMSNorm", type, rows, cols, moved, norm_us, copy_us, warm_us, other_plans_us});
        }
      }
    }
  }
  *empty_us = MicrosecondsPerCall(stream, 1000, 3, [&](int) {
    EmptyKernel<<<1, 1, 0, stream>>>();
    CHECK_CUDA(cudaGetLastError());
  });
  executor.FreeAll();
  return rows_out;
}

void PrintBenchmark(const std::vector<BenchRow>& rows, double empty_us) {
  // warm_us: one row with its inputs in L2 (the same buffers every call).
  std::printf("\n%-12s %-9s %6s %6s %10s %10s %9s %7s %8s\n", "op", "dtype", "rows", "H", "norm_us", "copy_us", "GB/s",
              "%copy", "warm_us");
  for (const BenchRow& r : rows) {
    std::printf("%-12s %-9s %6lld %6lld %10.2f %10.2f %9.0f %6.1f%% ", r.op.c_str(), cuda::ElementTypeName(r.type),
                static_cast<long long>(r.rows), static_cast<long long>(r.cols), r.norm_us, r.copy_us,
                r.bytes / r.norm_us / 1e3, 100.0 * r.copy_us / r.norm_us);
    if (r.rows == 1) {
      std::printf("%8.2f\n", r.warm_us);
    } else {
      std::printf("%8s\n", "-");
    }
  }
  std::printf("\nempty kernel: %.2f us per launch (CUDA graph)\n", empty_us);
  bool header = false;
  for (const BenchRow& r : rows) {
    if (r.other_plans_us.empty()) continue;
    if (!header) std::printf("\nother launch plans: time relative to PlanLaunch's (below 1: faster)\n");
    header = true;
    std::printf("%-12s %-9s %6lld %6lld %8.2f us:", r.op.c_str(), cuda::ElementTypeName(r.type),
                static_cast<long long>(r.rows), static_cast<long long>(r.cols), r.norm_us);
    for (const auto& [name, us] : r.other_plans_us) std::printf("  %s %.3f", name.c_str(), us / r.norm_us);
    std::printf("\n");
  }
  // The speed targets, read off the rows above. The copy bandwidth is the best the copy reached over the large
  // tensors: copies of 512 MiB and more ran at two thirds of the rate of smaller ones on an H200, which would make a
  // per-row ratio a lenient target there.
  double copy_gbps = 0.0, worst_decode = -1e9, worst_warm_decode = -1e9;
  const BenchRow* slowest = nullptr;
  for (const BenchRow& r : rows) {
    if (r.rows * r.cols >= (int64_t{1} << 26) && r.cols >= 1024) {
      copy_gbps = std::max(copy_gbps, r.bytes / r.copy_us / 1e3);
      if (!slowest || r.bytes / r.norm_us < slowest->bytes / slowest->norm_us) slowest = &r;
    }
    if (r.rows == 1) {
      worst_decode = std::max(worst_decode, r.norm_us - empty_us);
      worst_warm_decode = std::max(worst_warm_decode, r.warm_us - empty_us);
    }
  }
  if (slowest) {
    const double fraction = slowest->bytes / slowest->norm_us / 1e3 / copy_gbps;
    std::printf("target >= 90%% of the copy bandwidth (%.0f GB/s) for rows x H >= 64M, H >= 1024: slowest %.1f%% "
                "(%s %s %lld x %lld) -> %s\n",
                copy_gbps, 100.0 * fraction, slowest->op.c_str(), cuda::ElementTypeName(slowest->type),
                static_cast<long long>(slowest->rows), static_cast<long long>(slowest->cols),
                fraction >= 0.9 ? "met" : "NOT met");
  }
  std::printf("target decode (1 x H) within 2 us of an empty launch: worst +%.2f us -> %s (inputs in L2: worst "
              "+%.2f us)\n",
              worst_decode, worst_decode <= 2.0 ? "met" : "NOT met", worst_warm_decode);
}

// ---- JSON ------------------------------------------------------------------------------------------------------

std::string JsonString(const std::string& text) {
  std::string out = "\"";
  for (char ch : text) {
    if (ch == '"' || ch == '\\') out += '\\';
    if (static_cast<unsigned char>(ch) < 0x20) continue;
    out += ch;
  }
  return out + "\"";
}

void WriteJson(const char* path, const Executor& executor, const Results& results, const std::vector<BenchRow>& bench,
               double empty_us) {
  const std::string temporary = std::string(path) + ".tmp";
  FILE* f = std::fopen(temporary.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "cannot write %s\n", path);
    std::exit(2);
  }
  std::string device = "cpu emulation";
  int l2_bytes = 0;
  if (!executor.emulate()) {
    cudaDeviceProp props;
    CHECK_CUDA(cudaGetDeviceProperties(&props, 0));
    device = props.name;
    l2_bytes = props.l2CacheSize;
  }
  std::fprintf(f, "{\n  \"device\": %s,\n  \"sm_count\": %d,\n  \"l2_bytes\": %d,\n", JsonString(device).c_str(),
               executor.device().sm_count, l2_bytes);
  std::fprintf(f, "  \"numerics\": {\"checks\": %d, \"failures\": %d, \"first_failures\": [", results.checks,
               results.failures);
  for (size_t i = 0; i < results.messages.size(); ++i) {
    std::fprintf(f, "%s%s", i ? ", " : "", JsonString(results.messages[i]).c_str());
  }
  std::fprintf(f, "]},\n  \"empty_kernel_us\": %.3f,\n  \"timing\": \"CUDA graph of back-to-back calls, CUDA events; "
                  "inputs rotate through 1 GiB pools\",\n  \"bench\": [",
               empty_us);
  for (size_t i = 0; i < bench.size(); ++i) {
    const BenchRow& r = bench[i];
    std::fprintf(f,
                 "%s\n    {\"op\": \"%s\", \"dtype\": \"%s\", \"rows\": %lld, \"hidden\": %lld, \"bytes\": %.0f, "
                 "\"norm_us\": %.3f, \"copy_us\": %.3f, \"norm_gbps\": %.1f, \"fraction_of_copy\": %.4f, ",
                 i ? "," : "", r.op.c_str(), cuda::ElementTypeName(r.type), static_cast<long long>(r.rows),
                 static_cast<long long>(r.cols), r.bytes, r.norm_us, r.copy_us, r.bytes / r.norm_us / 1e3,
                 r.copy_us / r.norm_us);
    if (r.rows == 1) std::fprintf(f, "\"warm_us\": %.3f, ", r.warm_us);
    std::fprintf(f, "\"other_plans\": [");
    for (size_t k = 0; k < r.other_plans_us.size(); ++k) {
      std::fprintf(f, "%s{\"plan\": %s, \"us\": %.3f}", k ? ", " : "", JsonString(r.other_plans_us[k].first).c_str(),
                   r.other_plans_us[k].second);
    }
    std::fprintf(f, "]}");
  }
  std::fprintf(f, "\n  ]\n}\n");
  std::fclose(f);
  std::rename(temporary.c_str(), path);
}

}  // namespace gpu_check

int main(int argc, char** argv) {
  using namespace gpu_check;
  bool emulate = false, quick = false, bench = true, other_plans = false;
  const char* json = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--emulate")) {
      emulate = true;
    } else if (!std::strcmp(argv[i], "--quick")) {
      quick = true;
    } else if (!std::strcmp(argv[i], "--no-bench")) {
      bench = false;
    } else if (!std::strcmp(argv[i], "--plans")) {
      other_plans = true;
    } else if (!std::strcmp(argv[i], "--json") && i + 1 < argc) {
      json = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--emulate] [--quick] [--no-bench] [--plans] [--json FILE]\n", argv[0]);
      return 2;
    }
  }
  Executor executor(emulate);
  if (emulate) {
    std::printf("CPU emulation of the kernels' row code (no GPU used)\n");
  } else {
    cudaDeviceProp props;
    CHECK_CUDA(cudaGetDeviceProperties(&props, 0));
    std::printf("device: %s, %d SMs, L2 %d MiB, compute capability %d.%d\n", props.name, props.multiProcessorCount,
                props.l2CacheSize >> 20, props.major, props.minor);
  }

  const auto start = std::chrono::steady_clock::now();
  Results results;
  RunMatrix<float, float>(executor, results, quick);
  RunMatrix<Float16, Float16>(executor, results, quick);
  RunMatrix<Float16, float>(executor, results, quick);
  RunMatrix<BFloat16, BFloat16>(executor, results, quick);
  RunMatrix<BFloat16, float>(executor, results, quick);
  RunExtremes<float>(executor, results);
  RunExtremes<Float16>(executor, results);
  RunExtremes<BFloat16>(executor, results);
  CheckCoverage(results);
  if (!emulate) CheckGraphCapture(executor, results);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("numerics: %d checks, %d failures (%.1f s)\n", results.checks, results.failures, seconds);

  std::vector<BenchRow> rows;
  double empty_us = 0.0;
  if (!emulate && bench) {
    rows = RunBenchmark(executor, quick, other_plans, &empty_us);
    PrintBenchmark(rows, empty_us);
  }
  if (json) WriteJson(json, executor, results, rows, empty_us);
  std::printf("%d passed, %d failed\n", results.checks - results.failures, results.failures);
  return results.failures == 0 ? 0 : 1;
}
