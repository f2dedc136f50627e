// Shared by the C++ kernel test programs (no onnxruntime): check counting, facts about the element types, and the
// tolerance of the kernels versus a float64 reference, which is the op's contract (README, "Numerics").
#pragma once

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

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

template <typename T>
const char* TypeName();
template <>
const char* TypeName<float>() { return "float32"; }
template <>
const char* TypeName<Float16>() { return "float16"; }
template <>
const char* TypeName<BFloat16>() { return "bfloat16"; }

// Unit roundoff of T (half an ulp at 1).
template <typename T>
double UnitRoundoff();
template <>
double UnitRoundoff<float>() { return std::ldexp(1.0, -24); }
template <>
double UnitRoundoff<Float16>() { return std::ldexp(1.0, -11); }
template <>
double UnitRoundoff<BFloat16>() { return std::ldexp(1.0, -8); }

// Smallest positive subnormal of T: the absolute error floor of rounding to T.
template <typename T>
double SmallestSubnormal();
template <>
double SmallestSubnormal<float>() { return std::ldexp(1.0, -149); }
template <>
double SmallestSubnormal<Float16>() { return std::ldexp(1.0, -24); }
template <>
double SmallestSubnormal<BFloat16>() { return std::ldexp(1.0, -133); }

// Relative tolerance against the float64 reference: one rounding to T, plus float32 arithmetic (factor, two
// products) and float32 partial sums of at most 32 terms (see row_algorithm.h), in units of float32 roundoff.
template <typename T>
double RelativeTolerance() {
  return UnitRoundoff<T>() + 40.0 * std::ldexp(1.0, -24);
}

// `got` matches the float64 reference `want`: NaN exactly where the reference is NaN, equal infinities, otherwise
// within SmallestSubnormal<T>() + RelativeTolerance<T>() * |want|.
template <typename T>
bool WithinTolerance(double got, double want) {
  if (std::isnan(want) || std::isnan(got)) return std::isnan(want) && std::isnan(got);
  if (got == want) return true;
  return std::fabs(got - want) <= SmallestSubnormal<T>() + RelativeTolerance<T>() * std::fabs(want);
}

bool SameBits(float a, float b) { return FloatBits(a) == FloatBits(b) || (std::isnan(a) && std::isnan(b)); }

}  // namespace
}  // namespace ort_rmsnorm
