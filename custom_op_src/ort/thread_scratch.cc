#include "thread_scratch.h"

#include <cstdint>
#include <vector>

namespace ort_rmsnorm {

void* ThreadScratch(size_t bytes) {
  if (bytes == 0) return nullptr;
  constexpr size_t kAlignment = 64;
  thread_local std::vector<unsigned char> storage;
  if (storage.size() < bytes + kAlignment - 1) storage.resize(bytes + kAlignment - 1);
  const auto address = reinterpret_cast<uintptr_t>(storage.data());
  return storage.data() + (kAlignment - address % kAlignment) % kAlignment;
}

const float* ThreadOnes(size_t count) {
  thread_local std::vector<float> ones;
  if (ones.size() < count) ones.assign(count, 1.0f);
  return ones.data();
}

float* ThreadFloats(int slot, size_t count) {
  thread_local std::vector<float> buffers[kThreadFloatSlots];
  std::vector<float>& buffer = buffers[slot];
  if (buffer.size() < count) buffer.resize(count);
  return buffer.data();
}

}  // namespace ort_rmsnorm
