// kernel_bench: the CPU row kernels timed without onnxruntime against memcpy of the same bytes, with streaming
// stores also against a streaming copy (the least traffic those stores allow, see StreamingCopy), and against a
// plain two-pass loop (float16 RMSNorm only: the same arithmetic without the kernels' structure, see
// PlainFloat16Rows). On the calling thread, or with --threads N on N threads claiming the library's tasks of rows
// (RowsPerTask) in turn.
// Every contender runs once per repetition, in turn, so that a change of the machine's state reaches them all; the
// median of each is printed. Built with the kernel tests (ORT_RMSNORM_BUILD_TESTS); see benchmarks/README.md.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <new>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "kernel_test_support.h"  // AlignedBuffer, AvailableIsas (tests/cpp)
#include "thread_scratch.h"       // the scratch the library's CPU glue gives each thread

namespace ort_rmsnorm {
namespace {

struct Options {
  std::string dtype = "float16";
  int64_t rows = 2048;
  int64_t cols = 4096;
  bool skip = false;
  bool bias = false;
  bool float32_sum = false;
  bool streaming = false;
  int repetitions = 21;
  int threads = 1;
  std::vector<std::string> isas;  // empty: every one this CPU runs
};

const char kUsage[] =
    "usage: kernel_bench [--dtype float32|float16|bfloat16] [--rows R] [--cols H] [--skip [--bias] [--float32-sum]]\n"
    "                    [--streaming] [--repetitions N] [--threads N] [--isa NAME[,NAME...]]\n"
    "  --skip        SkipRMSNorm (X + skip, writing Y and sum) instead of RMSNorm\n"
    "  --bias        SkipRMSNorm with a bias row (X + skip + bias)\n"
    "  --float32-sum SkipRMSNorm normalizing the float32 sum (normalize_float32_sum = 1)\n"
    "  --streaming   write the outputs with streaming stores, as the library does for outputs of 8 MB or more\n"
    "  --threads     run every contender on N threads, claiming the library's tasks of rows in turn (wall time)\n"
    "  --isa         kernel sets to time (default: every one this CPU runs):";

// kUsage, ending with the instruction sets' names (kCpuIsaNames).
std::string Usage() {
  std::string text = kUsage;
  for (const char* name : kCpuIsaNames) text += std::string(text.back() == ':' ? " " : ", ") + name;
  return text + "\n";
}

[[noreturn]] void Fail(const std::string& message) {
  std::fprintf(stderr, "kernel_bench: %s\n%s", message.c_str(), Usage().c_str());
  std::exit(2);
}

int64_t PositiveInteger(const char* flag, const char* text) {
  char* end = nullptr;
  const long long value = std::strtoll(text, &end, 10);
  if (end == text || *end != '\0' || value <= 0) {
    Fail(std::string(flag) + " needs a positive integer, not '" + text + "'");
  }
  return value;
}

Options Parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&]() -> const char* {
      if (i + 1 >= argc) Fail(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--dtype") {
      options.dtype = value();
      if (options.dtype != "float32" && options.dtype != "float16" && options.dtype != "bfloat16") {
        Fail("unknown --dtype '" + options.dtype + "'");
      }
    } else if (arg == "--rows") {
      options.rows = PositiveInteger("--rows", value());
    } else if (arg == "--cols") {
      options.cols = PositiveInteger("--cols", value());
    } else if (arg == "--repetitions") {
      options.repetitions = static_cast<int>(PositiveInteger("--repetitions", value()));
    } else if (arg == "--threads") {
      options.threads = static_cast<int>(std::min<int64_t>(PositiveInteger("--threads", value()), 1024));
    } else if (arg == "--skip") {
      options.skip = true;
    } else if (arg == "--bias") {
      options.bias = true;
    } else if (arg == "--float32-sum") {
      options.float32_sum = true;
    } else if (arg == "--streaming") {
      options.streaming = true;
    } else if (arg == "--isa") {
      std::string list = value();
      for (size_t start = 0; start <= list.size();) {
        const size_t comma = std::min(list.find(',', start), list.size());
        options.isas.push_back(list.substr(start, comma - start));
        start = comma + 1;
      }
    } else if (arg == "-h" || arg == "--help") {
      std::printf("%s", Usage().c_str());
      std::exit(0);
    } else {
      Fail("unknown argument '" + arg + "'");
    }
  }
  if (options.cols > (int64_t{1} << 40) / options.rows) Fail("--rows times --cols is too large");
  if ((options.bias || options.float32_sum) && !options.skip) Fail("--bias and --float32-sum need --skip");
  return options;
}

// The calling thread's CPU time on one thread (other processes' time slices do not count); wall time on several.
double Seconds(int threads) {
  if (threads > 1) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  timespec now;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

// The CPU as cpuid names it (vendor, family, model, stepping, brand), for the head of the results: which kernels win
// depends on the core, and a forced kernel set runs on whatever CPU this is.
std::string CpuLine() {
#if defined(__x86_64__) || defined(_M_X64)
  unsigned regs[4] = {0, 0, 0, 0};
  if (!__get_cpuid(0, &regs[0], &regs[1], &regs[2], &regs[3])) return "unknown x86-64 CPU";
  char vendor[13] = {0};
  std::memcpy(vendor, &regs[1], 4);
  std::memcpy(vendor + 4, &regs[3], 4);
  std::memcpy(vendor + 8, &regs[2], 4);
  __get_cpuid(1, &regs[0], &regs[1], &regs[2], &regs[3]);
  const unsigned base_family = (regs[0] >> 8) & 0xF, base_model = (regs[0] >> 4) & 0xF;
  const unsigned family = base_family == 0xF ? base_family + ((regs[0] >> 20) & 0xFF) : base_family;
  const unsigned model = base_family == 0x6 || base_family == 0xF ? (((regs[0] >> 16) & 0xF) << 4) | base_model
                                                                  : base_model;
  char brand[49] = {0};
  for (unsigned leaf = 0; leaf < 3; ++leaf) {
    unsigned* out = reinterpret_cast<unsigned*>(brand + 16 * leaf);
    if (!__get_cpuid(0x80000002 + leaf, &out[0], &out[1], &out[2], &out[3])) break;
  }
  return std::string(vendor) + " family " + std::to_string(family) + " model " + std::to_string(model) +
         " stepping " + std::to_string(regs[0] & 0xF) + " (" + brand + ")";
#else
  return "a CPU without cpuid";
#endif
}

// A contender processes rows [begin, end) of the input.
using RowRangeFn = std::function<void(int64_t begin, int64_t end)>;

struct Contender {
  std::string name;
  RowRangeFn rows;
  std::vector<double> seconds;  // per call, one per repetition
};

// One call of a contender: all rows on the calling thread, or on `threads` threads that claim the library's tasks
// in turn (RowsPerTask rows each; each thread is started per call, for every contender alike).
void RunCall(const RowRangeFn& rows_fn, int64_t rows, int64_t rows_per_task, int threads) {
  if (threads == 1) {
    rows_fn(0, rows);
    return;
  }
  std::atomic<int64_t> next{0};
  const auto work = [&] {
    for (int64_t begin; (begin = next.fetch_add(rows_per_task)) < rows;) {
      rows_fn(begin, std::min(rows, begin + rows_per_task));
    }
  };
  std::vector<std::thread> helpers;
  for (int t = 1; t < threads; ++t) helpers.emplace_back(work);
  work();
  for (std::thread& helper : helpers) helper.join();
}

#if defined(__x86_64__) || defined(_M_X64)
#define KERNEL_BENCH_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,fma,f16c")))

KERNEL_BENCH_AVX512 __m512 LoadFloat16(const Float16* p) {
  return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(p)));
}

// Float16 RMSNorm in its plainest AVX-512 form: per row, widen and square-add 64 values per step into four float32
// accumulators, then widen, multiply by the factor and the scale, narrow and store a line per 32 values. No
// prefetching, pipelining or partial vectors: the kernels' arithmetic without their structure, to show what that
// structure adds or saves (requires cols to be a multiple of 64 and line-aligned rows).
KERNEL_BENCH_AVX512 void PlainFloat16Rows(const RowBatch<Float16>& batch, int64_t begin, int64_t end) {
  const int64_t n = batch.cols;
  for (int64_t r = begin; r < end; ++r) {
    const Float16* x = batch.x + r * n;
    Float16* y = batch.y + r * n;
    const float* scale = batch.scale;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t i = 0; i < n; i += 64) {
      const __m512 v0 = LoadFloat16(x + i), v1 = LoadFloat16(x + i + 16), v2 = LoadFloat16(x + i + 32),
                   v3 = LoadFloat16(x + i + 48);
      a0 = _mm512_fmadd_ps(v0, v0, a0);
      a1 = _mm512_fmadd_ps(v1, v1, a1);
      a2 = _mm512_fmadd_ps(v2, v2, a2);
      a3 = _mm512_fmadd_ps(v3, v3, a3);
    }
    const double sum = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
    const __m512 factor = _mm512_set1_ps(static_cast<float>(1.0 / std::sqrt(sum / n + batch.epsilon)));
    for (int64_t i = 0; i < n; i += 32) {
      const __m512 lo = _mm512_mul_ps(_mm512_mul_ps(LoadFloat16(x + i), factor), _mm512_load_ps(scale + i));
      const __m512 hi = _mm512_mul_ps(_mm512_mul_ps(LoadFloat16(x + i + 16), factor), _mm512_load_ps(scale + i + 16));
      const __m512i line = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtps_ph(lo, _MM_FROUND_TO_NEAREST_INT)),
                                              _mm512_cvtps_ph(hi, _MM_FROUND_TO_NEAREST_INT), 1);
      if (batch.streaming_stores) {
        _mm512_stream_si512(reinterpret_cast<__m512i*>(y + i), line);
      } else {
        _mm512_store_si512(y + i, line);
      }
    }
  }
  if (batch.streaming_stores) _mm_sfence();
}

// `bytes` bytes (a multiple of 64, 64-byte aligned) from src to dst, with streaming stores: each byte read once
// and written once around the cache, the least memory traffic the kernels' streaming stores allow.
void StreamingCopy(void* dst, const void* src, size_t bytes) {
  const __m128i* from = static_cast<const __m128i*>(src);
  __m128i* to = static_cast<__m128i*>(dst);
  for (size_t i = 0; i < bytes / 16; i += 4) {
    const __m128i a = _mm_load_si128(from + i), b = _mm_load_si128(from + i + 1), c = _mm_load_si128(from + i + 2),
                  d = _mm_load_si128(from + i + 3);
    _mm_stream_si128(to + i, a);
    _mm_stream_si128(to + i + 1, b);
    _mm_stream_si128(to + i + 2, c);
    _mm_stream_si128(to + i + 3, d);
  }
  _mm_sfence();
}
#endif

template <typename T>
int Run(const Options& options) {
  if (options.streaming && options.cols * static_cast<int64_t>(sizeof(T)) % 64 != 0) {
    Fail("--streaming needs rows of whole cache lines (--cols times the element size a multiple of 64 bytes), "
         "as the library does");
  }
  const int64_t count = options.rows * options.cols;
  std::mt19937 random(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  AlignedBuffer<T> x(count), skip(options.skip ? count : 0), y(count), sum(options.skip ? count : 0);
  AlignedBuffer<T> copy(options.skip ? 2 * count : count);
  AlignedBuffer<float> scale(options.cols), bias(options.cols);
  for (int64_t i = 0; i < count; ++i) x[i] = FromFloat<T>(normal(random));
  for (int64_t i = 0; i < (options.skip ? count : 0); ++i) skip[i] = FromFloat<T>(normal(random));
  for (int64_t i = 0; i < options.cols; ++i) scale[i] = 1.0f + 0.1f * normal(random);
  for (int64_t i = 0; i < options.cols; ++i) bias[i] = ToFloat(FromFloat<T>(0.1f * normal(random)));

  RowBatch<T> batch;
  batch.x = x.data();
  batch.skip = options.skip ? skip.data() : nullptr;
  batch.sum = options.skip ? sum.data() : nullptr;
  batch.y = y.data();
  batch.scale = scale.data();
  batch.bias = options.bias ? bias.data() : nullptr;
  batch.normalize_float32_sum = options.float32_sum;
  batch.cols = options.cols;
  batch.streaming_stores = options.streaming;

  const int tensors = options.skip ? 4 : 2;
  const double bytes = static_cast<double>(tensors) * count * sizeof(T);
  const int64_t n = options.cols;
  // The copies move each input's rows [begin, end) (X, and skip) to the copy buffer.
  const auto copy_rows = [&](void (*copy_fn)(void*, const void*, size_t)) {
    return [&, copy_fn](int64_t begin, int64_t end) {
      const size_t row_bytes = static_cast<size_t>(n) * sizeof(T);
      copy_fn(copy.data() + begin * n, x.data() + begin * n, static_cast<size_t>(end - begin) * row_bytes);
      if (options.skip) {
        copy_fn(copy.data() + count + begin * n, skip.data() + begin * n, static_cast<size_t>(end - begin) * row_bytes);
      }
    };
  };
  std::vector<Contender> contenders;
  // The references of the "x memcpy" and "x stream copy" columns.
  const size_t memcpy_index = contenders.size();
  contenders.push_back({"memcpy", copy_rows([](void* d, const void* s, size_t b) { std::memcpy(d, s, b); }), {}});
  std::optional<size_t> stream_copy_index;  // with --streaming on x86-64
#if defined(__x86_64__) || defined(_M_X64)
  if (options.streaming) {
    stream_copy_index = contenders.size();
    contenders.push_back({"stream copy", copy_rows(StreamingCopy), {}});
  }
  if constexpr (std::is_same_v<T, Float16>) {
    // Its instructions are those of the avx512 kernels: available where the dispatch table offers them.
    if (!options.skip && options.cols % 64 == 0 && CpuKernelsFor(CpuIsa::kAvx512)) {
      const auto plain = [&](int64_t begin, int64_t end) { PlainFloat16Rows(batch, begin, end); };
      contenders.push_back({"plain loop", plain, {}});
    }
  }
#endif
  for (const CpuKernels* kernels : AvailableIsas()) {
    const bool wanted = options.isas.empty() ||
                        std::find(options.isas.begin(), options.isas.end(), kernels->isa) != options.isas.end();
    if (wanted) {
      const RowsFn<T> rows = kernels->get<T>();
      const auto scratch_bytes = static_cast<size_t>(ScratchBytes(batch));
      const auto kernel = [&batch, rows, scratch_bytes](int64_t begin, int64_t end) {
        CallMemory memory;  // as the library's CPU glue calls the kernels: with the call's scratch for the task
        RowBatch<T> task = batch;
        const CallMemory::Scratch scratch = memory.TaskScratch(scratch_bytes);
        task.scratch = scratch.data();
        rows(task, begin, end);
      };
      contenders.push_back({kernels->isa, kernel, {}});
    }
  }
  for (const std::string& name : options.isas) {
    const auto named = [&](const Contender& contender) { return contender.name == name; };
    const bool found = std::any_of(contenders.begin(), contenders.end(), named);
    if (!found) Fail("kernel set '" + name + "' is not in this build or not supported by this CPU");
  }

  // Calls per sample: at least 64 MB moved, so that small cases outlast the clock's resolution.
  const int calls = static_cast<int>(std::max(1.0, std::ceil(64.0 * 1024 * 1024 / bytes)));
  const int threads = options.threads;
  const int64_t rows_per_task = RowsPerTask(options.rows, tensors * n * static_cast<int64_t>(sizeof(T)),
                                            options.streaming);
  const auto call = [&](const Contender& contender) {
    RunCall(contender.rows, options.rows, rows_per_task, threads);
  };
  for (Contender& contender : contenders) call(contender);  // warm-up: first touch
  for (int repetition = 0; repetition < options.repetitions; ++repetition) {
    for (Contender& contender : contenders) {
      const double start = Seconds(threads);
      for (int c = 0; c < calls; ++c) call(contender);
      contender.seconds.push_back((Seconds(threads) - start) / calls);
    }
  }

  const std::string on = threads == 1 ? "one thread" : std::to_string(threads) + " threads";
  const std::string op = !options.skip ? "RMSNorm"
                         : std::string("SkipRMSNorm") + (options.bias ? " with bias" : "") +
                               (options.float32_sum ? " (float32 sum)" : "");
  std::printf("CPU: %s\n", CpuLine().c_str());
  std::printf("%s %s, %lld x %lld, %s stores, %s, %d repetitions of %d calls (medians, %s)\n",
              op.c_str(), options.dtype.c_str(), static_cast<long long>(options.rows),
              static_cast<long long>(options.cols), options.streaming ? "streaming" : "ordinary", on.c_str(),
              options.repetitions, calls, threads == 1 ? "thread CPU time" : "wall time");
  std::printf("%-12s %12s %10s %8s %10s%s\n", "contender", "us per call", "ns per el", "GB/s", "x memcpy",
              stream_copy_index ? "  x stream copy" : "");
  std::vector<double> medians;
  for (Contender& contender : contenders) {
    std::sort(contender.seconds.begin(), contender.seconds.end());
    medians.push_back(contender.seconds[contender.seconds.size() / 2]);
  }
  for (size_t c = 0; c < contenders.size(); ++c) {
    std::printf("%-12s %12.1f %10.4f %8.1f %10.2f", contenders[c].name.c_str(), medians[c] * 1e6,
                medians[c] * 1e9 / count, bytes / medians[c] * 1e-9, medians[c] / medians[memcpy_index]);
    if (stream_copy_index) std::printf(" %15.2f", medians[c] / medians[*stream_copy_index]);
    std::printf("\n");
  }
  return 0;
}

}  // namespace
}  // namespace ort_rmsnorm

int main(int argc, char** argv) {
  using namespace ort_rmsnorm;
  const Options options = Parse(argc, argv);
  try {
    if (options.dtype == "float32") return Run<float>(options);
    if (options.dtype == "float16") return Run<Float16>(options);
    return Run<BFloat16>(options);
  } catch (const std::bad_alloc&) {
    Fail("cannot allocate the buffers of " + std::to_string(options.rows) + " x " + std::to_string(options.cols));
  }
}
