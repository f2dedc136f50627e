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
    if (info.GetInputCount() > Sig::kScale) {
      int is_constant = 0;
      const Ort::ConstValue scale = info.GetTensorConstantInput(Sig::kScale, &is_constant);
      if (is_constant) CopyConstantScale(scale);
    }
    PrepareForStaticShape(info);
    if (attributes_.normalize_float32_sum || info.GetInputCount() > Sig::kBias) {
      attributes_.Fail("the CUDA kernels do not implement normalize_float32_sum or bias yet", ORT_NOT_IMPLEMENTED);
    }
  }

  OrtStatusPtr ComputeV2(OrtKernelContext* raw_context) {
    return StatusFrom([&] { Compute(Ort::KernelContext(raw_context)); });
  }

 private:
  // A constant scale, copied to the kernel's own device memory in its type S; when X's normalized dims are static
  // and the scale needs broadcasting, also expanded once to float32 per element.
  struct ConstantScale {
    Shape shape;
    std::unique_ptr<DeviceBuffer> values;
    std::unique_ptr<DeviceBuffer> expanded;
    Shape expanded_for;  // the normalized shape `expanded` was made for
  };

  void CopyConstantScale(const Ort::ConstValue& scale) {
    ConstantScale copy;
    copy.shape = ShapeOf(scale);
    const size_t bytes = static_cast<size_t>(ElementCount(copy.shape)) * sizeof(S);
    copy.values = std::make_unique<DeviceBuffer>(allocator_.get(), std::max<size_t>(bytes, 1));
    const bool on_device = scale.GetTensorMemoryInfo().GetDeviceType() == OrtMemoryInfoDeviceType_GPU;
    CheckCuda(cudaMemcpy(copy.values->data(), scale.GetTensorRawData(), bytes,
                         on_device ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice),
              attributes_, "copying the constant scale to the device");
    constant_scale_ = std::move(copy);
  }

  // Scales that broadcast other than as one value are read per element by the kernel.
  static bool NeedsExpansion(ScaleLayout layout, const Shape& scale_shape) {
    return layout == ScaleLayout::kBroadcast && ElementCount(scale_shape) != 1;
  }

  // Problems visible in the model's static shapes are reported at session creation; a constant scale that needs
  // broadcasting over static normalized dims is expanded here, once.
  void PrepareForStaticShape(const Ort::ConstKernelInfo& info) {
    const std::optional<StaticInput> x = attributes_.CheckStaticInput(info);
    if (!x || !constant_scale_ || !x->normalized_dims_known) return;
    const ScaleLayout layout = attributes_.ScaleLayoutFor(constant_scale_->shape, x->x_shape, x->geometry);
    if (!NeedsExpansion(layout, constant_scale_->shape)) return;
    const int64_t cols = ElementCount(x->geometry.normalized_shape);
    if (cols == 0) return;
    auto expanded = std::make_unique<DeviceBuffer>(allocator_.get(), static_cast<size_t>(cols) * sizeof(float));
    CheckCuda(cuda::LaunchExpandScale(constant_scale_->values->data(), kCudaType<S>,
                                      attributes_.BroadcastFor(constant_scale_->shape, x->geometry), cols,
                                      static_cast<float*>(expanded->data()), nullptr),
              attributes_, "expanding the constant scale");
    CheckCuda(cudaStreamSynchronize(nullptr), attributes_, "expanding the constant scale");
    constant_scale_->expanded = std::move(expanded);
    constant_scale_->expanded_for = x->geometry.normalized_shape;
  }

  // Points `args` at the scale as the kernel reads it: none, per element, one value, or expanded per element into
  // `scratch` on `stream` (float32).
  void SetScale(const Ort::KernelContext& context, const NormCall& call, cudaStream_t stream, ScratchBuffer& scratch,
                cuda::NormArgs& args) const {
    const NormGeometry& geometry = call.geometry;
    const void* data = nullptr;
    Shape shape;
    if (constant_scale_) {
      data = constant_scale_->values->data();
      shape = constant_scale_->shape;
    } else {
      if (context.GetInputCount() <= Sig::kScale) return;
      const Ort::ConstValue scale = context.GetInput(Sig::kScale);
      if (!scale) return;
      data = scale.GetTensorRawData();
      shape = ShapeOf(scale);
    }
    const ScaleLayout layout = attributes_.ScaleLayoutFor(shape, call.x_shape, geometry);
    args.scale = data;
    args.scale_type = kCudaType<S>;
    args.scale_per_element = layout == ScaleLayout::kPerElement;
    if (!NeedsExpansion(layout, shape)) return;

    args.scale_type = cuda::ElementType::kFloat32;
    args.scale_per_element = true;
    if (constant_scale_ && constant_scale_->expanded && constant_scale_->expanded_for == geometry.normalized_shape) {
      args.scale = constant_scale_->expanded->data();
      return;
    }
    float* expanded = static_cast<float*>(
        scratch.Get(context, call.x.GetTensorMemoryInfo(), static_cast<size_t>(geometry.cols) * sizeof(float)));
    CheckCuda(cuda::LaunchExpandScale(data, kCudaType<S>, attributes_.BroadcastFor(shape, geometry), geometry.cols,
                                      expanded, stream),
              attributes_, "launching the scale expansion");
    args.scale = expanded;
  }

  void Compute(const Ort::KernelContext& context) const {
    const NormCall call = BindCall<K>(context, attributes_);
    cuda::NormArgs args;
    args.type = kCudaType<T>;
    args.x = call.x.GetTensorRawData();
    args.skip = call.skip;
    args.y = call.y;
    args.sum = call.sum;
    args.rows = call.geometry.rows;
    args.cols = call.geometry.cols;
    args.epsilon = attributes_.epsilon;
    args.eps_outside_sqrt = attributes_.eps_outside_sqrt;
    if (args.rows == 0 || args.cols == 0) return;

    const auto stream = static_cast<cudaStream_t>(context.GetGPUComputeStream());
    ScratchBuffer scratch;
    SetScale(context, call, stream, scratch, args);
    CheckCuda(cuda::LaunchRmsNorm(args, device_, stream), attributes_, "launching the CUDA kernel");
  }

  NormAttributes attributes_;
  AllocatorPtr allocator_;  // declared before the buffers it frees
  cuda::DeviceInfo device_;
  std::optional<ConstantScale> constant_scale_;
};

}  // namespace

void AppendCudaOps(std::vector<const OrtCustomOp*>& ops) {
  if (RuntimeApiVersion() < kApiCudaKernels) return;
  AppendNormOps<CudaNormKernel>(CudaProvider{}, ops);
}

}  // namespace ort_rmsnorm
