// Portable kernels. The "vector" is four plain floats: it gives the algorithm the same number of partial sums as
// the SIMD paths (hence the same accuracy), and the compiler is free to vectorize it with the baseline ISA.
#include "isa_kernels.h"

// The lane operations are forced inline: left to itself GCC calls Fma out of line for every vector of the sum of
// squares, its operands passed through the stack.
#define ORT_RMSNORM_LANES_INLINE __attribute__((always_inline)) inline

namespace ort_rmsnorm {
namespace {

struct ScalarLanes {
  static constexpr int64_t kWidth = 4;
  struct F {
    float v[kWidth];
  };
  template <typename Op>
  ORT_RMSNORM_LANES_INLINE static F Map(const F& a, const F& b, Op op) {
    F r;
    for (int i = 0; i < kWidth; ++i) r.v[i] = op(a.v[i], b.v[i]);
    return r;
  }
  ORT_RMSNORM_LANES_INLINE static F Zero() { return Set1(0.0f); }
  ORT_RMSNORM_LANES_INLINE static F Set1(float value) { return F{{value, value, value, value}}; }
  ORT_RMSNORM_LANES_INLINE static F Add(F a, F b) { return Map(a, b, [](float x, float y) { return x + y; }); }
  ORT_RMSNORM_LANES_INLINE static F Mul(F a, F b) { return Map(a, b, [](float x, float y) { return x * y; }); }
  ORT_RMSNORM_LANES_INLINE static F Fma(F a, F b, F c) { return Add(Mul(a, b), c); }
  static float ReduceAdd(F a) { return (a.v[0] + a.v[1]) + (a.v[2] + a.v[3]); }
  template <typename T>
  static F Load(const T* p) {
    return F{{ToFloat(p[0]), ToFloat(p[1]), ToFloat(p[2]), ToFloat(p[3])}};
  }
  template <typename T>
  static void Store(T* p, F a) {
    for (int i = 0; i < kWidth; ++i) p[i] = FromFloat<T>(a.v[i]);
  }
  template <typename T>
  static F Round(F a) {
    for (float& value : a.v) value = ToFloat(FromFloat<T>(value));
    return a;
  }
  template <typename T>
  static void StoreStreaming(T* p, F a) {
    Store(p, a);
  }
  static void StreamingFence() {}
  static constexpr bool kPipelineRows = false;  // compute-bound: nothing to overlap
};

}  // namespace

extern const CpuKernels kScalarKernels = MakeCpuKernels<ScalarLanes>(CpuIsa::kScalar);

}  // namespace ort_rmsnorm
