// The op sets of each execution provider, appended to the domain by RegisterCustomOps.
#pragma once

#include <vector>

#include "ort_api.h"

namespace ort_rmsnorm {

// CPU ops running `kernels` (chosen once per process by the dispatch in kernels/dispatch.cpp), which they hold.
void AppendCpuOps(const CpuKernels& kernels, std::vector<const OrtCustomOp*>& ops);

#ifdef ORT_RMSNORM_WITH_CUDA
// CUDAExecutionProvider ops (custom_op_src/cuda).
void AppendCudaOps(std::vector<const OrtCustomOp*>& ops);
#endif

}  // namespace ort_rmsnorm
