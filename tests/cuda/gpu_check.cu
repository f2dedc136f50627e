// Standalone check of the CUDA kernels, without onnxruntime (custom_op_src/cuda launchers called directly).
//
//   ort_rmsnorm_gpu_check [--json FILE] [--quick] [--no-bench] [--plans]
//       on a GPU: numerics of every type pair, row length (odd sizes, scalar fallback, two-pass), both epsilon
//       placements, epsilon 0, SkipRMSNorm with and without `sum`, in place, misaligned pointers, scale layouts
//       (none, per element, one value, broadcast), rows whose statistic needs float64, NaN/inf, against a float64
//       reference computed on the host; CUDA graph capture; then the benchmark (unless --no-bench): RMSNorm and
//       SkipRMSNorm against a device-to-device copy of the same bytes, decode latency against an empty kernel;
//       with --plans, also other launch plans for the same calls (more threads per row, a grid of every row block),
//       the data for tuning PlanLaunch.
//   ort_rmsnorm_gpu_check --emulate [--quick]
//       no GPU needed: the kernels' row code (rmsnorm_kernels.cuh, host-compiled) run by the CPU under the same
//       launch plans, against the same reference. Checks the indexing, plans and numerics, not the GPU.
//
// Exit status: 0 when every numerics check passed, 1 on any mismatch, 2 on a CUDA error.
//
// The units: gpu_check.h (what they share), gpu_executor.cu (the GPU or the emulation), gpu_check_numerics.cu,
// gpu_bench.cu, and this file (the options, the run and its report).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_check.h"

namespace gpu_check {

// ---- JSON ------------------------------------------------------------------------------------------------------

std::string JsonString(const std::string& text) {
  std::string out = "\"";
  for (char ch : text) {
    if (ch == '"' || ch == '\\') out += '\\';
    if (static_cast<unsigned char>(ch) < 0x20) continue;
    out += ch;
  }
  return out + "\"";
}

void WriteJson(const char* path, const Executor& executor, const Results& results, const std::vector<BenchRow>& bench,
               double empty_us) {
  const std::string temporary = std::string(path) + ".tmp";
  FILE* f = std::fopen(temporary.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "cannot write %s\n", path);
    std::exit(2);
  }
  std::string device = "cpu emulation";
  int l2_bytes = 0;
  if (!executor.emulate()) {
    cudaDeviceProp props;
    CHECK_CUDA(cudaGetDeviceProperties(&props, 0));
    device = props.name;
    l2_bytes = props.l2CacheSize;
  }
  std::fprintf(f, "{\n  \"device\": %s,\n  \"sm_count\": %d,\n  \"l2_bytes\": %d,\n", JsonString(device).c_str(),
               executor.device().sm_count, l2_bytes);
  std::fprintf(f, "  \"numerics\": {\"checks\": %d, \"failures\": %d, \"first_failures\": [", results.checks,
               results.failures);
  for (size_t i = 0; i < results.messages.size(); ++i) {
    std::fprintf(f, "%s%s", i ? ", " : "", JsonString(results.messages[i]).c_str());
  }
  std::fprintf(f, "]},\n  \"empty_kernel_us\": %.3f,\n  \"timing\": \"CUDA graph of back-to-back calls, CUDA events; "
                  "inputs rotate through 1 GiB pools\",\n  \"bench\": [",
               empty_us);
  for (size_t i = 0; i < bench.size(); ++i) {
    const BenchRow& r = bench[i];
    std::fprintf(f,
                 "%s\n    {\"op\": \"%s\", \"dtype\": \"%s\", \"rows\": %lld, \"hidden\": %lld, \"bytes\": %.0f, "
                 "\"norm_us\": %.3f, \"copy_us\": %.3f, \"norm_gbps\": %.1f, \"fraction_of_copy\": %.4f, ",
                 i ? "," : "", r.op.c_str(), cuda::ElementTypeName(r.type), static_cast<long long>(r.rows),
                 static_cast<long long>(r.cols), r.bytes, r.norm_us, r.copy_us, r.bytes / r.norm_us / 1e3,
                 r.copy_us / r.norm_us);
    if (r.rows == 1) std::fprintf(f, "\"warm_us\": %.3f, ", r.warm_us);
    std::fprintf(f, "\"other_plans\": [");
    for (size_t k = 0; k < r.other_plans_us.size(); ++k) {
      std::fprintf(f, "%s{\"plan\": %s, \"us\": %.3f}", k ? ", " : "", JsonString(r.other_plans_us[k].first).c_str(),
                   r.other_plans_us[k].second);
    }
    std::fprintf(f, "]}");
  }
  std::fprintf(f, "\n  ]\n}\n");
  std::fclose(f);
  std::rename(temporary.c_str(), path);
}

}  // namespace gpu_check

int main(int argc, char** argv) {
  using namespace gpu_check;
  bool emulate = false, quick = false, bench = true, other_plans = false;
  const char* json = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--emulate")) {
      emulate = true;
    } else if (!std::strcmp(argv[i], "--quick")) {
      quick = true;
    } else if (!std::strcmp(argv[i], "--no-bench")) {
      bench = false;
    } else if (!std::strcmp(argv[i], "--plans")) {
      other_plans = true;
    } else if (!std::strcmp(argv[i], "--json") && i + 1 < argc) {
      json = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--emulate] [--quick] [--no-bench] [--plans] [--json FILE]\n", argv[0]);
      return 2;
    }
  }
  Executor executor(emulate);
  if (emulate) {
    std::printf("CPU emulation of the kernels' row code (no GPU used)\n");
  } else {
    cudaDeviceProp props;
    CHECK_CUDA(cudaGetDeviceProperties(&props, 0));
    std::printf("device: %s, %d SMs, L2 %d MiB, compute capability %d.%d\n", props.name, props.multiProcessorCount,
                props.l2CacheSize >> 20, props.major, props.minor);
  }

  const auto start = std::chrono::steady_clock::now();
  Results results;
  RunNumerics(executor, results, quick);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("numerics: %d checks, %d failures (%.1f s)\n", results.checks, results.failures, seconds);

  std::vector<BenchRow> rows;
  double empty_us = 0.0;
  if (!emulate && bench) {
    rows = RunBenchmark(executor, quick, other_plans, &empty_us);
    PrintBenchmark(rows, empty_us);
  }
  if (json) WriteJson(json, executor, results, rows, empty_us);
  std::printf("%d passed, %d failed\n", results.checks - results.failures, results.failures);
  return results.failures == 0 ? 0 : 1;
}
