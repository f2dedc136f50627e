// The benchmark of the standalone CUDA check (gpu_check.h): RMSNorm and SkipRMSNorm against a device-to-device copy
// of the same bytes, decode latency against an empty kernel, with --plans the other launch plans of each call; every
// call captured in a CUDA graph and timed with CUDA events.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "gpu_check.h"

namespace gpu_check {

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

}  // namespace gpu_check
