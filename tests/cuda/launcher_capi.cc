// A C entry point over the CUDA launchers, for callers without onnxruntime (tests/cuda/bench_torch.py calls it with
// ctypes on torch tensors, on torch's stream, so both are timed side by side in one process).
#include <cuda_runtime_api.h>

#include <cstdint>
#include <mutex>

#include "rmsnorm_cuda.h"

namespace {

using ort_rmsnorm::cuda::DeviceInfo;
using ort_rmsnorm::cuda::ElementType;

constexpr int kMaxDevices = 64;

// Device facts, read once per device.
cudaError_t DeviceInfoOfCurrentDevice(const DeviceInfo** info) {
  static DeviceInfo infos[kMaxDevices];
  static std::once_flag once[kMaxDevices];
  static cudaError_t errors[kMaxDevices];
  int device = 0;
  if (cudaError_t error = cudaGetDevice(&device); error != cudaSuccess) return error;
  if (device < 0 || device >= kMaxDevices) return cudaErrorInvalidDevice;
  std::call_once(once[device], [&] { errors[device] = ort_rmsnorm::cuda::QueryDeviceInfo(device, &infos[device]); });
  *info = &infos[device];
  return errors[device];
}

}  // namespace

extern "C" {

// Element types: 0 float32, 1 float16, 2 bfloat16. Returns a cudaError_t (0 = success).
__attribute__((visibility("default"))) int ort_rmsnorm_cuda_launch(int type, const void* x, const void* skip,
                                                                   void* sum, void* y, const void* scale,
                                                                   int scale_type, int scale_per_element,
                                                                   int64_t rows, int64_t cols, float epsilon,
                                                                   int eps_outside_sqrt, void* stream) {
  const DeviceInfo* device = nullptr;
  if (cudaError_t error = DeviceInfoOfCurrentDevice(&device); error != cudaSuccess) return error;
  ort_rmsnorm::cuda::NormArgs args;
  args.type = static_cast<ElementType>(type);
  args.x = x;
  args.skip = skip;
  args.sum = sum;
  args.y = y;
  args.scale = scale;
  args.scale_type = static_cast<ElementType>(scale_type);
  args.scale_per_element = scale_per_element != 0;
  args.rows = rows;
  args.cols = cols;
  args.epsilon = epsilon;
  args.eps_outside_sqrt = eps_outside_sqrt != 0;
  return ort_rmsnorm::cuda::LaunchRmsNorm(args, *device, static_cast<cudaStream_t>(stream));
}

__attribute__((visibility("default"))) const char* ort_rmsnorm_cuda_error_string(int error) {
  return cudaGetErrorString(static_cast<cudaError_t>(error));
}

}  // extern "C"
