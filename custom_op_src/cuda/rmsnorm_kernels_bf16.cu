// The RMSNorm/SkipRMSNorm kernel variants for __nv_bfloat16 elements (see rmsnorm_kernels.cuh).
#include "rmsnorm_kernels.cuh"

namespace ort_rmsnorm {
namespace cuda {

cudaError_t LaunchBFloat16(const NormArgs& args, const LaunchPlan& plan, cudaStream_t stream) {
  return LaunchVariantOf<__nv_bfloat16>(args, plan, stream);
}

}  // namespace cuda
}  // namespace ort_rmsnorm
