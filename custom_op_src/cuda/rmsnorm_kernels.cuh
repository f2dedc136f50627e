// The CUDA row algorithm: launch plan, the per-thread work on a row (__host__ __device__, so the check program can
// run it on the CPU: gpu_check --emulate), and the kernels that put it on the GPU.
//
// A row of `cols` elements is handled by a group of G threads (a multiple of 32). Thread t of the group owns the
// accesses t, t + G, t + 2G, ... of the row, each an aligned 16-byte vector of E = 16 / sizeof(T) elements (or one
// element on the scalar fallback, for odd sizes and unaligned pointers):
//   - register kernel: the thread keeps its N accesses of the row in registers between the statistic and the
//     output, so each element is read from memory once and written once (rows up to G * N * E elements);
//   - two-pass kernel (longer rows): the row is read again for the output, mostly from L2.
// The group's sum of squares is reduced with warp shuffles, then across the group's warps in shared memory.
// A warp per row (G = 32, several rows per block) for short rows; more threads per row as rows grow.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "../kernels/row_statistics.h"  // FastPathIsAccurate, InverseRms: shared with the CPU kernels
#include "rmsnorm_cuda.h"

#define ORT_RMSNORM_HD __host__ __device__ __forceinline__
#ifdef __CUDA_ARCH__
#define ORT_RMSNORM_UNROLL _Pragma("unroll")
#else
#define ORT_RMSNORM_UNROLL
#endif

namespace ort_rmsnorm {
namespace cuda {

// ---- element types and packed accesses ---------------------------------------------------------------------------

ORT_RMSNORM_HD float BitsToFloat(uint32_t bits) {
  float value;
  memcpy(&value, &bits, sizeof value);
  return value;
}

ORT_RMSNORM_HD uint32_t FloatToBits(float value) {
  uint32_t bits;
  memcpy(&bits, &value, sizeof bits);
  return bits;
}

// Widening (exact) and rounding (to nearest-even) of one element type, on its bits. 16-bit types come in pairs
// per 32-bit word, the lower address in the low half.
template <typename T>
struct Element;

template <>
struct Element<float> {
  ORT_RMSNORM_HD static float Widen(uint32_t bits) { return BitsToFloat(bits); }
  ORT_RMSNORM_HD static uint32_t Round(float value) { return FloatToBits(value); }
};

template <>
struct Element<__nv_bfloat16> {
  ORT_RMSNORM_HD static float Widen(uint32_t bits) { return BitsToFloat(bits << 16); }
  ORT_RMSNORM_HD static float High(uint32_t word) { return BitsToFloat(word & 0xFFFF0000u); }
  ORT_RMSNORM_HD static uint16_t Round(float value) { return __bfloat16_as_ushort(__float2bfloat16_rn(value)); }
  ORT_RMSNORM_HD static uint32_t RoundPair(float low, float high) {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
    uint32_t word;
    memcpy(&word, &pair, sizeof word);
    return word;
  }
};

template <>
struct Element<__half> {
  ORT_RMSNORM_HD static float Widen(uint32_t bits) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
  }
  ORT_RMSNORM_HD static float High(uint32_t word) { return Widen(word >> 16); }
  ORT_RMSNORM_HD static uint16_t Round(float value) { return __half_as_ushort(__float2half_rn(value)); }
  ORT_RMSNORM_HD static uint32_t RoundPair(float low, float high) {
    const __half2 pair = __floats2half2_rn(low, high);
    uint32_t word;
    memcpy(&word, &pair, sizeof word);
    return word;
  }
};

// E consecutive elements of T as they lie in memory, kept packed in registers (two 16-bit elements per 32-bit
// register) and moved with one instruction per 16 bytes.
template <typename T, int E>
struct Packed {
  static constexpr int kBytes = static_cast<int>(sizeof(T)) * E;
  using Word = std::conditional_t<kBytes >= 4, uint32_t, uint16_t>;
  static constexpr int kWords = kBytes / static_cast<int>(sizeof(Word));
  static_assert(kWords == 1 || kBytes % 16 == 0, "accesses are one word or whole 16-byte vectors");

  Word w[kWords];

  ORT_RMSNORM_HD static Packed Zero() {
    Packed p;
    ORT_RMSNORM_UNROLL
    for (int i = 0; i < kWords; ++i) p.w[i] = 0;
    return p;
  }

  // `source` is aligned to min(kBytes, 16).
  ORT_RMSNORM_HD static Packed Load(const T* source) {
    Packed p;
    if constexpr (kWords == 1) {
      p.w[0] = *reinterpret_cast<const Word*>(source);
    } else {
      ORT_RMSNORM_UNROLL
      for (int i = 0; i < kWords / 4; ++i) {
        const uint4 vector = reinterpret_cast<const uint4*>(source)[i];
        p.w[4 * i] = vector.x;
        p.w[4 * i + 1] = vector.y;
        p.w[4 * i + 2] = vector.z;
        p.w[4 * i + 3] = vector.w;
      }
    }
    return p;
  }

  ORT_RMSNORM_HD void Store(T* target) const {
    if constexpr (kWords == 1) {
      *reinterpret_cast<Word*>(target) = w[0];
    } else {
      ORT_RMSNORM_UNROLL
      for (int i = 0; i < kWords / 4; ++i) {
        reinterpret_cast<uint4*>(target)[i] = make_uint4(w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]);
      }
    }
  }

  // Element e widened to float32.
  ORT_RMSNORM_HD float Get(int e) const {
    if constexpr (sizeof(T) == 4 || kWords == 1) {
      return Element<T>::Widen(w[sizeof(T) == 4 ? e : 0]);
    } else {
      return e % 2 ? Element<T>::High(w[e / 2]) : Element<T>::Widen(w[e / 2]);
    }
  }

  // The values rounded to T.
  ORT_RMSNORM_HD static Packed Round(const float (&values)[E]) {
    Packed p;
    if constexpr (sizeof(T) == 4 || kWords == 1) {
      ORT_RMSNORM_UNROLL
      for (int e = 0; e < E; ++e) p.w[e] = Element<T>::Round(values[e]);
    } else {
      ORT_RMSNORM_UNROLL
      for (int i = 0; i < kWords; ++i) p.w[i] = Element<T>::RoundPair(values[2 * i], values[2 * i + 1]);
    }
    return p;
  }
};

// ---- the per-row numerics (README "Numerics"; FastPathIsAccurate and InverseRms are the CPU kernels' own) -----

// What a row normalizes: X (RMSNorm), or SkipRMSNorm's s = (x + skip) + bias formed in float32, either rounded to
// T (round_T(s), which is also the `sum` output) or as it is (normalize_float32_sum, for 16-bit T).
enum class Skip { kNone, kRoundedSum, kFloat32Sum };

// The type a thread holds its row's normalized values in.
template <typename T, Skip kSkip>
using Held = std::conditional_t<kSkip == Skip::kFloat32Sum, float, T>;

// Typed view of NormArgs for one (T, S) pair.
template <typename T, typename S>
struct RowArgs {
  const T* x;
  const T* skip;
  T* sum;
  T* y;
  const S* scale;
  bool scale_per_element;
  const float* bias;  // SkipRMSNorm: nullptr, or float32 per column
  int64_t cols;
  float epsilon;
  bool eps_outside_sqrt;
};

// The gain of each element: per column, a single value, or 1 without a scale (multiplying by 1 is exact, so the
// result equals the CPU kernels' unscaled product).
template <typename S, int E>
struct ScaleReader {
  const S* per_column = nullptr;
  float single = 1.0f;

  template <typename T>
  ORT_RMSNORM_HD explicit ScaleReader(const RowArgs<T, S>& args) {
    if (args.scale && args.scale_per_element) per_column = args.scale;
    if (args.scale && !args.scale_per_element) single = Packed<S, 1>::Load(args.scale).Get(0);
  }

  // Brings the gains of `col` into L1 while the row is loaded and reduced. Their loads come later, each after the
  // previous output's store (a load cannot move above a store that may alias it), so without this every gain is a
  // dependent L2 round trip: about 0.18 us per access of a decode-sized row on an H200 (docs/cuda.md).
  ORT_RMSNORM_HD void Prefetch([[maybe_unused]] int64_t col) const {
#ifdef __CUDA_ARCH__
    if (per_column) asm volatile("prefetch.global.L1 [%0];" ::"l"(per_column + col));
#endif
  }

  ORT_RMSNORM_HD void Read(int64_t col, float (&gain)[E]) const {
    if (per_column) {
      const Packed<S, E> pack = Packed<S, E>::Load(per_column + col);
      ORT_RMSNORM_UNROLL
      for (int e = 0; e < E; ++e) gain[e] = pack.Get(e);
    } else {
      ORT_RMSNORM_UNROLL
      for (int e = 0; e < E; ++e) gain[e] = single;
    }
  }
};

// Sum of squares of N accesses into four float32 accumulators (at most 2 * N terms each), added in float32.
template <typename T, int E, int N>
ORT_RMSNORM_HD float SumOfSquares(const Packed<T, E> (&packs)[N]) {
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  ORT_RMSNORM_UNROLL
  for (int k = 0; k < N; ++k) {
    ORT_RMSNORM_UNROLL
    for (int e = 0; e < E; ++e) {
      const float v = packs[k].Get(e);
      acc[(k * E + e) % 4] = fmaf(v, v, acc[(k * E + e) % 4]);
    }
  }
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

template <typename T, int E>
ORT_RMSNORM_HD double SumOfSquaresInDouble(const Packed<T, E>& h) {
  double sum = 0.0;
  ORT_RMSNORM_UNROLL
  for (int e = 0; e < E; ++e) {
    const double v = h.Get(e);
    sum += v * v;
  }
  return sum;
}

// s = (x + skip) + bias in float32 for the access at column `col` (the bias term when there is one).
template <typename T, int E>
ORT_RMSNORM_HD void FormSum(const Packed<T, E>& a, const Packed<T, E>& b, const float* bias, int64_t col,
                            float (&sum)[E]) {
  ORT_RMSNORM_UNROLL
  for (int e = 0; e < E; ++e) sum[e] = a.Get(e) + b.Get(e);
  if (bias) {
    const Packed<float, E> add = Packed<float, E>::Load(bias + col);
    ORT_RMSNORM_UNROLL
    for (int e = 0; e < E; ++e) sum[e] += add.Get(e);
  }
}

// The normalized values of SkipRMSNorm's access at `col`: round_T(s) (what the unfused graph's Add produces), or s.
template <Skip kSkip, typename T, int E>
ORT_RMSNORM_HD Packed<Held<T, kSkip>, E> SkipSum(const Packed<T, E>& a, const Packed<T, E>& b, const float* bias,
                                                 int64_t col) {
  float sum[E];
  FormSum(a, b, bias, col, sum);
  return Packed<Held<T, kSkip>, E>::Round(sum);
}

// Held values rounded to T (the `sum` output of the float32 sum; no change for values held in T).
template <typename T, typename H, int E>
ORT_RMSNORM_HD Packed<T, E> RoundedTo(const Packed<H, E>& h) {
  if constexpr (std::is_same_v<H, T>) {
    return h;
  } else {
    float values[E];
    ORT_RMSNORM_UNROLL
    for (int e = 0; e < E; ++e) values[e] = h.Get(e);
    return Packed<T, E>::Round(values);
  }
}

// y = round_T((h * factor) * scale) with the products in Acc: float32, rounded once to T; or float64, for rows
// whose float32 statistic is not trustworthy, rounded double -> float -> T.
template <typename T, typename Acc, typename H, typename S, int E>
ORT_RMSNORM_HD Packed<T, E> Scaled(const Packed<H, E>& h, Acc factor, const ScaleReader<S, E>& scale, int64_t col) {
  float y[E];
  scale.Read(col, y);
  ORT_RMSNORM_UNROLL
  for (int e = 0; e < E; ++e) {
    y[e] = static_cast<float>((static_cast<Acc>(h.Get(e)) * factor) * static_cast<Acc>(y[e]));
  }
  return Packed<T, E>::Round(y);
}

// Where SkipRMSNorm keeps round_T(s) when the row is read a second time: the `sum` output, or y (overwritten later).
template <typename T, typename S>
ORT_RMSNORM_HD T* Staging(const RowArgs<T, S>& args) {
  return args.sum ? args.sum : args.y;
}

// One thread's share of a row held in registers: accesses t + k * G (k < N) of the row starting at element `base`;
// those past the row end are zeros and never stored. E divides cols, and cols fits in an int (rows up to 64 KiB).
// SkipRMSNorm with the float32 sum holds s in float32 and writes `sum` only with y, after the row's statistic: until
// then x and skip are unchanged (y and sum may alias them), so a row redone in float64 forms s again from them.
template <typename T, typename S, Skip kSkip, int E, int N>
struct RegisterRow {
  using Vec = Packed<T, E>;
  using HeldVec = Packed<Held<T, kSkip>, E>;
  HeldVec h[N];

  // Element offset of access k within the row, or -1 past the row end.
  ORT_RMSNORM_HD static int Offset(int k, int t, int group, int cols) {
    const int offset = (t + k * group) * E;
    return offset < cols ? offset : -1;
  }

  // Loads the row (every load issued before any use) and prefetches its gains, forms SkipRMSNorm's sum and stores
  // round_T(s) to `sum` (the rounded sum only), returns the float32 sum of squares of this thread's elements.
  ORT_RMSNORM_HD float Load(const RowArgs<T, S>& args, int64_t base, int t, int group,
                            const ScaleReader<S, E>& scale) {
    const int cols = static_cast<int>(args.cols);
    const T* x = args.x + base;
    Vec loaded[N];
    ORT_RMSNORM_UNROLL
    for (int k = 0; k < N; ++k) {
      const int offset = Offset(k, t, group, cols);
      loaded[k] = offset >= 0 ? Vec::Load(x + offset) : Vec::Zero();
    }
    ORT_RMSNORM_UNROLL
    for (int k = 0; k < N; ++k) {
      const int offset = Offset(k, t, group, cols);
      if (offset >= 0) scale.Prefetch(offset);
    }
    if constexpr (kSkip != Skip::kNone) {
      const T* skip = args.skip + base;
      Vec skipped[N];
      ORT_RMSNORM_UNROLL
      for (int k = 0; k < N; ++k) {
        const int offset = Offset(k, t, group, cols);
        skipped[k] = offset >= 0 ? Vec::Load(skip + offset) : Vec::Zero();
      }
      ORT_RMSNORM_UNROLL
      for (int k = 0; k < N; ++k) {
        const int offset = Offset(k, t, group, cols);
        h[k] = offset >= 0 ? SkipSum<kSkip>(loaded[k], skipped[k], args.bias, offset) : HeldVec::Zero();
      }
      if (kSkip == Skip::kRoundedSum && args.sum) Write(args.sum + base, t, group, cols);
    } else {
      ORT_RMSNORM_UNROLL
      for (int k = 0; k < N; ++k) h[k] = loaded[k];
    }
    return SumOfSquares(h);
  }

  // Before the row is redone in float64 from memory: SkipRMSNorm's rounded sum without a `sum` output is staged in
  // y (the float32 sum is formed again from x and skip).
  ORT_RMSNORM_HD void StageForRereading(const RowArgs<T, S>& args, int64_t base, int t, int group) const {
    if constexpr (kSkip == Skip::kRoundedSum) {
      if (!args.sum) Write(args.y + base, t, group, static_cast<int>(args.cols));
    }
  }

  ORT_RMSNORM_HD void Store(const RowArgs<T, S>& args, int64_t base, int t, int group, float factor,
                            const ScaleReader<S, E>& scale) const {
    const int cols = static_cast<int>(args.cols);
    T* y = args.y + base;
    ORT_RMSNORM_UNROLL
    for (int k = 0; k < N; ++k) {
      const int offset = Offset(k, t, group, cols);
      if (offset >= 0) Scaled<T>(h[k], factor, scale, offset).Store(y + offset);
    }
    if (kSkip == Skip::kFloat32Sum && args.sum) Write(args.sum + base, t, group, cols);
  }

 private:
  // round_T of the held values.
  ORT_RMSNORM_HD void Write(T* row, int t, int group, int cols) const {
    ORT_RMSNORM_UNROLL
    for (int k = 0; k < N; ++k) {
      const int offset = Offset(k, t, group, cols);
      if (offset >= 0) RoundedTo<T>(h[k]).Store(row + offset);
    }
  }
};

// One thread's share of a row read twice from memory (the same accesses t, t + G, ... as RegisterRow, so each
// element is read and written by one thread and y may alias x, sum alias skip): for rows too long for registers,
// and for the float64 redo of rows whose float32 statistic is not trustworthy. SkipRMSNorm's rounded sum is staged
// in `sum` (or y) by pass one; the float32 sum is formed again from x and skip in every pass, and `sum` written in
// the last, with y.
template <typename T, typename S, Skip kSkip, int E>
struct TwoPassRow {
  using Vec = Packed<T, E>;
  using HeldVec = Packed<Held<T, kSkip>, E>;

  // Pass one: float32 partial sums of one access (E <= 8 terms) added in float64; the rounded sum is staged.
  ORT_RMSNORM_HD static double Accumulate(const RowArgs<T, S>& args, int64_t base, int t, int group) {
    double total = 0.0;
    ForEachAccess(args, t, group, [&](int64_t i) {
      HeldVec h[1];
      if constexpr (kSkip == Skip::kNone) {
        h[0] = Vec::Load(args.x + base + i);
      } else {
        h[0] = SkipSum<kSkip>(Vec::Load(args.x + base + i), Vec::Load(args.skip + base + i), args.bias, i);
        if constexpr (kSkip == Skip::kRoundedSum) h[0].Store(Staging(args) + base + i);
      }
      total += SumOfSquares(h);
    });
    return total;
  }

  // The float64 statistic of the normalized row.
  ORT_RMSNORM_HD static double SumSquaresInDouble(const RowArgs<T, S>& args, int64_t base, int t, int group) {
    double total = 0.0;
    ForEachAccess(args, t, group, [&](int64_t i) { total += SumOfSquaresInDouble(Normalized(args, base, i)); });
    return total;
  }

  // Pass two, with the products in Acc (see Scaled).
  template <typename Acc>
  ORT_RMSNORM_HD static void Store(const RowArgs<T, S>& args, int64_t base, int t, int group, Acc factor,
                                   const ScaleReader<S, E>& scale) {
    T* y = args.y + base;
    ForEachAccess(args, t, group, [&](int64_t i) {
      const HeldVec h = Normalized(args, base, i);
      Scaled<T>(h, factor, scale, i).Store(y + i);
      if constexpr (kSkip == Skip::kFloat32Sum) {
        if (args.sum) RoundedTo<T>(h).Store(args.sum + base + i);
      }
    });
  }

 private:
  // The normalized values of the access at i, as they can be read again: x, the staged round_T(s), or s formed
  // again from x and skip.
  ORT_RMSNORM_HD static HeldVec Normalized(const RowArgs<T, S>& args, int64_t base, int64_t i) {
    if constexpr (kSkip == Skip::kNone) {
      return Vec::Load(args.x + base + i);
    } else if constexpr (kSkip == Skip::kRoundedSum) {
      return Vec::Load(Staging(args) + base + i);
    } else {
      return SkipSum<kSkip>(Vec::Load(args.x + base + i), Vec::Load(args.skip + base + i), args.bias, i);
    }
  }

  // fn(i) for each of this thread's accesses: elements [i, i + E) for i = t * E, (t + G) * E, ...
  template <class Fn>
  ORT_RMSNORM_HD static void ForEachAccess(const RowArgs<T, S>& args, int t, int group, const Fn& fn) {
    for (int64_t i = static_cast<int64_t>(t) * E; i < args.cols; i += static_cast<int64_t>(group) * E) fn(i);
  }
};

// ---- launch plan ------------------------------------------------------------------------------------------------

constexpr int kWarp = 32;
constexpr int kMaxThreads = 1024;
// Register kernel, 16-byte accesses: at most 8 per thread (two 8-vector sets live while SkipRMSNorm loads x and
// skip) and 512 threads per row, so up to 128 registers per thread: rows up to 64 KiB.
constexpr int kMaxVecs = 8;
constexpr int kMaxVectorThreads = 512;
// Register kernel, scalar fallback: 4 elements per thread, up to 1024 threads: rows up to 4096 elements.
constexpr int kScalarVecs = 4;
constexpr int kWarpRowsPerBlock = 8;  // G = 32: rows (warps) per block
constexpr int kTwoPassThreads = 1024;
constexpr int kMaxBlocksPerSm = 32;

// How one call is launched. `vecs` = 0 selects the two-pass kernel.
struct LaunchPlan {
  int width = 1;   // elements per access: 16 / sizeof(T), or 1 (scalar fallback)
  int vecs = 0;    // N, accesses per thread kept in registers
  int group = 0;   // G, threads per row
  int block = 0;   // threads per block (G * rows per block)
  int64_t grid = 0;
};

LaunchPlan PlanLaunch(const NormArgs& args, const DeviceInfo& device);

// Blocks of a plan's block and group that cover `rows` once each (the grid of one block per row block).
int64_t RowBlocks(const LaunchPlan& plan, int64_t rows);

// Grid sized to the GPU for a plan's block and group: at most as many blocks as the multiprocessors hold at once
// (each loops over rows), fewer when RowBlocks are fewer.
int64_t GpuSizedGrid(const LaunchPlan& plan, int64_t rows, const DeviceInfo& device);

// Launches the kernel variant of `plan` (PlanLaunch's, or another for the same call: gpu_check --plans).
cudaError_t LaunchWithPlan(const NormArgs& args, const LaunchPlan& plan, cudaStream_t stream);

// Calls visitor.template Run<T, S, kSkip, E, N>() for the kernel variant of `plan` (N = 0: two-pass).
template <typename T, typename S, Skip kSkip, class Visitor>
cudaError_t VisitShape(const LaunchPlan& plan, Visitor& visitor) {
  constexpr int kVector = 16 / static_cast<int>(sizeof(T));
  if (plan.width == 1) {
    return plan.vecs == 0 ? visitor.template Run<T, S, kSkip, 1, 0>()
                          : visitor.template Run<T, S, kSkip, 1, kScalarVecs>();
  }
  switch (plan.vecs) {
    case 1: return visitor.template Run<T, S, kSkip, kVector, 1>();
    case 2: return visitor.template Run<T, S, kSkip, kVector, 2>();
    case 4: return visitor.template Run<T, S, kSkip, kVector, 4>();
    case 8: return visitor.template Run<T, S, kSkip, kVector, 8>();
    default: return visitor.template Run<T, S, kSkip, kVector, 0>();
  }
}

// What a call normalizes (for float32 both SkipRMSNorm settings are the same computation: the rounded sum's).
template <typename T, typename S, class Visitor>
cudaError_t VisitSkip(const NormArgs& args, const LaunchPlan& plan, Visitor& visitor) {
  if (!args.skip) return VisitShape<T, S, Skip::kNone>(plan, visitor);
  if constexpr (!std::is_same_v<T, float>) {
    if (args.normalize_float32_sum) return VisitShape<T, S, Skip::kFloat32Sum>(plan, visitor);
  }
  return VisitShape<T, S, Skip::kRoundedSum>(plan, visitor);
}

template <typename T, class Visitor>
cudaError_t VisitVariant(const NormArgs& args, const LaunchPlan& plan, Visitor& visitor) {
  const bool float_scale = args.scale == nullptr || args.scale_type == ElementType::kFloat32;
  if constexpr (!std::is_same_v<T, float>) {
    if (!float_scale) return VisitSkip<T, T>(args, plan, visitor);
  }
  return VisitSkip<T, float>(args, plan, visitor);
}

template <typename T, typename S>
RowArgs<T, S> TypedArgs(const NormArgs& args) {
  return RowArgs<T, S>{static_cast<const T*>(args.x),      static_cast<const T*>(args.skip),
                       static_cast<T*>(args.sum),          static_cast<T*>(args.y),
                       static_cast<const S*>(args.scale),  args.scale_per_element,
                       args.skip ? args.bias : nullptr,    args.cols,
                       args.epsilon,                       args.eps_outside_sqrt};
}

// ---- kernels ----------------------------------------------------------------------------------------------------

// Shared memory of one block for GroupSum: two buffers of one double per warp.
using GroupSlots = double[2][kMaxThreads / kWarp];

// Sum over the row's group of threads; every thread gets the same value (the butterfly adds the same two operands
// on both lanes of each pair, and the warps' sums are added in one order). Groups wider than a warp are whole
// blocks; the buffers alternate (`phase`) so that one barrier per sum suffices.
__device__ __forceinline__ double GroupSum(double value, int group, GroupSlots& slots, int& phase) {
  ORT_RMSNORM_UNROLL
  for (int mask = kWarp / 2; mask > 0; mask /= 2) value += __shfl_xor_sync(0xFFFFFFFFu, value, mask);
  if (group == kWarp) return value;
  double* slot = slots[phase];
  phase ^= 1;
  if (threadIdx.x % kWarp == 0) slot[threadIdx.x / kWarp] = value;
  __syncthreads();
  double total = 0.0;
  for (int w = 0; w < group / kWarp; ++w) total += slot[w];
  return total;
}

// The whole row again in float64, read from memory (rare: kept out of line, away from the kernels' registers).
// Returns the next phase of `slots`.
template <typename T, typename S, Skip kSkip, int E>
__device__ __noinline__ int RedoRowInDouble(RowArgs<T, S> args, int64_t base, int t, int group,
                                            ScaleReader<S, E> scale, GroupSlots& slots, int phase) {
  using Row = TwoPassRow<T, S, kSkip, E>;
  const double sum_squares = GroupSum(Row::SumSquaresInDouble(args, base, t, group), group, slots, phase);
  const double factor = InverseRms(sum_squares, args.cols, args.epsilon, args.eps_outside_sqrt);
  Row::Store(args, base, t, group, factor, scale);  // products in float64
  return phase;
}

template <int E>
constexpr int RegisterKernelMaxThreads() {
  return E == 1 ? kMaxThreads : kMaxVectorThreads;
}

// Rows in registers. A block holds `blockDim.x / group` rows (several only when group == 32); grid-stride over rows.
template <typename T, typename S, Skip kSkip, int E, int N>
__global__ void __launch_bounds__(RegisterKernelMaxThreads<E>())
    RegisterRowsKernel(RowArgs<T, S> args, int64_t rows, int group) {
  __shared__ GroupSlots slots;
  int phase = 0;
  const int rows_per_block = blockDim.x / group;
  const int t = threadIdx.x % group;
  const ScaleReader<S, E> scale(args);
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * rows_per_block; first < rows;
       first += static_cast<int64_t>(gridDim.x) * rows_per_block) {
    const int64_t row = first + threadIdx.x / group;
    if (row >= rows) continue;  // whole warps only: a group wider than a warp is the whole block
    const int64_t base = row * args.cols;
    RegisterRow<T, S, kSkip, E, N> slice;
    const double sum_squares = GroupSum(slice.Load(args, base, t, group, scale), group, slots, phase);
    if (FastPathIsAccurate(sum_squares, args.epsilon)) {  // the same for every thread of the group
      const double factor = InverseRms(sum_squares, args.cols, args.epsilon, args.eps_outside_sqrt);
      slice.Store(args, base, t, group, static_cast<float>(factor), scale);
    } else {
      slice.StageForRereading(args, base, t, group);
      phase = RedoRowInDouble<T, S, kSkip, E>(args, base, t, group, scale, slots, phase);
    }
  }
}

// Rows read twice: one block per row, grid-stride over rows.
template <typename T, typename S, Skip kSkip, int E>
__global__ void __launch_bounds__(kTwoPassThreads) TwoPassRowsKernel(RowArgs<T, S> args, int64_t rows) {
  __shared__ GroupSlots slots;
  int phase = 0;
  const int group = blockDim.x;
  const int t = threadIdx.x;
  const ScaleReader<S, E> scale(args);
  using Row = TwoPassRow<T, S, kSkip, E>;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t base = row * args.cols;
    const double sum_squares = GroupSum(Row::Accumulate(args, base, t, group), group, slots, phase);
    if (FastPathIsAccurate(sum_squares, args.epsilon)) {
      const double factor = InverseRms(sum_squares, args.cols, args.epsilon, args.eps_outside_sqrt);
      Row::Store(args, base, t, group, static_cast<float>(factor), scale);
    } else {
      phase = RedoRowInDouble<T, S, kSkip, E>(args, base, t, group, scale, slots, phase);
    }
  }
}

// Launches the kernel variant of a plan on a stream.
struct KernelLauncher {
  const NormArgs& args;
  const LaunchPlan& plan;
  cudaStream_t stream;

  template <typename T, typename S, Skip kSkip, int E, int N>
  cudaError_t Run() const {
    const RowArgs<T, S> typed = TypedArgs<T, S>(args);
    const dim3 grid(static_cast<unsigned>(plan.grid)), block(static_cast<unsigned>(plan.block));
    if constexpr (N == 0) {
      TwoPassRowsKernel<T, S, kSkip, E><<<grid, block, 0, stream>>>(typed, args.rows);
    } else {
      RegisterRowsKernel<T, S, kSkip, E, N><<<grid, block, 0, stream>>>(typed, args.rows, plan.group);
    }
    return cudaGetLastError();
  }
};

template <typename T>
cudaError_t LaunchVariantOf(const NormArgs& args, const LaunchPlan& plan, cudaStream_t stream) {
  const KernelLauncher launcher{args, plan, stream};
  return VisitVariant<T>(args, plan, launcher);
}

// One translation unit per element type (rmsnorm_kernels_<type>.cu), so the variants compile in parallel.
cudaError_t LaunchFloat32(const NormArgs& args, const LaunchPlan& plan, cudaStream_t stream);
cudaError_t LaunchFloat16(const NormArgs& args, const LaunchPlan& plan, cudaStream_t stream);
cudaError_t LaunchBFloat16(const NormArgs& args, const LaunchPlan& plan, cudaStream_t stream);

}  // namespace cuda
}  // namespace ort_rmsnorm
