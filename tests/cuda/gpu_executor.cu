// Where the standalone CUDA check runs the kernels (gpu_check.h): on the GPU through the launchers, or on the CPU,
// the kernels' row code (rmsnorm_kernels.cuh, host-compiled) under the same launch plans; and the launch plans other
// than PlanLaunch's that --plans times.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "gpu_check.h"

namespace gpu_check {

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

Executor::Executor(bool emulate) : emulate_(emulate) {
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

Executor::~Executor() {
  FreeAll();
  if (stream_) cudaStreamDestroy(stream_);
}

void* Executor::Alloc(size_t bytes) {
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

void Executor::FreeAll() {
  for (void* p : allocations_) {
    if (emulate_) {
      std::free(p);
    } else {
      CHECK_CUDA(cudaFree(p));
    }
  }
  allocations_.clear();
}

void Executor::Upload(void* target, const void* source, size_t bytes) {
  if (emulate_) {
    std::memcpy(target, source, bytes);
  } else {
    CHECK_CUDA(cudaMemcpy(target, source, bytes, cudaMemcpyHostToDevice));
  }
}

void Executor::Download(void* target, const void* source, size_t bytes) {
  if (emulate_) {
    std::memcpy(target, source, bytes);
  } else {
    CHECK_CUDA(cudaMemcpy(target, source, bytes, cudaMemcpyDeviceToHost));
  }
}

cuda::LaunchPlan Executor::Launch(const cuda::NormArgs& args, const cuda::LaunchPlan* other_plan) {
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

void Executor::Expand(const void* scale, ElementType type, const ScaleBroadcast& broadcast, int64_t cols, float* out) {
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

}  // namespace gpu_check
