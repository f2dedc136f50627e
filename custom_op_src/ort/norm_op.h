// The onnxruntime-facing definition of RMSNorm and SkipRMSNorm (domain "ort_rmsnorm", version 1), shared by the
// execution providers: signature, attributes and their validation, error reporting. An execution provider supplies
// only the kernel class template `Kernel<Kind, T, S>`, constructed from the node's kernel info and the provider's
// state `Kernel::Provider` (the CPU kernels chosen for this process, ...), which each op holds.
#pragma once

#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "../kernels/norm_geometry.h"
#include "../kernels/scalar_convert.h"
#include "call_stamps.h"
#include "ort_api.h"

namespace ort_rmsnorm {

constexpr const char* kDomain = "ort_rmsnorm";

enum class NormKind { kRmsNorm, kSkipRmsNorm };

// Signature:  RMSNorm(X: T, scale: S?) -> Y: T
//             SkipRMSNorm(X: T, skip: T, scale: S?, bias: T?) -> (Y: T, sum: T?)
template <NormKind K>
struct NormSignature {
  static constexpr bool kSkip = K == NormKind::kSkipRmsNorm;
  static constexpr const char* kName = kSkip ? "SkipRMSNorm" : "RMSNorm";
  static constexpr size_t kX = 0, kSkipInput = 1, kScale = kSkip ? 2 : 1;
  static constexpr size_t kBias = 3;  // SkipRMSNorm only
  static constexpr size_t kInputs = kSkip ? kBias + 1 : kScale + 1;
  static constexpr size_t kY = 0, kSum = 1;
  static constexpr size_t kOutputs = kSkip ? 2 : 1;
};

Shape ShapeOf(const Ort::ConstValue& value);

// A tensor's dims read through the C API into storage of its own: no allocation of ours per call up to
// kInlineRank dims (onnxruntime still allocates the type-and-shape object it hands out for each query).
class TensorDims {
 public:
  TensorDims() = default;
  explicit TensorDims(const OrtValue* value);

  ShapeView View() const { return {rank_ <= kInlineRank ? inline_ : heap_.data(), rank_}; }

 private:
  static constexpr size_t kInlineRank = 8;
  int64_t inline_[kInlineRank] = {};
  std::vector<int64_t> heap_;  // ranks above kInlineRank
  size_t rank_ = 0;
};

// X's shape as the model declares it (dims may be -1: dynamic), when its rank is known.
struct StaticInput {
  Shape x_shape;
  NormGeometry geometry;  // rows/cols are -1 where X's declared dims are not all known
  bool normalized_dims_known;
};

// Whether a constant scale or bias that broadcasts is expanded over X's declared normalized dims once, at kernel
// creation: when they are known, non-empty and at most 2^22 elements. A declared shape is the model's word, not a
// tensor: larger (or overflowing) rows are expanded per call, sized by the X actually given.
inline bool ExpandAtCreation(const NormGeometry& geometry) {
  constexpr int64_t kMaxColumnsExpandedAtCreation = int64_t{1} << 22;
  return geometry.cols > 0 && geometry.cols <= kMaxColumnsExpandedAtCreation;
}

// One node: its attributes, validated at kernel creation, and the contract's checks of its inputs. Every check
// fails with an error naming the op and the node.
struct NormAttributes {
  std::string op_name;
  std::string node_name;
  int64_t axis = -1;
  float epsilon = 1e-5f;
  bool eps_outside_sqrt = false;
  bool normalize_float32_sum = false;  // SkipRMSNorm
  size_t outputs = 1;                  // the node's outputs (SkipRMSNorm's `sum` may be one, named or omitted)

  NormAttributes(const Ort::ConstKernelInfo& info, const char* op, bool skip);

  [[noreturn]] void Fail(const std::string& problem, OrtErrorCode code = ORT_INVALID_ARGUMENT) const;

  NormGeometry Geometry(ShapeView x_shape) const;
  // The layout of a per-column input (`name`: "scale", or SkipRMSNorm's "bias") over a row.
  ScaleLayout ScaleLayoutFor(ShapeView shape, ShapeView x_shape, const NormGeometry& geometry,
                             const char* name = "scale") const;
  ScaleBroadcast BroadcastFor(ShapeView shape, ShapeView x_shape, const NormGeometry& geometry,
                              const char* name = "scale") const;
  void CheckSkipShape(ShapeView skip_shape, ShapeView x_shape) const;

  // The static X of the node with its axis checked, or nullopt when the rank is unknown: problems visible in the
  // model's static shapes are reported at session creation rather than at the first run.
  std::optional<StaticInput> CheckStaticInput(const Ort::ConstKernelInfo& info) const;
};

// Runs `fn` and turns any exception into an onnxruntime status.
template <typename Fn>
OrtStatusPtr StatusFrom(Fn&& fn) noexcept {
  try {
    fn();
    return nullptr;
  } catch (const Ort::Exception& e) {
    return Ort::GetApi().CreateStatus(e.GetOrtErrorCode(), e.what());
  } catch (const std::exception& e) {
    return Ort::GetApi().CreateStatus(ORT_FAIL, e.what());
  }
}

// The tensors of one call with the contract's shape checks done: X with its shape and geometry, skip, and the
// outputs Y and sum (skip null for RMSNorm, sum null when the op or the graph has none). Binding a call allocates
// nothing of ours: per call, only onnxruntime's own work remains (a type-and-shape query per tensor input whose
// shape matters, and the outputs).
struct NormCall {
  Ort::ConstValue x{nullptr};
  TensorDims x_dims;
  NormGeometry geometry;
  const void* x_data = nullptr;
  const void* skip = nullptr;
  void* y = nullptr;
  void* sum = nullptr;

  ShapeView x_shape() const { return x_dims.View(); }
};

template <NormKind K>
NormCall BindCall(const Ort::KernelContext& context, const NormAttributes& attributes) {
  using Sig = NormSignature<K>;
  NormCall call;
  call.x = context.GetInput(Sig::kX);
  ORT_RMSNORM_STAMP(kGetX);
  call.x_dims = TensorDims(call.x);
  ORT_RMSNORM_STAMP(kDimsX);
  const ShapeView x_shape = call.x_shape();
  call.geometry = attributes.Geometry(x_shape);
  call.x_data = call.x.GetTensorRawData();
  ORT_RMSNORM_STAMP(kInputX);
  if constexpr (Sig::kSkip) {
    const Ort::ConstValue skip = context.GetInput(Sig::kSkipInput);
    attributes.CheckSkipShape(TensorDims(skip).View(), x_shape);
    call.skip = skip.GetTensorRawData();
    ORT_RMSNORM_STAMP(kInputSkip);
  }
  call.y = context.GetOutput(Sig::kY, x_shape.data(), x_shape.size()).GetTensorMutableRawData();
  ORT_RMSNORM_STAMP(kOutputY);
  if constexpr (Sig::kSkip) {
    if (attributes.outputs > Sig::kSum) {  // an omitted `sum` (an empty name) comes back as no value
      if (Ort::UnownedValue sum = context.GetOutput(Sig::kSum, x_shape.data(), x_shape.size())) {
        call.sum = sum.GetTensorMutableRawData();
      }
    }
    ORT_RMSNORM_STAMP(kOutputSum);
  }
  return call;
}

template <template <NormKind, typename, typename> class Kernel, NormKind K, typename T, typename S>
struct NormOp : Ort::CustomOpBase<NormOp<Kernel, K, T, S>, Kernel<K, T, S>, /*WithStatus=*/true> {
  using Sig = NormSignature<K>;
  using KernelType = Kernel<K, T, S>;
  using Provider = typename KernelType::Provider;

  explicit NormOp(const Provider& provider) : provider_(provider) {
    // onnxruntime rejects ops whose version exceeds its own API version and ignores the fields it predates.
    this->version = static_cast<uint32_t>(RuntimeApiVersion());
    this->InferOutputShapeFn = &InferOutputShape;
    this->GetMayInplace = &MayInplace;
    this->ReleaseMayInplace = &ReleaseMayInplaceArrays;
  }

  const char* GetName() const { return Sig::kName; }
  const char* GetExecutionProviderType() const { return KernelType::kExecutionProvider; }

  size_t GetInputTypeCount() const { return Sig::kInputs; }
  ONNXTensorElementDataType GetInputType(size_t index) const {
    return index == Sig::kScale ? kOrtElementType<S> : kOrtElementType<T>;  // bias: T
  }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t index) const {
    return index >= Sig::kScale ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
  }

  size_t GetOutputTypeCount() const { return Sig::kOutputs; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return kOrtElementType<T>; }
  OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t index) const {
    return index == Sig::kSum ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
  }

  OrtStatusPtr CreateKernelV2(const OrtApi&, const OrtKernelInfo* info, void** kernel) const {
    return StatusFrom([&] { *kernel = new KernelType(Ort::ConstKernelInfo(info), provider_); });
  }

 private:
  Provider provider_;

  // Every output has X's type and shape. onnxruntime's C API can only state a dynamic dim by name: an unnamed one
  // would be read back as the literal value -1, so when X has one (or an unknown rank, reported as 0 dims) the
  // shape is left to onnxruntime (the output type is inferred anyway).
  static OrtStatusPtr ORT_API_CALL InferOutputShape(const OrtCustomOp*, OrtShapeInferContext* context) {
    const OrtApi& api = Ort::GetApi();
    OrtTensorTypeAndShapeInfo* x_info = nullptr;  // owned by the context
    if (OrtStatus* status = api.ShapeInferContext_GetInputTypeShape(context, Sig::kX, &x_info)) return status;
    size_t rank = 0;
    if (OrtStatus* status = api.GetDimensionsCount(x_info, &rank)) return status;
    if (rank == 0) return nullptr;
    std::vector<int64_t> dims(rank);
    std::vector<const char*> names(rank, nullptr);
    if (OrtStatus* status = api.GetDimensions(x_info, dims.data(), rank)) return status;
    if (OrtStatus* status = api.GetSymbolicDimensions(x_info, names.data(), rank)) return status;
    for (size_t d = 0; d < rank; ++d) {
      if (dims[d] < 0 && (names[d] == nullptr || names[d][0] == '\0')) return nullptr;
    }
    // The context does not say whether the node has the optional `sum`. Where onnxruntime checks the index, setting
    // an omitted one just fails; before that it would write past the node's outputs, so there only Y gets a shape.
    const size_t outputs = RuntimeRelease() >= kReleaseCheckingOutputIndex ? Sig::kOutputs : 1;
    for (size_t output = 0; output < outputs; ++output) {
      if (OrtStatus* status = api.ShapeInferContext_SetOutputTypeShape(context, output, x_info)) api.ReleaseStatus(status);
    }
    return nullptr;
  }

  // Y may reuse X's buffer and `sum` skip's: the kernels read and write each element at the same index.
  static size_t ORT_API_CALL MayInplace(int** input_index, int** output_index) {
    constexpr size_t count = Sig::kSkip ? 2 : 1;
    *input_index = static_cast<int*>(std::malloc(count * sizeof(int)));
    *output_index = static_cast<int*>(std::malloc(count * sizeof(int)));
    if (!*input_index || !*output_index) {
      ReleaseMayInplaceArrays(*input_index, *output_index);
      *input_index = *output_index = nullptr;
      return 0;
    }
    (*input_index)[0] = static_cast<int>(Sig::kX);
    (*output_index)[0] = static_cast<int>(Sig::kY);
    if constexpr (Sig::kSkip) {
      (*input_index)[1] = static_cast<int>(Sig::kSkipInput);
      (*output_index)[1] = static_cast<int>(Sig::kSum);
    }
    return count;
  }

  static void ORT_API_CALL ReleaseMayInplaceArrays(int* input_index, int* output_index) {
    std::free(input_index);
    std::free(output_index);
  }
};

}  // namespace ort_rmsnorm

namespace ort_rmsnorm {

// Ops live in static storage: onnxruntime keeps pointers to them for the life of every session. Each is made on
// the first call, from that call's provider state: RegisterCustomOps builds the ops once per process.
template <template <NormKind, typename, typename> class Kernel, NormKind K, typename T, typename S, typename Provider>
const OrtCustomOp* StaticNormOp(const Provider& provider) {
  static const NormOp<Kernel, K, T, S> op(provider);
  return &op;
}

// Both ops for the contract's five (X, scale) type pairs; onnxruntime picks the overload by input types.
template <template <NormKind, typename, typename> class Kernel, typename Provider>
void AppendNormOps(const Provider& provider, std::vector<const OrtCustomOp*>& ops) {
  for (const OrtCustomOp* op : {
           StaticNormOp<Kernel, NormKind::kRmsNorm, float, float>(provider),
           StaticNormOp<Kernel, NormKind::kRmsNorm, Float16, Float16>(provider),
           StaticNormOp<Kernel, NormKind::kRmsNorm, Float16, float>(provider),
           StaticNormOp<Kernel, NormKind::kRmsNorm, BFloat16, BFloat16>(provider),
           StaticNormOp<Kernel, NormKind::kRmsNorm, BFloat16, float>(provider),
           StaticNormOp<Kernel, NormKind::kSkipRmsNorm, float, float>(provider),
           StaticNormOp<Kernel, NormKind::kSkipRmsNorm, Float16, Float16>(provider),
           StaticNormOp<Kernel, NormKind::kSkipRmsNorm, Float16, float>(provider),
           StaticNormOp<Kernel, NormKind::kSkipRmsNorm, BFloat16, BFloat16>(provider),
           StaticNormOp<Kernel, NormKind::kSkipRmsNorm, BFloat16, float>(provider),
       }) {
    ops.push_back(op);
  }
}

}  // namespace ort_rmsnorm
