// Host side of the CUDA kernels: device facts, the launch plan, scale broadcasting, dispatch by element type.
#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "rmsnorm_kernels.cuh"

namespace ort_rmsnorm {
namespace cuda {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t RoundUpToWarps(int64_t threads) { return CeilDiv(threads, kWarp) * kWarp; }

int PowerOfTwoAtLeast(int64_t n) {
  int p = 1;
  while (p < n) p *= 2;
  return p;
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// 16-byte accesses need every row of every tensor to start 16-byte aligned; otherwise one element per access.
int AccessWidth(const NormArgs& args) {
  const int vector = 16 / static_cast<int>(ElementSize(args.type));
  if (args.cols % vector != 0) return 1;
  for (const void* p : {args.x, args.skip, static_cast<const void*>(args.sum), static_cast<const void*>(args.y)}) {
    if (p && !Aligned16(p)) return 1;
  }
  if (args.scale && args.scale_per_element && !Aligned16(args.scale)) return 1;
  if (args.skip && args.bias && !Aligned16(args.bias)) return 1;
  return vector;
}

template <typename S>
__global__ void ExpandScaleKernel(const S* scale, ScaleBroadcast broadcast, int64_t cols, float* out) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < cols;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = Packed<S, 1>::Load(scale + BroadcastSource(broadcast, i)).Get(0);
  }
}

}  // namespace

size_t ElementSize(ElementType type) { return type == ElementType::kFloat32 ? 4 : 2; }

const char* ElementTypeName(ElementType type) {
  switch (type) {
    case ElementType::kFloat32: return "float32";
    case ElementType::kFloat16: return "float16";
    case ElementType::kBFloat16: return "bfloat16";
  }
  return "?";
}

cudaError_t QueryDeviceInfo(int device, DeviceInfo* info) {
  info->device = device;
  cudaError_t error = cudaDeviceGetAttribute(&info->sm_count, cudaDevAttrMultiProcessorCount, device);
  if (error == cudaSuccess) {
    error = cudaDeviceGetAttribute(&info->max_threads_per_sm, cudaDevAttrMaxThreadsPerMultiProcessor, device);
  }
  return error;
}

LaunchPlan PlanLaunch(const NormArgs& args, const DeviceInfo& device) {
  LaunchPlan plan;
  plan.width = AccessWidth(args);
  const int64_t accesses = args.cols / plan.width;
  // As few threads per row as hold it in registers (short rows get a warp, longer rows more warps), else two-pass.
  int64_t group = 0;
  if (plan.width == 1) {
    group = RoundUpToWarps(CeilDiv(accesses, kScalarVecs));
    plan.vecs = group <= kMaxThreads ? kScalarVecs : 0;
  } else {
    group = RoundUpToWarps(CeilDiv(accesses, kMaxVecs));
    plan.vecs = group <= kMaxVectorThreads ? PowerOfTwoAtLeast(CeilDiv(accesses, group)) : 0;
  }

  const int64_t sm_count = std::max(1, device.sm_count);
  if (plan.vecs == 0) {
    plan.group = plan.block = kTwoPassThreads;
  } else {
    plan.group = static_cast<int>(group);
    // Warp-per-row groups share a block, but only as many rows per block as keep every multiprocessor busy.
    const int64_t rows_per_block =
        group == kWarp ? std::clamp<int64_t>(CeilDiv(args.rows, sm_count), 1, kWarpRowsPerBlock) : 1;
    plan.block = static_cast<int>(group * rows_per_block);
  }
  plan.grid = GpuSizedGrid(plan, args.rows, device);
  return plan;
}

int64_t RowBlocks(const LaunchPlan& plan, int64_t rows) { return CeilDiv(rows, plan.block / plan.group); }

int64_t GpuSizedGrid(const LaunchPlan& plan, int64_t rows, const DeviceInfo& device) {
  const int64_t blocks_per_sm = std::clamp<int64_t>(device.max_threads_per_sm / plan.block, 1, kMaxBlocksPerSm);
  return std::min(RowBlocks(plan, rows), std::max(1, device.sm_count) * blocks_per_sm);
}

cudaError_t LaunchRmsNorm(const NormArgs& args, const DeviceInfo& device, cudaStream_t stream) {
  if (args.scale && args.scale_type != ElementType::kFloat32 && args.scale_type != args.type) {
    return cudaErrorInvalidValue;
  }
  if (args.rows <= 0 || args.cols <= 0) return cudaSuccess;
  return LaunchWithPlan(args, PlanLaunch(args, device), stream);
}

cudaError_t LaunchWithPlan(const NormArgs& args, const LaunchPlan& plan, cudaStream_t stream) {
  switch (args.type) {
    case ElementType::kFloat32: return LaunchFloat32(args, plan, stream);
    case ElementType::kFloat16: return LaunchFloat16(args, plan, stream);
    case ElementType::kBFloat16: return LaunchBFloat16(args, plan, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchExpandScale(const void* scale, ElementType scale_type, const ScaleBroadcast& broadcast, int64_t cols,
                              float* out, cudaStream_t stream) {
  if (cols <= 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(CeilDiv(cols, kThreads), 1024)));
  switch (scale_type) {
    case ElementType::kFloat32:
      ExpandScaleKernel<<<grid, kThreads, 0, stream>>>(static_cast<const float*>(scale), broadcast, cols, out);
      break;
    case ElementType::kFloat16:
      ExpandScaleKernel<<<grid, kThreads, 0, stream>>>(static_cast<const __half*>(scale), broadcast, cols, out);
      break;
    case ElementType::kBFloat16:
      ExpandScaleKernel<<<grid, kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(scale), broadcast, cols,
                                                       out);
      break;
  }
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace ort_rmsnorm
