// CPU execution provider: RMSNorm/SkipRMSNorm kernels over the dispatched row kernels, parallel over rows on
// onnxruntime's intra-op thread pool.
#include <algorithm>
#include <cstdint>
#include <optional>

#include "execution_providers.h"
#include "norm_op.h"
#include "thread_scratch.h"

namespace ort_rmsnorm {
namespace {

// Inputs moving less than this (read + written) run inline on the calling thread: they fit in L2, and waking the
// pool would cost more than it saves. Larger ones are cut into tasks of RowsPerTask rows, claimed dynamically.
constexpr int64_t kInlineBytes = 128 * 1024;

// Outputs larger than this cannot stay in the core-private caches for the next op anyway, so they are written with
// streaming stores: an ordinary store first reads each line of the output from memory, a third more traffic than
// the read + write a copy needs. (Only when every row starts on a cache line, as onnxruntime's allocations and the
// usual hidden sizes give.)
constexpr int64_t kStreamingOutputBytes = 8 * 1024 * 1024;

bool LineAligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 64 == 0; }

template <typename Fn>
void ParallelRows(const Ort::KernelContext& context, int64_t rows, int64_t bytes_per_row, bool streaming_stores,
                  const Fn& fn) {
  const int64_t rows_per_task = RowsPerTask(rows, bytes_per_row, streaming_stores);
  const int64_t tasks = (rows + rows_per_task - 1) / rows_per_task;
  if (tasks <= 1 || rows * bytes_per_row <= kInlineBytes || RuntimeApiVersion() < kApiParallelFor) {
    fn(int64_t{0}, rows);
    return;
  }
  struct Job {
    const Fn* fn;
    int64_t rows, rows_per_task;
  } job{&fn, rows, rows_per_task};
  context.ParallelFor(
      [](void* data, size_t task) {
        const Job& j = *static_cast<const Job*>(data);
        const int64_t begin = static_cast<int64_t>(task) * j.rows_per_task;
        (*j.fn)(begin, std::min(j.rows, begin + j.rows_per_task));
      },
      static_cast<size_t>(tasks), 0, &job);
}

// A constant scale converted to float32 with its own shape; when X's normalized dims are static and the scale
// needs broadcasting, also expanded once per element for them (else broadcast per call: X's shape can be dynamic).
struct HostScale {
  Shape shape;
  std::vector<float> values;
  std::vector<float> expanded;
  Shape expanded_for;  // the normalized shape `expanded` was made for
};

// `count` scale values as float32 (exact): 16-bit ones widened by the dispatched vector kernels.
template <typename S>
void ScaleToFloat32(const CpuKernels& kernels, const S* data, size_t count, float* out) {
  if constexpr (std::is_same_v<S, float>) {
    std::copy(data, data + count, out);
  } else {
    kernels.widen<S>()(data, out, static_cast<int64_t>(count));
  }
}

template <typename S>
HostScale ToHostScale(const CpuKernels& kernels, const Ort::ConstValue& scale) {
  HostScale host{ShapeOf(scale), {}, {}, {}};
  host.values.resize(scale.GetTensorTypeAndShapeInfo().GetElementCount());
  ScaleToFloat32(kernels, static_cast<const S*>(scale.GetTensorRawData()), host.values.size(), host.values.data());
  return host;
}

template <NormKind K, typename T, typename S>
class CpuNormKernel {
  using Sig = NormSignature<K>;

 public:
  static constexpr const char* kExecutionProvider = "CPUExecutionProvider";
  // The kernels of the instruction set RegisterCustomOps chose for this process.
  using Provider = const CpuKernels*;

  CpuNormKernel(const Ort::ConstKernelInfo& info, const CpuKernels* kernels)
      : attributes_(info, Sig::kName), kernels_(*kernels), rows_(kernels->get<T>()) {
    if (info.GetInputCount() > Sig::kScale) {
      int is_constant = 0;
      const Ort::ConstValue scale = info.GetTensorConstantInput(Sig::kScale, &is_constant);
      if (is_constant) constant_scale_ = ToHostScale<S>(kernels_, scale);
    }
    const std::optional<StaticInput> x = attributes_.CheckStaticInput(info);
    if (x && constant_scale_ && x->normalized_dims_known &&
        attributes_.ScaleLayoutFor(constant_scale_->shape, x->x_shape, x->geometry) == ScaleLayout::kBroadcast) {
      const NormGeometry& geometry = x->geometry;
      const int64_t cols = ElementCount(geometry.normalized_shape);
      constant_scale_->expanded.resize(static_cast<size_t>(cols));
      ExpandScale(constant_scale_->values.data(), attributes_.BroadcastFor(constant_scale_->shape, geometry), cols,
                  constant_scale_->expanded.data());
      constant_scale_->expanded_for = geometry.normalized_shape;
    }
  }

  OrtStatusPtr ComputeV2(OrtKernelContext* raw_context) {
    return StatusFrom([&] { Compute(Ort::KernelContext(raw_context)); });
  }

 private:
  // `count` float32 values of `scale` (of `scale_shape`) laid out over a row: used in place when already per
  // element, else broadcast into a per-thread buffer.
  const float* LayOutScale(const float* scale, const Shape& scale_shape, const Shape& x_shape,
                           const NormGeometry& geometry, int slot) const {
    if (attributes_.ScaleLayoutFor(scale_shape, x_shape, geometry) == ScaleLayout::kPerElement) return scale;
    float* expanded = ThreadFloats(slot, static_cast<size_t>(geometry.cols));
    ExpandScale(scale, attributes_.BroadcastFor(scale_shape, geometry), geometry.cols, expanded);
    return expanded;
  }

  // The scale as `cols` float32 values in row order, or nullptr when the node has none (see ThreadOnes).
  const float* ScaleForCall(const Ort::KernelContext& context, const Shape& x_shape,
                            const NormGeometry& geometry) const {
    if (constant_scale_) {
      if (constant_scale_->expanded_for == geometry.normalized_shape && !constant_scale_->expanded.empty()) {
        attributes_.ScaleLayoutFor(constant_scale_->shape, x_shape, geometry);  // the contract's checks, as always
        return constant_scale_->expanded.data();
      }
      return LayOutScale(constant_scale_->values.data(), constant_scale_->shape, x_shape, geometry, 0);
    }
    if (context.GetInputCount() <= Sig::kScale) return nullptr;
    const Ort::ConstValue scale = context.GetInput(Sig::kScale);
    if (!scale) return nullptr;
    const Shape scale_shape = ShapeOf(scale);
    const S* data = static_cast<const S*>(scale.GetTensorRawData());
    if constexpr (std::is_same_v<S, float>) {
      return LayOutScale(data, scale_shape, x_shape, geometry, 0);
    } else {
      const size_t count = scale.GetTensorTypeAndShapeInfo().GetElementCount();
      float* converted = ThreadFloats(0, count);
      ScaleToFloat32(kernels_, data, count, converted);
      return LayOutScale(converted, scale_shape, x_shape, geometry, 1);
    }
  }

  void Compute(const Ort::KernelContext& context) const {
    const NormCall call = BindCall<K>(context, attributes_);
    const NormGeometry& geometry = call.geometry;
    RowBatch<T> batch;
    batch.x = static_cast<const T*>(call.x.GetTensorRawData());
    batch.skip = static_cast<const T*>(call.skip);
    batch.sum = static_cast<T*>(call.sum);
    batch.y = static_cast<T*>(call.y);
    batch.cols = geometry.cols;
    batch.epsilon = attributes_.epsilon;
    batch.eps_outside_sqrt = attributes_.eps_outside_sqrt;
    batch.scale = ScaleForCall(context, call.x_shape, geometry);
    const int64_t tensors_moved = 2 + (batch.skip ? 1 : 0) + (batch.sum ? 1 : 0);  // X, Y; skip, sum
    if (geometry.rows == 0 || geometry.cols == 0) return;
    if (!batch.scale) batch.scale = ThreadOnes(static_cast<size_t>(geometry.cols));  // read by every task's thread
    const int64_t row_bytes = geometry.cols * static_cast<int64_t>(sizeof(T));
    batch.streaming_stores = geometry.rows * row_bytes * (batch.sum ? 2 : 1) >= kStreamingOutputBytes &&
                             row_bytes % 64 == 0 && LineAligned(batch.y) && (!batch.sum || LineAligned(batch.sum));
    const auto scratch_bytes = static_cast<size_t>(ScratchBytes(batch));
    ParallelRows(context, geometry.rows, row_bytes * tensors_moved, batch.streaming_stores,
                 [&](int64_t begin, int64_t end) {
                   RowBatch<T> task = batch;
                   task.scratch = ThreadScratch(scratch_bytes);  // of the thread running this task
                   rows_(task, begin, end);
                 });
  }

  NormAttributes attributes_;
  const CpuKernels& kernels_;
  RowsFn<T> rows_;
  std::optional<HostScale> constant_scale_;  // converted to float32 once, at kernel creation
};

}  // namespace

void AppendCpuOps(const CpuKernels& kernels, std::vector<const OrtCustomOp*>& ops) {
  AppendNormOps<CpuNormKernel>(&kernels, ops);
}

}  // namespace ort_rmsnorm
