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

// Whether a call normalizes the float32 sum s rather than round_T(s): a different row only for 16-bit T, where it
// is staged in float32.
template <typename T>
bool NormalizesFloat32Sum(const RowBatch<T>& batch) {
  return batch.skip != nullptr && batch.normalize_float32_sum && sizeof(T) < sizeof(float);
}

// Whether a call stages in RowBatch::scratch. SkipRMSNorm stages round_T(s) in its `sum` output (or in y, which its
// second pass overwrites in place), except with streaming stores, where neither stays in cache for the second pass,
// and when it normalizes the float32 sum, which a T tensor cannot hold.
template <typename T>
bool StagesInScratch(const RowBatch<T>& batch) {
  return batch.skip != nullptr && (batch.streaming_stores || NormalizesFloat32Sum(batch));
}

// Bytes from one staged row to the next: whole cache lines of T, or of float32 for the float32 sum.
template <typename T>
int64_t StagedRowBytes(const RowBatch<T>& batch) {
  const int64_t element_bytes = NormalizesFloat32Sum(batch) ? sizeof(float) : sizeof(T);
  return (batch.cols * element_bytes + 63) / 64 * 64;
}

}  // namespace
}  // namespace ort_rmsnorm
