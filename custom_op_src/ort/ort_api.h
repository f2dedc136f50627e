// onnxruntime C++ API, initialized by RegisterCustomOps with the runtime's own API version, so one library built
// against the API-21 headers runs on older runtimes too. Only call API functions whose "\since" version is at
// most RuntimeApiVersion(): the function table of an older runtime simply ends earlier.
#pragma once

#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>
#undef ORT_API_MANUAL_INIT

#include <cstdint>

#include "../kernels/rmsnorm_kernels.h"

namespace ort_rmsnorm {

// Oldest runtime API we can serve: status-returning kernels (CreateKernelV2/KernelComputeV2) arrived in 16.
constexpr int kMinRuntimeApiVersion = 16;
// API features used only when the runtime has them (the op's own fields, such as InferOutputShapeFn and
// GetMayInplace, are simply not read by runtimes older than them).
constexpr int kApiParallelFor = 17;  // KernelContext_ParallelFor

// Runtime behaviour that changed without an API version of its own, by release (onnxruntime 1.N).
// ShapeInferContext_SetOutputTypeShape on an output the node omits: an error status from 1.28, before it an
// unchecked index (the release builds abort the process).
constexpr int kReleaseCheckingOutputIndex = 28;

// The API version in use: min(runtime's, ORT_API_VERSION). Set once by RegisterCustomOps.
int RuntimeApiVersion();

// OrtApi::GetTensorElementTypeAndShapeDataReference (API 24): a tensor's element type and a pointer to its dims,
// without the type-and-shape object GetTensorTypeAndShape allocates and the caller frees. The library is built
// against the API-21 headers, which do not declare it, so it is read from its slot in the function table: OrtApi only
// ever grows at the end and a released slot never moves (onnxruntime_c_api.cc asserts it per version), and
// scripts/test-ort-compat runs the library on 1.24.1, the first release with the slot.
using ShapeReferenceFn = OrtStatus*(ORT_API_CALL*)(const OrtValue* value, ONNXTensorElementDataType* element_type,
                                                    const int64_t** dims, size_t* rank);
constexpr int kApiShapeReference = 24;
constexpr size_t kShapeReferenceSlot = 414;
// The function, or nullptr on runtimes older than API 24. Set once by RegisterCustomOps.
ShapeReferenceFn ShapeReference();
// N for the running onnxruntime 1.N. Set once by RegisterCustomOps.
int RuntimeRelease();

template <typename T>
constexpr ONNXTensorElementDataType kOrtElementType = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
template <>
inline constexpr ONNXTensorElementDataType kOrtElementType<float> = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
template <>
inline constexpr ONNXTensorElementDataType kOrtElementType<Float16> = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
template <>
inline constexpr ONNXTensorElementDataType kOrtElementType<BFloat16> = ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16;

}  // namespace ort_rmsnorm
