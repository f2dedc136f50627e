// RMSNorm / SkipRMSNorm on CUDA: host launchers over the kernels in rmsnorm_kernels.cuh. Plain C++ with no
// onnxruntime types (like custom_op_src/kernels/ for the CPU), so the onnxruntime glue (ort/cuda_ops.cc) and the
// standalone check (tests/cuda/gpu_check.cu) call the same entry points.
//
// Numerics are those of the CPU kernels (README "Numerics"): per row, the sum of squares in float32 partial sums
// combined in float64; the factor computed once per row in float64; y = round_T((x * factor) * scale) formed in
// float32 and rounded once (round-to-nearest-even); rows whose float32 statistic is not trustworthy are redone in
// float64. SkipRMSNorm forms s = (x + skip) + bias in float32, stores round_T(s) to `sum` when requested, and
// normalizes round_T(s), or s itself with normalize_float32_sum.
//
// Every launcher only enqueues work on `stream`: no allocation, no synchronization, no device query, so a call can
// be captured in a CUDA graph.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "../kernels/norm_geometry.h"  // ScaleBroadcast

namespace ort_rmsnorm {
namespace cuda {

enum class ElementType { kFloat32, kFloat16, kBFloat16 };

size_t ElementSize(ElementType type);
const char* ElementTypeName(ElementType type);  // "float32", "float16", "bfloat16"

// What the launch plan needs to know about the device; read once (QueryDeviceInfo), then passed to every launch.
struct DeviceInfo {
  int device = -1;
  int sm_count = 0;
  int max_threads_per_sm = 0;
};

cudaError_t QueryDeviceInfo(int device, DeviceInfo* info);

// One call over X viewed as [rows, cols] (each row one statistic). All pointers are device memory.
struct NormArgs {
  ElementType type = ElementType::kFloat32;  // of x, skip, sum and y
  const void* x = nullptr;
  const void* skip = nullptr;  // SkipRMSNorm when set
  void* sum = nullptr;         // SkipRMSNorm: receives round_T(s) when set
  void* y = nullptr;
  // Scale: nullptr for none; otherwise `cols` values in row order (scale_per_element) or a single value for every
  // element. Its type is float32 or `type`. Other broadcasts are first expanded with LaunchExpandScale.
  const void* scale = nullptr;
  ElementType scale_type = ElementType::kFloat32;
  bool scale_per_element = true;
  // SkipRMSNorm: nullptr, or `cols` float32 values in row order, added after skip (LaunchExpandScale makes them from
  // a bias of another type or layout).
  const float* bias = nullptr;
  bool normalize_float32_sum = false;  // SkipRMSNorm: normalize s rather than round_T(s) (the same for float32)
  int64_t rows = 0;
  int64_t cols = 0;
  float epsilon = 1e-5f;
  bool eps_outside_sqrt = false;
};

// y (and sum) may alias x (and skip): every element is read before it is written, by the same thread (and with the
// float32 sum, a row's `sum` is written only with its y).
// Returns cudaErrorInvalidValue for an unsupported scale type, otherwise the launch's error.
cudaError_t LaunchRmsNorm(const NormArgs& args, const DeviceInfo& device, cudaStream_t stream);

// Writes the broadcast scale, converted to float32, into out[cols] (device memory) on `stream`.
cudaError_t LaunchExpandScale(const void* scale, ElementType scale_type, const ScaleBroadcast& broadcast, int64_t cols,
                              float* out, cudaStream_t stream);

}  // namespace cuda
}  // namespace ort_rmsnorm
