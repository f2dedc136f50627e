// Per-thread memory for the CPU row kernels' calls: the scratch a call needs (RowBatch::scratch), the ones that
// stand for an absent scale, and float32 buffers for scales converted or broadcast per call. Plain C++ without
// onnxruntime types, so the kernel harnesses in tests/cpp drive the kernels with the same buffers as the op.
//
// Each thread keeps its buffers for its life, grown to the largest request it has seen and never shrunk: a thread
// allocates only while its calls grow. A pointer stays valid until the same thread asks again for that buffer.
#pragma once

#include <cstddef>

namespace ort_rmsnorm {

// `bytes` bytes, 64-byte aligned (nullptr for 0): RowBatch::scratch of a call on this thread.
void* ThreadScratch(size_t bytes);

// `count` float32 ones: the scale of a node without one. Multiplying by 1 is exact, and a scale that is always
// there keeps the kernels' loops free of a branch on it (a branch per vector or per step made the portable kernels
// 7-90% slower; the ones cost calls without a scale 9-15% with rows in L1/L2, nothing measurable with rows in memory).
const float* ThreadOnes(size_t count);

// `count` float32 values; `slot` (0 to kThreadFloatSlots - 1) selects one of independent buffers.
constexpr int kThreadFloatSlots = 4;
float* ThreadFloats(int slot, size_t count);

}  // namespace ort_rmsnorm
