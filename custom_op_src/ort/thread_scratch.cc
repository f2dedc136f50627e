#include "thread_scratch.h"

#include <algorithm>
#include <cstdint>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace ort_rmsnorm {
namespace {

constexpr size_t kAlignment = 64;

void* AlignUp(void* data, size_t alignment) {
  const auto address = reinterpret_cast<uintptr_t>(data);
  return static_cast<unsigned char*>(data) + (alignment - address % alignment) % alignment;
}

// What a thread keeps between calls: each buffer grown to the largest request of at most kept bytes.
struct KeptBuffers {
  std::vector<unsigned char> scratch;
  std::vector<float> ones;
  std::vector<float> floats[kThreadFloatSlots];
};

KeptBuffers& ThisThread() {
  thread_local KeptBuffers buffers;
  return buffers;
}

}  // namespace

LargeBlock::LargeBlock(size_t bytes) {
#if defined(__linux__)
  // From 32 MiB, glibc's malloc maps every block afresh anyway (in 4 KiB pages); below, it reuses what the last call
  // freed, which costs nothing to map.
  constexpr size_t kMappedBytes = size_t{32} << 20;
  constexpr size_t kHugePage = size_t{2} << 20;
  if (bytes >= kMappedBytes) {
    const size_t mapped = (bytes + kHugePage - 1) / kHugePage * kHugePage + kHugePage;  // room to align
    void* mapping = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapping == MAP_FAILED) throw std::bad_alloc();
    madvise(mapping, mapped, MADV_HUGEPAGE);  // a hint: where refused, 4 KiB pages serve the same
    mapping_ = mapping;
    mapped_ = mapped;
    mapped_by_mmap_ = true;
    data_ = AlignUp(mapping, kHugePage);
    bytes_ = bytes;
    return;
  }
#endif
  const size_t allocated = bytes + kAlignment - 1;
  mapping_ = new unsigned char[allocated];
  mapped_ = allocated;
  data_ = AlignUp(mapping_, kAlignment);
  bytes_ = bytes;
}

LargeBlock& LargeBlock::operator=(LargeBlock&& other) noexcept {
  if (this != &other) {
    Release();
    mapping_ = std::exchange(other.mapping_, nullptr);
    mapped_ = std::exchange(other.mapped_, 0);
    mapped_by_mmap_ = std::exchange(other.mapped_by_mmap_, false);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void LargeBlock::Release() {
  if (mapping_ == nullptr) return;
#if defined(__linux__)
  if (mapped_by_mmap_) {
    munmap(mapping_, mapped_);
  } else {
    delete[] static_cast<unsigned char*>(mapping_);
  }
#else
  delete[] static_cast<unsigned char*>(mapping_);
#endif
  mapping_ = data_ = nullptr;
  mapped_ = bytes_ = 0;
  mapped_by_mmap_ = false;
}

const float* CallMemory::Ones(size_t count) {
  if (count <= kept_bytes_ / sizeof(float)) {
    std::vector<float>& ones = ThisThread().ones;
    if (ones.size() < count) ones.assign(count, 1.0f);
    return ones.data();
  }
  if (ones_.bytes() < count * sizeof(float)) {
    ones_ = LargeBlock(count * sizeof(float));
    std::fill_n(static_cast<float*>(ones_.data()), count, 1.0f);
  }
  return static_cast<const float*>(ones_.data());
}

float* CallMemory::Floats(int slot, size_t count) {
  if (count <= kept_bytes_ / sizeof(float)) {
    std::vector<float>& buffer = ThisThread().floats[slot];
    if (buffer.size() < count) buffer.resize(count);
    return buffer.data();
  }
  if (floats_[slot].bytes() < count * sizeof(float)) floats_[slot] = LargeBlock(count * sizeof(float));
  return static_cast<float*>(floats_[slot].data());
}

CallMemory::Scratch CallMemory::TaskScratch(size_t bytes) {
  if (bytes == 0) return Scratch(nullptr, LargeBlock(), nullptr);
  if (bytes + kAlignment - 1 <= kept_bytes_) {
    std::vector<unsigned char>& storage = ThisThread().scratch;
    if (storage.size() < bytes + kAlignment - 1) storage.resize(bytes + kAlignment - 1);
    return Scratch(nullptr, LargeBlock(), AlignUp(storage.data(), kAlignment));
  }
  LargeBlock block;
  {
    std::lock_guard<std::mutex> lock(pool_mutex_);
    const auto fits = std::find_if(pool_.begin(), pool_.end(),
                                   [bytes](const LargeBlock& free) { return free.bytes() >= bytes; });
    if (fits != pool_.end()) {
      block = std::move(*fits);
      pool_.erase(fits);
    }
  }
  if (block.data() == nullptr) block = LargeBlock(bytes);
  return Scratch(this, std::move(block), nullptr);
}

CallMemory::Scratch::~Scratch() {
  if (memory_ == nullptr || block_.data() == nullptr) return;
  std::lock_guard<std::mutex> lock(memory_->pool_mutex_);
  memory_->pool_.push_back(std::move(block_));
}

}  // namespace ort_rmsnorm
