// Memory the CPU row kernels' calls need beyond their tensors: the scratch a task needs (RowBatch::scratch), the ones
// that stand for an absent scale, and float32 buffers for scales converted or broadcast per call. Plain C++ without
// onnxruntime types, so the kernel harnesses in tests/cpp drive the kernels with the same buffers as the op.
//
// Each thread keeps its buffers of up to kKeptBytes for its life, grown to the largest such request it has seen: a
// thread allocates only while its calls grow. A request above kKeptBytes (rows of more than a million elements) is
// allocated for that call alone and freed when the call ends (its CallMemory is destroyed), so that one huge row
// leaves nothing behind in a serving process: each thread keeps at most kKeptBytes per buffer.
#pragma once

#include <cstddef>
#include <mutex>
#include <utility>
#include <vector>

namespace ort_rmsnorm {

// The largest buffer of each kind a thread keeps between calls.
constexpr size_t kKeptBytes = size_t{4} << 20;

// Independent float32 buffers a call may hold at once (Floats' `slot`).
constexpr int kThreadFloatSlots = 4;

// A block of memory above kKeptBytes, owned by one call, 64-byte aligned, uninitialized: from the heap, except from
// 32 MiB on Linux, where it is mapped with transparent huge pages (a block of 64 MiB took 63 ms to map, fill and
// unmap in 4 KiB pages, 11 ms in 2 MiB ones).
class LargeBlock {
 public:
  LargeBlock() = default;
  explicit LargeBlock(size_t bytes);
  LargeBlock(LargeBlock&& other) noexcept { *this = std::move(other); }
  LargeBlock& operator=(LargeBlock&& other) noexcept;
  LargeBlock(const LargeBlock&) = delete;
  LargeBlock& operator=(const LargeBlock&) = delete;
  ~LargeBlock() { Release(); }

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void Release();
  void* mapping_ = nullptr;  // what was mapped or allocated
  size_t mapped_ = 0;
  bool mapped_by_mmap_ = false;
  void* data_ = nullptr;     // aligned, `bytes_` usable bytes
  size_t bytes_ = 0;
};

// The memory of one kernel call, made by the calling thread and alive until every task of the call has ended.
// `kept_bytes`: the largest request served from the threads' kept buffers (tests lower it to exercise the rest).
class CallMemory {
 public:
  explicit CallMemory(size_t kept_bytes = kKeptBytes) : kept_bytes_(kept_bytes) {}
  CallMemory(const CallMemory&) = delete;
  CallMemory& operator=(const CallMemory&) = delete;

  // Calling thread only. `count` float32 ones: the scale of a node without one. Multiplying by 1 is exact, and a
  // scale that is always there keeps the kernels' loops free of a branch on it (a branch per vector or per step
  // made the portable kernels 7-90% slower; the ones cost calls without a scale 9-15% with rows in L1/L2, nothing
  // measurable with rows in memory). Valid until the call ends.
  const float* Ones(size_t count);

  // Calling thread only. `count` float32 values in buffer `slot` (0 to kThreadFloatSlots - 1), valid until the call
  // ends or asks for that slot again.
  float* Floats(int slot, size_t count);

  // A task's scratch: `bytes` bytes, 64-byte aligned (nullptr for 0), for the thread running the task until the
  // Scratch is destroyed. Any thread running a task of the call may ask, concurrently.
  class Scratch {
   public:
    Scratch(Scratch&& other) noexcept
        : memory_(std::exchange(other.memory_, nullptr)), block_(std::move(other.block_)), kept_(other.kept_) {}
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;
    Scratch& operator=(Scratch&&) = delete;
    ~Scratch();
    void* data() const { return block_.data() != nullptr ? block_.data() : kept_; }

   private:
    friend class CallMemory;
    Scratch(CallMemory* memory, LargeBlock block, void* kept)
        : memory_(memory), block_(std::move(block)), kept_(kept) {}
    CallMemory* memory_;  // the call whose pool gets `block_` back
    LargeBlock block_;    // a block of the call's pool, or none
    void* kept_;          // or the running thread's kept scratch
  };
  Scratch TaskScratch(size_t bytes);

 private:
  const size_t kept_bytes_;
  // Buffers above kept_bytes_, owned by the call.
  LargeBlock ones_;
  LargeBlock floats_[kThreadFloatSlots];
  // Scratch blocks above kept_bytes_ that no task holds now: at most as many as tasks of the call ran at once.
  std::mutex pool_mutex_;
  std::vector<LargeBlock> pool_;
};

}  // namespace ort_rmsnorm
