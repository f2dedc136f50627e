// Where SkipRMSNorm's first pass leaves the rows its second pass normalizes, and how much of RowBatch::scratch that
// takes: shared by the kernels (row_algorithm.h) and ScratchBytes (row_batch.cc), so the two cannot disagree.
// Internal linkage for the same reason as scalar_convert.h (included by translation units with different flags).
#pragma once

#include <cstdint>

#include "rmsnorm_kernels.h"

namespace ort_rmsnorm {
namespace {

// Rows staged per thread: two, since a pipelined row r's staged values are read while row r + 1's are formed.
constexpr int64_t kStagedRows = 2;

// Whether a call stages in RowBatch::scratch. Without streaming stores SkipRMSNorm stages h in its `sum` output (or
// in y, which its second pass overwrites in place); with them neither stays in cache for the second pass.
template <typename T>
bool StagesInScratch(const RowBatch<T>& batch) {
  return batch.skip != nullptr && batch.streaming_stores;
}

// Bytes from one staged row to the next: whole cache lines.
template <typename T>
int64_t StagedRowBytes(const RowBatch<T>& batch) {
  return (batch.cols * static_cast<int64_t>(sizeof(T)) + 63) / 64 * 64;
}

}  // namespace
}  // namespace ort_rmsnorm
