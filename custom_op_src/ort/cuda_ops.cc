// CUDA execution provider: RMSNorm/SkipRMSNorm kernels over the launchers in custom_op_src/cuda, enqueued on
// onnxruntime's compute stream. A call allocates nothing of its own, never synchronizes and queries no device, so
// it can be captured in a CUDA graph; device facts and constant scales are prepared once, at kernel creation.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>

#include "../cuda/rmsnorm_cuda.h"
#include "execution_providers.h"
#include "norm_op.h"

namespace ort_rmsnorm {
namespace {

// KernelInfoGetAllocator (device memory at creation) and KernelContext_GetScratchBuffer arrived in API 18. On older
// runtimes the CUDA overloads are not registered and onnxruntime runs these nodes with the CPU ones.
constexpr int kApiCudaKernels = 18;

template <typename T>
constexpr cuda::ElementType kCudaType = cuda::ElementType::kFloat32;
template <>
constexpr cuda::ElementType kCudaType<Float16> = cuda::ElementType::kFloat16;
template <>
constexpr cuda::ElementType kCudaType<BFloat16> = cuda::ElementType::kBFloat16;

void CheckCuda(cudaError_t error, const NormAttributes& attributes, const std::string& what) {
  if (error != cudaSuccess) attributes.Fail(what + ": " + cudaGetErrorString(error), ORT_FAIL);
}

struct AllocatorRelease {
  void operator()(OrtAllocator* allocator) const { Ort::GetApi().ReleaseAllocator(allocator); }
};
using AllocatorPtr = std::unique_ptr<OrtAllocator, AllocatorRelease>;

// Device memory from onnxruntime's allocator of the kernel's device, returned when the kernel is destroyed.
class DeviceBuffer {
 public:
  DeviceBuffer(OrtAllocator* allocator, size_t bytes)
      : allocator_(allocator), data_(Ort::UnownedAllocator(allocator).Alloc(bytes)) {}
  ~DeviceBuffer() { allocator_->Free(allocator_, data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }

 private:
  OrtAllocator* allocator_;
  void* data_;
};

// Device memory for one call from KernelContext_GetScratchBuffer. onnxruntime's allocator orders its reuse after
// the work queued so far on the compute stream, so it is returned at the end of the call, before the kernel runs.
class ScratchBuffer {
 public:
  ScratchBuffer() = default;
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;
  ~ScratchBuffer() {
    if (data_) allocator_->Free(allocator_.get(), data_);
  }

  void* Get(const Ort::KernelContext& context, const OrtMemoryInfo* memory_info, size_t bytes) {
    OrtKernelContext* raw = context.GetOrtKernelContext();
    allocator_.reset(context.GetAllocator(*memory_info));
    Ort::ThrowOnError(Ort::GetApi().KernelContext_GetScratchBuffer(raw, memory_info, bytes, &data_));
    return data_;
  }

 private:
  AllocatorPtr allocator_;
  void* data_ = nullptr;
};

// Makes `device` current for the creation-time copies and launches, and restores the caller's device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) == cudaSuccess && previous_ != device) {
      set_ = cudaSetDevice(device) == cudaSuccess;
    }
  }
  ~DeviceGuard() {
    if (set_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool set_ = false;
};

// The CUDA kernels share no state: what they need of the device is read by each kernel at its creation.
struct CudaProvider {};

template <NormKind K, typename T, typename S>
class CudaNormKernel {
  using Sig = NormSignature<K>;

 public:
  static constexpr const char* kExecutionProvider = "CUDAExecutionProvider";
  using Provider = CudaProvider;

  CudaNormKernel(const Ort::ConstKernelInfo& info, const Provider&) : attributes_(info, Sig::kName, Sig::kSkip) {
    OrtAllocator* allocator = nullptr;
    Ort::ThrowOnError(Ort::GetApi().KernelInfoGetAllocator(info, OrtMemTypeDefault, &allocator));
    allocator_.reset(allocator);
    const int device = Ort::UnownedAllocator(allocator).GetInfo().GetDeviceId();
    CheckCuda(cuda::QueryDeviceInfo(device, &device_), attributes_,
              "reading the properties of CUDA device " + std::to_string(device));
    DeviceGuard guard(device);
    const std::optional<StaticInput> x = attributes_.CheckStaticInput(info);
    constant_scale_ = CopyConstant<S>(info, Sig::kScale, "scale");
    PrepareForStaticShape(x, constant_scale_, kCudaType<S>, "scale", /*to_float32=*/false);
    if constexpr (Sig::kSkip) {
      constant_bias_ = CopyConstant<T>(info, Sig::kBias, "bias");
      PrepareForStaticShape(x, constant_bias_, kCudaType<T>, "bias", /*to_float32=*/true);
    }
  }

  OrtStatusPtr ComputeV2(OrtKernelContext* raw_context) {
    return StatusFrom([&] { Compute(Ort::KernelContext(raw_context)); });
  }

 private:
  // A constant per-column input (the scale, or SkipRMSNorm's bias), copied to the kernel's own device memory in its
  // own type; when X's normalized dims are static and the kernels cannot read it as it is, also expanded once to
  // float32 per element.
  struct ConstantColumns {
    Shape shape;
    std::unique_ptr<DeviceBuffer> values;
    std::unique_ptr<DeviceBuffer> expanded;
    Shape expanded_for;  // the normalized shape `expanded` was made for
  };

  // A per-column input as the kernels receive it: its data (device memory) and shape, from the constant copy or
  // the call's input; data is nullptr when the node has none.
  struct Columns {
    const void* data = nullptr;
    const Shape* constant_shape = nullptr;  // the constant's, else `dims`
    TensorDims dims;

    ShapeView shape() const { return constant_shape ? ShapeView(*constant_shape) : dims.View(); }
  };

  template <typename E>
  std::optional<ConstantColumns> CopyConstant(const Ort::ConstKernelInfo& info, size_t index, const char* name) {
    if (info.GetInputCount() <= index) return std::nullopt;
    int is_constant = 0;
    const Ort::ConstValue tensor = info.GetTensorConstantInput(index, &is_constant);
    if (!is_constant) return std::nullopt;
    ConstantColumns copy;
    copy.shape = ShapeOf(tensor);
    const size_t bytes = static_cast<size_t>(ElementCount(copy.shape)) * sizeof(E);
    copy.values = std::make_unique<DeviceBuffer>(allocator_.get(), std::max<size_t>(bytes, 1));
    const bool on_device = tensor.GetTensorMemoryInfo().GetDeviceType() == OrtMemoryInfoDeviceType_GPU;
    CheckCuda(cudaMemcpy(copy.values->data(), tensor.GetTensorRawData(), bytes,
                         on_device ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice),
              attributes_, std::string("copying the constant ") + name + " to the device");
    return copy;
  }

  // Whether the kernels need a per-column input expanded to float32 per element: a scale that broadcasts other than
  // as one value (they read a scale per element or as one value, in S or float32); a bias unless it is float32 per
  // element already (they read the bias as float32 per element).
  static bool NeedsExpansion(ScaleLayout layout, ShapeView shape, cuda::ElementType type, bool to_float32) {
    if (to_float32) return layout != ScaleLayout::kPerElement || type != cuda::ElementType::kFloat32;
    return layout == ScaleLayout::kBroadcast && ElementCount(shape) != 1;
  }

  // Problems visible in the model's static shapes are reported at session creation; a constant that needs
  // expanding over static normalized dims is expanded here, once.
  void PrepareForStaticShape(const std::optional<StaticInput>& x, std::optional<ConstantColumns>& constant,
                             cuda::ElementType type, const char* name, bool to_float32) {
    if (!x || !constant || !x->normalized_dims_known) return;
    const ScaleLayout layout = attributes_.ScaleLayoutFor(constant->shape, x->x_shape, x->geometry, name);
    if (!NeedsExpansion(layout, constant->shape, type, to_float32)) return;
    if (!ExpandAtCreation(x->geometry)) return;
    const int64_t cols = x->geometry.cols;
    auto expanded = std::make_unique<DeviceBuffer>(allocator_.get(), static_cast<size_t>(cols) * sizeof(float));
    const std::string what = std::string("expanding the constant ") + name;
    CheckCuda(cuda::LaunchExpandScale(constant->values->data(), type,
                                      attributes_.BroadcastFor(constant->shape, x->x_shape, x->geometry, name), cols,
                                      static_cast<float*>(expanded->data()), nullptr),
              attributes_, what);
    CheckCuda(cudaStreamSynchronize(nullptr), attributes_, what);
    constant->expanded = std::move(expanded);
    constant->expanded_for = x->geometry.Normalized(x->x_shape).ToShape();
  }

  static Columns ColumnsOf(const Ort::KernelContext& context, size_t index,
                           const std::optional<ConstantColumns>& constant) {
    Columns columns;
    if (constant) {
      columns.data = constant->values->data();
      columns.constant_shape = &constant->shape;
      return columns;
    }
    if (context.GetInputCount() <= index) return columns;
    const Ort::ConstValue tensor = context.GetInput(index);
    if (!tensor) return columns;
    columns.data = tensor.GetTensorRawData();
    columns.dims = TensorDims(tensor);
    return columns;
  }

  // `columns` expanded to float32 per element: the constant's expansion when it was made for these normalized dims,
  // else into `scratch` on `stream`.
  const float* Expanded(const Ort::KernelContext& context, const NormCall& call, const Columns& columns,
                        const std::optional<ConstantColumns>& constant, cuda::ElementType type, const char* name,
                        cudaStream_t stream, ScratchBuffer& scratch) const {
    const NormGeometry& geometry = call.geometry;
    if (constant && constant->expanded && ShapeView(constant->expanded_for) == geometry.Normalized(call.x_shape())) {
      return static_cast<const float*>(constant->expanded->data());
    }
    float* expanded = static_cast<float*>(
        scratch.Get(context, call.x.GetTensorMemoryInfo(), static_cast<size_t>(geometry.cols) * sizeof(float)));
    CheckCuda(cuda::LaunchExpandScale(columns.data, type,
                                      attributes_.BroadcastFor(columns.shape(), call.x_shape(), geometry, name),
                                      geometry.cols, expanded, stream),
              attributes_, std::string("launching the ") + name + " expansion");
    return expanded;
  }

  // Points `args` at the scale as the kernel reads it: none, per element, one value, or expanded per element into
  // `scratch` on `stream` (float32).
  void SetScale(const Ort::KernelContext& context, const NormCall& call, cudaStream_t stream, ScratchBuffer& scratch,
                cuda::NormArgs& args) const {
    const Columns scale = ColumnsOf(context, Sig::kScale, constant_scale_);
    if (!scale.data) return;
    const ScaleLayout layout = attributes_.ScaleLayoutFor(scale.shape(), call.x_shape(), call.geometry);
    args.scale = scale.data;
    args.scale_type = kCudaType<S>;
    args.scale_per_element = layout == ScaleLayout::kPerElement;
    if (!NeedsExpansion(layout, scale.shape(), kCudaType<S>, false)) return;
    args.scale_type = cuda::ElementType::kFloat32;
    args.scale_per_element = true;
    args.scale = Expanded(context, call, scale, constant_scale_, kCudaType<S>, "scale", stream, scratch);
  }

  // Points `args` at SkipRMSNorm's bias as float32 per element (none when the node has none).
  void SetBias(const Ort::KernelContext& context, const NormCall& call, cudaStream_t stream, ScratchBuffer& scratch,
               cuda::NormArgs& args) const {
    const Columns bias = ColumnsOf(context, Sig::kBias, constant_bias_);
    if (!bias.data) return;
    const ScaleLayout layout = attributes_.ScaleLayoutFor(bias.shape(), call.x_shape(), call.geometry, "bias");
    if (!NeedsExpansion(layout, bias.shape(), kCudaType<T>, true)) {
      args.bias = static_cast<const float*>(bias.data);
      return;
    }
    args.bias = Expanded(context, call, bias, constant_bias_, kCudaType<T>, "bias", stream, scratch);
  }

  void Compute(const Ort::KernelContext& context) const {
    const NormCall call = BindCall<K>(context, attributes_);
    cuda::NormArgs args;
    args.type = kCudaType<T>;
    args.x = call.x_data;
    args.skip = call.skip;
    args.y = call.y;
    args.sum = call.sum;
    args.rows = call.geometry.rows;
    args.cols = call.geometry.cols;
    args.epsilon = attributes_.epsilon;
    args.eps_outside_sqrt = attributes_.eps_outside_sqrt;
    args.normalize_float32_sum = attributes_.normalize_float32_sum;
    if (args.rows == 0 || args.cols == 0) return;

    const auto stream = static_cast<cudaStream_t>(context.GetGPUComputeStream());
    ScratchBuffer scale_scratch, bias_scratch;
    SetScale(context, call, stream, scale_scratch, args);
    if constexpr (Sig::kSkip) SetBias(context, call, stream, bias_scratch, args);
    CheckCuda(cuda::LaunchRmsNorm(args, device_, stream), attributes_, "launching the CUDA kernel");
  }

  NormAttributes attributes_;
  AllocatorPtr allocator_;  // declared before the buffers it frees
  cuda::DeviceInfo device_;
  std::optional<ConstantColumns> constant_scale_;
  std::optional<ConstantColumns> constant_bias_;  // SkipRMSNorm
};

}  // namespace

void AppendCudaOps(std::vector<const OrtCustomOp*>& ops) {
  if (RuntimeApiVersion() < kApiCudaKernels) return;
  AppendNormOps<CudaNormKernel>(CudaProvider{}, ops);
}

}  // namespace ort_rmsnorm
