// What a caller of the row kernels computes: how a call is cut into tasks, and how much scratch each thread needs.
// Compiled with the baseline flags (see rmsnorm_kernels.h).
#include <algorithm>

#include "rmsnorm_kernels.h"
#include "staging.h"

namespace ort_rmsnorm {

template <typename T>
int64_t ScratchBytes(const RowBatch<T>& batch) {
  return StagesInScratch(batch) ? kStagedRows * StagedRowBytes(batch) : 0;
}

template int64_t ScratchBytes(const RowBatch<float>&);
template int64_t ScratchBytes(const RowBatch<Float16>&);
template int64_t ScratchBytes(const RowBatch<BFloat16>&);

int64_t RowsPerTask(int64_t rows, int64_t bytes_per_row, bool streaming_stores) {
  constexpr int64_t kTaskBytes = 64 * 1024;
  constexpr int64_t kStreamingTasks = 64;
  constexpr int64_t kMinStreamingTaskBytes = 256 * 1024;
  const int64_t task_bytes =
      streaming_stores ? std::max(rows * bytes_per_row / kStreamingTasks, kMinStreamingTaskBytes) : kTaskBytes;
  return std::max<int64_t>(1, task_bytes / std::max<int64_t>(1, bytes_per_row));
}

}  // namespace ort_rmsnorm
