// The RMSNorm/SkipRMSNorm kernel variants for float elements (see rmsnorm_kernels.cuh).
#include "rmsnorm_kernels.cuh"

namespace ort_rmsnorm {
namespace cuda {

cudaError_t LaunchFloat32(const NormArgs& args, const LaunchPlan& plan, cudaStream_t stream) {
  return LaunchVariantOf<float>(args, plan, stream);
}

}  // namespace cuda
}  // namespace ort_rmsnorm
