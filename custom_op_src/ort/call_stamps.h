// Per-part timestamps of the CPU ops' Compute, for finding where a call's time goes (benchmarks/cold_call.py
// --stamps-library). Compiled in only with ORT_RMSNORM_CALL_STAMPS (never in a release build): each
// ORT_RMSNORM_STAMP(part) adds the time-stamp counter ticks since the previous stamp to `part`'s samples, and the
// medians are printed to stderr when the process exits.
#pragma once

#ifdef ORT_RMSNORM_CALL_STAMPS
#include <x86intrin.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

namespace ort_rmsnorm::stamps {
namespace {

enum Part { kEntry, kPrefetch, kGetX, kDimsX, kInputX, kInputSkip, kOutputY, kOutputSum, kColumns, kKernel, kExit,
            kParts };
constexpr const char* kPartNames[kParts] = {"entry", "prefetch", "get X", "X's dims", "X's data", "skip",
                                             "allocate Y", "allocate sum", "scale", "kernel", "return"};

struct Samples {
  std::vector<uint64_t> ticks[kParts];
  uint64_t last = 0;
  ~Samples() {
    if (ticks[kEntry].empty()) return;
    std::fprintf(stderr, "call stamps (median ticks over %zu calls):", ticks[kEntry].size());
    for (int p = 1; p < kParts; ++p) {
      std::vector<uint64_t>& t = ticks[p];
      if (t.empty()) continue;
      std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
      std::fprintf(stderr, " %s %llu;", kPartNames[p], static_cast<unsigned long long>(t[t.size() / 2]));
    }
    std::fprintf(stderr, "\n");
  }
};
Samples samples;

inline void Record(Part part) {
  const uint64_t now = __rdtsc();
  if (part != kEntry) samples.ticks[part].push_back(now - samples.last);
  else samples.ticks[kEntry].push_back(0);
  samples.last = __rdtsc();
}

}  // namespace
}  // namespace ort_rmsnorm::stamps
#define ORT_RMSNORM_STAMP(part) ::ort_rmsnorm::stamps::Record(::ort_rmsnorm::stamps::part)
#else
#define ORT_RMSNORM_STAMP(part) ((void)0)
#endif
