// Shared by the C++ kernel test programs (no onnxruntime): check counting, the ISAs to test, comparison with a
// float64 reference under the contract's tolerance (contract_checks.h), and line-aligned buffers.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "contract_checks.h"
#include "rmsnorm_kernels.h"
#include "scalar_convert.h"

namespace ort_rmsnorm {
namespace {

int g_failures = 0;
int g_checks = 0;

void Expect(bool ok, const std::string& what) {
  ++g_checks;
  if (!ok) {
    ++g_failures;
    if (g_failures <= 30) std::printf("FAIL: %s\n", what.c_str());
  }
}

// Prints the summary line and returns the process exit status.
int Summary() {
  std::printf("%d checks, %d failures\n", g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}

// The kernels of every instruction set this build has and this CPU runs, scalar first; prints them and the one
// the dispatch picks (scripts check this line to prove which paths were tested).
std::vector<const CpuKernels*> AvailableIsas() {
  std::vector<const CpuKernels*> isas;
  for (CpuIsa isa : kAllCpuIsas) {
    if (const CpuKernels* kernels = CpuKernelsFor(isa)) isas.push_back(kernels);
  }
  const char* error = nullptr;
  std::printf("instruction sets on this CPU:");
  for (const CpuKernels* kernels : isas) std::printf(" %s", kernels->isa);
  std::printf(" (dispatch picks %s)\n", SelectCpuKernels(nullptr, &error)->isa);
  return isas;
}

// `got` matches the float64 reference `want`: NaN exactly where the reference is NaN, equal infinities, otherwise
// within SmallestSubnormal<T>() + RelativeTolerance<T>() * |want|.
template <typename T>
bool WithinTolerance(double got, double want) {
  if (std::isnan(want) || std::isnan(got)) return std::isnan(want) && std::isnan(got);
  if (got == want) return true;
  return std::fabs(got - want) <= SmallestSubnormal<T>() + RelativeTolerance<T>() * std::fabs(want);
}

// SkipRMSNorm's sum as the contract forms it: s = (f32(x) + f32(skip)) + f32(bias) in float32, bias[i] for the
// element i of each row of `cols` (no bias when empty); the `sum` output h = round_T(s), what the unfused graph's Add
// produces. The norm then normalizes h, or s itself with normalize_float32_sum.
template <typename T>
void SkipSum(const std::vector<T>& x, const std::vector<T>& skip, const std::vector<float>& bias, int64_t cols,
             std::vector<float>* s, std::vector<T>* h) {
  s->resize(x.size());
  h->resize(x.size());
  for (size_t k = 0; k < x.size(); ++k) {
    float value = ToFloat(x[k]);
    value += ToFloat(skip[k]);
    if (!bias.empty()) value += bias[k % static_cast<size_t>(cols)];
    (*s)[k] = value;
    (*h)[k] = FromFloat<T>(value);
  }
}

// float64 reference of the norm: each row of `cols` values (T, or float32 sums) divided by its RMS,
// sqrt(mean(v^2) + epsilon) or sqrt(mean(v^2)) + epsilon, times gain(i) for its element i.
template <typename V, typename Gain>
std::vector<double> NormReference(const std::vector<V>& values, int64_t cols, double epsilon, bool eps_outside_sqrt,
                                  Gain gain) {
  std::vector<double> y(values.size());
  const auto row_size = static_cast<size_t>(cols);
  for (size_t row = 0; row_size > 0 && row < values.size(); row += row_size) {
    double sum_squares = 0.0;
    for (size_t i = 0; i < row_size; ++i) {
      const double v = ToFloat(values[row + i]);
      sum_squares += v * v;
    }
    const double mean_square = sum_squares / static_cast<double>(cols);
    const double rms = eps_outside_sqrt ? std::sqrt(mean_square) + epsilon : std::sqrt(mean_square + epsilon);
    for (size_t i = 0; i < row_size; ++i) {
      y[row + i] = static_cast<double>(ToFloat(values[row + i])) / rms * gain(static_cast<int64_t>(i));
    }
  }
  return y;
}

// n elements of T at a 64-byte aligned address, as onnxruntime allocates tensors (streaming stores need it).
template <typename T>
class AlignedBuffer {
 public:
  explicit AlignedBuffer(size_t n) : storage_(n * sizeof(T) + 64) {
    const auto address = reinterpret_cast<uintptr_t>(storage_.data());
    data_ = reinterpret_cast<T*>((address + 63) & ~uintptr_t{63});
  }
  T* data() { return data_; }
  T& operator[](size_t i) { return data_[i]; }

 private:
  std::vector<unsigned char> storage_;
  T* data_;
};

bool SameBits(float a, float b) { return FloatBits(a) == FloatBits(b) || (std::isnan(a) && std::isnan(b)); }

// Runs rows [begin, end) of `batch` with `kernels` as the library's glue calls them: ones for an absent scale, and
// the scratch the call needs, here a heap block of exactly ScratchBytes (so that AddressSanitizer sees any access
// past it).
template <typename T>
void Normalize(const CpuKernels& kernels, RowBatch<T> batch, int64_t begin, int64_t end) {
  std::vector<float> ones;
  if (!batch.scale) {
    ones.assign(static_cast<size_t>(batch.cols > 0 ? batch.cols : 1), 1.0f);
    batch.scale = ones.data();
  }
  const auto bytes = static_cast<size_t>(ScratchBytes(batch));
  batch.scratch = bytes ? std::aligned_alloc(64, bytes) : nullptr;  // bytes: whole cache lines
  kernels.get<T>()(batch, begin, end);
  std::free(batch.scratch);
}

}  // namespace
}  // namespace ort_rmsnorm
