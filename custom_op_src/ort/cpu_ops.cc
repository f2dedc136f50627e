// CPU execution provider: RMSNorm/SkipRMSNorm kernels over the dispatched row kernels, parallel over rows on
// onnxruntime's intra-op thread pool.
#include <algorithm>
#include <array>
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

// In a decoder a norm runs cold: right after a MatMul has streamed its weights through the caches, the code and data
// of the call path are out in L3 or memory, and the call would take each miss in turn, as it reaches it. So a call
// first asks for the lines it will need, all at once, and their misses overlap: the entry of each C API function it
// calls, the row kernel's code and the start of the constant scale. After MatMuls of 8 MiB this took 2-9% off a
// call at rows of 256 and 1024 (docs/benchmarks.md "The cold call"); warm, the prefetches hit and cost nanoseconds.
class ColdLines {
 public:
  void Add(const void* address, size_t bytes) {
    if (address == nullptr || count_ == kMaxRanges) return;
    ranges_[count_++] = {static_cast<const char*>(address), static_cast<int>(std::min<size_t>(bytes, kMaxBytes) / 64)};
  }
  template <typename Fn>
  void AddCode(Fn* function, int lines) {
    Add(reinterpret_cast<const void*>(function), static_cast<size_t>(lines) * 64);
  }
  void Prefetch() const {
    for (int r = 0; r < count_; ++r) {
      for (int line = 0; line < ranges_[r].lines; ++line) __builtin_prefetch(ranges_[r].address + 64 * line, 0, 2);
    }
  }

 private:
  static constexpr int kMaxRanges = 8;
  static constexpr size_t kMaxBytes = 4 * 1024;  // the hardware prefetcher has the rest of a longer row in time
  struct Range {
    const char* address;
    int lines;
  };
  std::array<Range, kMaxRanges> ranges_{};
  int count_ = 0;
};

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

// A constant per-column input (the scale, or SkipRMSNorm's bias) converted to float32 with its own shape. When X's
// declared normalized dims are static, its shape is checked against them once, at kernel creation, and a broadcast
// is expanded once per element; a call whose X has those dims (and X's declared rank) then reuses both, others
// check and broadcast per call (X's shape can be dynamic).
struct HostColumns {
  Shape shape;
  std::vector<float> values;
  Shape checked_for;            // the normalized dims the shape was checked against (empty: none)
  size_t checked_x_rank = 0;    // and X's rank then (the scale's rank may not exceed it)
  ScaleLayout layout = ScaleLayout::kPerElement;
  std::vector<float> expanded;  // for kBroadcast within ExpandAtCreation's limit

  bool CheckedFor(const NormCall& call) const {
    const ShapeView x_shape = call.x_shape();
    return !checked_for.empty() && checked_x_rank == x_shape.size() &&
           ShapeView(checked_for) == call.geometry.Normalized(x_shape);
  }
};

// `count` values as float32 (exact): 16-bit ones widened by the dispatched vector kernels.
template <typename E>
void ToFloat32(const CpuKernels& kernels, const E* data, size_t count, float* out) {
  if constexpr (std::is_same_v<E, float>) {
    std::copy(data, data + count, out);
  } else {
    kernels.widen<E>()(data, out, static_cast<int64_t>(count));
  }
}

template <typename E>
HostColumns ToHostColumns(const CpuKernels& kernels, const Ort::ConstValue& tensor) {
  HostColumns host;
  host.shape = ShapeOf(tensor);
  host.values.resize(tensor.GetTensorTypeAndShapeInfo().GetElementCount());
  ToFloat32(kernels, static_cast<const E*>(tensor.GetTensorRawData()), host.values.size(), host.values.data());
  return host;
}

// A per-column input of the op: its input index, its name in errors, its element type E, and the first of the two
// buffers of the call (CallMemory::Floats) it is converted and broadcast in per call.
template <typename E>
struct ColumnInput {
  size_t index;
  const char* name;
  int first_slot;
};

template <NormKind K, typename T, typename S>
class CpuNormKernel {
  using Sig = NormSignature<K>;

 public:
  static constexpr const char* kExecutionProvider = "CPUExecutionProvider";
  // The kernels of the instruction set RegisterCustomOps chose for this process.
  using Provider = const CpuKernels*;

  CpuNormKernel(const Ort::ConstKernelInfo& info, const CpuKernels* kernels)
      : attributes_(info, Sig::kName, Sig::kSkip), kernels_(*kernels), rows_(kernels->get<T>()) {
    const std::optional<StaticInput> x = attributes_.CheckStaticInput(info);
    constant_scale_ = PrepareConstant(info, kScale, x);
    if constexpr (Sig::kSkip) constant_bias_ = PrepareConstant(info, kBias, x);
    const OrtApi& api = Ort::GetApi();
    cold_lines_.AddCode(api.KernelContext_GetInput, 2);
    cold_lines_.AddCode(api.KernelContext_GetOutput, 4);
    cold_lines_.AddCode(api.GetTensorMutableData, 2);
    cold_lines_.AddCode(ShapeReference(), 2);
    cold_lines_.AddCode(rows_, 16);
    if (constant_scale_) {
      const std::vector<float>& values =
          constant_scale_->expanded.empty() ? constant_scale_->values : constant_scale_->expanded;
      cold_lines_.Add(values.data(), values.size() * sizeof(float));
    }
  }

  OrtStatusPtr ComputeV2(OrtKernelContext* raw_context) {
    OrtStatusPtr status = StatusFrom([&] { Compute(Ort::KernelContext(raw_context)); });
    ORT_RMSNORM_STAMP(kExit);
    return status;
  }

 private:
  static constexpr ColumnInput<S> kScale{Sig::kScale, "scale", 0};
  static constexpr ColumnInput<T> kBias{Sig::kBias, "bias", 2};

  // `input` converted to float32 when it is a constant initializer; problems of its shape visible in the model's
  // static shapes are reported here, and a broadcast over static normalized dims is expanded here, once.
  template <typename E>
  std::optional<HostColumns> PrepareConstant(const Ort::ConstKernelInfo& info, const ColumnInput<E>& input,
                                             const std::optional<StaticInput>& x) const {
    if (info.GetInputCount() <= input.index) return std::nullopt;
    int is_constant = 0;
    const Ort::ConstValue tensor = info.GetTensorConstantInput(input.index, &is_constant);
    if (!is_constant) return std::nullopt;
    HostColumns host = ToHostColumns<E>(kernels_, tensor);
    if (!x || !x->normalized_dims_known) return host;
    const NormGeometry& geometry = x->geometry;
    host.layout = attributes_.ScaleLayoutFor(host.shape, x->x_shape, geometry, input.name);
    if (geometry.cols <= 0) return host;  // empty: nothing to reuse
    if (host.layout == ScaleLayout::kBroadcast) {
      if (!ExpandAtCreation(geometry)) return host;
      const int64_t cols = geometry.cols;
      host.expanded.resize(static_cast<size_t>(cols));
      ExpandScale(host.values.data(), attributes_.BroadcastFor(host.shape, x->x_shape, geometry, input.name), cols,
                  host.expanded.data());
    }
    host.checked_for = geometry.Normalized(x->x_shape).ToShape();
    host.checked_x_rank = x->x_shape.size();
    return host;
  }

  // `cols` float32 values of `values` (of `shape`) laid out over a row: used in place when already per element,
  // else broadcast into a buffer of the call.
  const float* LayOut(CallMemory& memory, const float* values, ShapeView shape, const NormCall& call, const char* name,
                      int slot) const {
    const NormGeometry& geometry = call.geometry;
    // An empty X reads no column (and its normalized dims may multiply past int64).
    if (attributes_.ScaleLayoutFor(shape, call.x_shape(), geometry, name) == ScaleLayout::kPerElement ||
        geometry.cols == 0) {
      return values;
    }
    float* expanded = memory.Floats(slot, static_cast<size_t>(geometry.cols));
    ExpandScale(values, attributes_.BroadcastFor(shape, call.x_shape(), geometry, name), geometry.cols, expanded);
    return expanded;
  }

  // The input as `cols` float32 values in row order, or nullptr when the node has none.
  template <typename E>
  const float* ColumnsForCall(CallMemory& memory, const Ort::KernelContext& context, const NormCall& call,
                              const ColumnInput<E>& input, const std::optional<HostColumns>& constant) const {
    if (constant) {
      if (constant->CheckedFor(call)) {
        return constant->layout == ScaleLayout::kPerElement ? constant->values.data() : constant->expanded.data();
      }
      return LayOut(memory, constant->values.data(), constant->shape, call, input.name, input.first_slot);
    }
    if (context.GetInputCount() <= input.index) return nullptr;
    const Ort::ConstValue tensor = context.GetInput(input.index);
    if (!tensor) return nullptr;
    const TensorDims dims(tensor);
    const ShapeView shape = dims.View();
    const E* data = static_cast<const E*>(tensor.GetTensorRawData());
    if constexpr (std::is_same_v<E, float>) {
      return LayOut(memory, data, shape, call, input.name, input.first_slot);
    } else {
      const auto count = static_cast<size_t>(ElementCount(shape));
      float* converted = memory.Floats(input.first_slot, count);
      ToFloat32(kernels_, data, count, converted);
      return LayOut(memory, converted, shape, call, input.name, input.first_slot + 1);
    }
  }

  void Compute(const Ort::KernelContext& context) const {
    ORT_RMSNORM_STAMP(kEntry);
    cold_lines_.Prefetch();
    ORT_RMSNORM_STAMP(kPrefetch);
    const NormCall call = BindCall<K>(context, attributes_);
    const NormGeometry& geometry = call.geometry;
    RowBatch<T> batch;
    batch.x = static_cast<const T*>(call.x_data);
    batch.skip = static_cast<const T*>(call.skip);
    batch.sum = static_cast<T*>(call.sum);
    batch.y = static_cast<T*>(call.y);
    batch.cols = geometry.cols;
    batch.epsilon = attributes_.epsilon;
    batch.eps_outside_sqrt = attributes_.eps_outside_sqrt;
    batch.normalize_float32_sum = attributes_.normalize_float32_sum;
    // What the call needs beyond its tensors: kept by the threads up to kKeptBytes a buffer, the rest freed when
    // the call returns (thread_scratch.h).
    CallMemory memory;
    batch.scale = ColumnsForCall(memory, context, call, kScale, constant_scale_);  // nullptr: see Ones
    if constexpr (Sig::kSkip) batch.bias = ColumnsForCall(memory, context, call, kBias, constant_bias_);
    ORT_RMSNORM_STAMP(kColumns);
    const int64_t tensors_moved = 2 + (batch.skip ? 1 : 0) + (batch.sum ? 1 : 0);  // X, Y; skip, sum
    if (geometry.rows == 0 || geometry.cols == 0) return;
    if (!batch.scale) batch.scale = memory.Ones(static_cast<size_t>(geometry.cols));  // read by every task's thread
    const int64_t row_bytes = geometry.cols * static_cast<int64_t>(sizeof(T));
    batch.streaming_stores = geometry.rows * row_bytes * (batch.sum ? 2 : 1) >= kStreamingOutputBytes &&
                             row_bytes % 64 == 0 && LineAligned(batch.y) && (!batch.sum || LineAligned(batch.sum));
    const auto scratch_bytes = static_cast<size_t>(ScratchBytes(batch));
    ParallelRows(context, geometry.rows, row_bytes * tensors_moved, batch.streaming_stores,
                 [&](int64_t begin, int64_t end) {
                   RowBatch<T> task = batch;
                   const CallMemory::Scratch scratch = memory.TaskScratch(scratch_bytes);  // this task's alone
                   task.scratch = scratch.data();
                   rows_(task, begin, end);
                 });
    ORT_RMSNORM_STAMP(kKernel);
  }

  NormAttributes attributes_;
  const CpuKernels& kernels_;
  RowsFn<T> rows_;
  std::optional<HostColumns> constant_scale_;  // converted to float32 once, at kernel creation
  std::optional<HostColumns> constant_bias_;   // SkipRMSNorm
  ColdLines cold_lines_;                        // what a call prefetches first
};

}  // namespace

void AppendCpuOps(const CpuKernels& kernels, std::vector<const OrtCustomOp*>& ops) {
  AppendNormOps<CpuNormKernel>(&kernels, ops);
}

}  // namespace ort_rmsnorm
