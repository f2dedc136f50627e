// What the units of the standalone CUDA check share: gpu_check.cu (the program: options, the run, its report as
// text and JSON), gpu_executor.cu (where the kernels run: the GPU, or the host emulation; the launch plans other
// than PlanLaunch's), gpu_check_numerics.cu (every case against the float64 reference) and gpu_bench.cu (the
// benchmark and its targets).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "rmsnorm_kernels.cuh"

// A named namespace: nvcc's kernel stubs cannot tell an anonymous namespace of a unit from the one in
// scalar_convert.h.
namespace gpu_check {

using namespace ort_rmsnorm;
using cuda::ElementType;

inline void CheckCudaOrDie(cudaError_t error, const char* what, const char* file, int line) {
  if (error == cudaSuccess) return;
  const char* slash = std::strrchr(file, '/');
  std::fprintf(stderr, "CUDA error at %s:%d (%s): %s\n", slash ? slash + 1 : file, line, what,
               cudaGetErrorString(error));
  std::exit(2);
}
#define CHECK_CUDA(call) ::gpu_check::CheckCudaOrDie((call), #call, __FILE__, __LINE__)

// ---- where the kernels run: the GPU, or the host emulation (gpu_executor.cu) ----------------------------------------

// AlternativePlans' wider plans: these times the threads per row, as many times fewer accesses each.
constexpr int kWiderFactors[] = {2, 4};
// What AlternativePlans returns at most: the grid of every row block, and one plan per wider factor.
constexpr int kMaxAlternativePlans = 1 + static_cast<int>(std::size(kWiderFactors));

// Launch plans other than PlanLaunch's for a call (vector accesses only; empty for the two-pass kernel): a grid of
// every row block instead of one sized to the GPU, and 2 or 4 times the threads per row with as many times fewer
// accesses each. Each is a plan PlanLaunch makes for some other row length, so the kernels handle it.
std::vector<std::pair<std::string, cuda::LaunchPlan>> AlternativePlans(const cuda::NormArgs& args,
                                                                       const cuda::DeviceInfo& device);

// Memory, copies and launches on the GPU, or with `emulate` on the host: the kernels' row code run by the CPU under
// the same launch plans, on a pretend device of 3 multiprocessors.
class Executor {
 public:
  explicit Executor(bool emulate);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  bool emulate() const { return emulate_; }
  const cuda::DeviceInfo& device() const { return device_; }
  cudaStream_t stream() const { return stream_; }

  void* Alloc(size_t bytes);
  void FreeAll();
  void Upload(void* target, const void* source, size_t bytes);
  void Download(void* target, const void* source, size_t bytes);

  // Through LaunchRmsNorm, or with `other_plan` (one of AlternativePlans) when given. Returns the plan used, for
  // coverage.
  cuda::LaunchPlan Launch(const cuda::NormArgs& args, const cuda::LaunchPlan* other_plan = nullptr);

  void Expand(const void* scale, ElementType type, const ScaleBroadcast& broadcast, int64_t cols, float* out);

 private:
  bool emulate_;
  cuda::DeviceInfo device_;
  cudaStream_t stream_ = nullptr;
  std::vector<void*> allocations_;
};

// ---- numerics (gpu_check_numerics.cu) -------------------------------------------------------------------------------

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

// Every type pair, row length and option against the float64 reference, special values, the coverage of the kernel
// variants, and on a GPU the launch captured in a CUDA graph.
void RunNumerics(Executor& executor, Results& results, bool quick);

// ---- benchmark (gpu_bench.cu) ---------------------------------------------------------------------------------------

struct BenchRow {
  std::string op;
  ElementType type;
  int64_t rows, cols;
  double bytes;  // read + written
  double norm_us, copy_us;
  double warm_us;  // one row (decode): the same buffers every call, as in a model where x was just written
  std::vector<std::pair<std::string, double>> other_plans_us;  // --plans: AlternativePlans, timed the same way
};

// RMSNorm and SkipRMSNorm against a device-to-device copy of the same bytes; *empty_us: an empty kernel's launch.
std::vector<BenchRow> RunBenchmark(Executor& executor, bool quick, bool other_plans, double* empty_us);
// The table, the other plans' relative times and the speed targets.
void PrintBenchmark(const std::vector<BenchRow>& rows, double empty_us);

}  // namespace gpu_check
