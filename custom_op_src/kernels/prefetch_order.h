// The order in which the row kernels prefetch the row they sum next (row_algorithm.h, RowScaler::Step), one step
// of the row loop (kStep elements) at a time.
//
// A row of 16 KB or more is prefetched as two or four parts side by side: step s of the row being scaled
// prefetches step s / parts of part s % parts. One core keeps more lines in flight from memory for several
// sequential streams than for one: on this project's benchmark machine a plain loop of loads and streaming stores
// copied 11 GB/s on one thread with one stream and 15-17 GB/s with four to eight, and 16-bit RMSNorm at
// 2048 x 16384 on one thread became 17-24% faster (docs/benchmarks.md, "What limits the kernels"). Each part
// spans at least 8 KB; shorter rows, whose data came from the L3 cache in the benchmark and gained nothing, and the
// steps past the last whole part are prefetched in order.
//
// Internal linkage for the same reason as scalar_convert.h (included by translation units with different flags).
#pragma once

#include <cstdint>

namespace ort_rmsnorm {
namespace {

struct PrefetchOrder {
  static constexpr int kMaxPartsLog2 = 2;
  static constexpr int64_t kMinPartBytes = 8192;
  int parts_log2;      // the row is prefetched as 2^parts_log2 parts
  int64_t part_steps;  // steps per part
  int64_t part_mask;   // 2^parts_log2 - 1
  int64_t whole_steps;  // the steps of the whole parts, part_steps << parts_log2; later ones are taken in order

  // A row of `row_bytes` bytes, scaled in `steps` whole steps.
  static PrefetchOrder Of(int64_t row_bytes, int64_t steps) {
    int log2 = kMaxPartsLog2;
    while (log2 > 0 && (row_bytes >> log2) < kMinPartBytes) --log2;
    const int64_t part_steps = steps >> log2;
    return {log2, part_steps, (int64_t{1} << log2) - 1, part_steps << log2};
  }

  bool InParts() const { return parts_log2 > 0; }

  // The step whose lines are prefetched at step s (a permutation of [0, steps)). Called once per step of the row
  // loop, so it is kept to a few instructions without a branch on the number of parts (one part: mask 0, s itself).
  int64_t StepAt(int64_t s) const { return s < whole_steps ? (s & part_mask) * part_steps + (s >> parts_log2) : s; }
};

}  // namespace
}  // namespace ort_rmsnorm
