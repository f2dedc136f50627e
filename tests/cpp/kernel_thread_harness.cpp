// The CPU kernels driven from many threads the way onnxruntime drives them, without onnxruntime: built with
// -fsanitize=thread by scripts/test-tsan, which fails on any ThreadSanitizer report. Every output is also compared
// bit for bit with the same call run on one thread (after the first use, before the threaded runs).
//
//   1. First use: the threads are released together before anything in the process has selected the kernels; each
//      picks them (SelectCpuKernels, CpuKernelsFor of every instruction set) and runs a call at once.
//   2. Shared calls, as the intra-op pool runs one: every thread claims tasks of RowsPerTask rows of one batch in
//      turn (an atomic counter, as KernelContext_ParallelFor claims them), each task with its scratch from the
//      call's CallMemory and the calling thread's ones for an absent scale (CallMemory::Ones), on shared inputs;
//      every other round with nothing kept by the threads (CallMemory(0)), so that the tasks borrow and return the
//      call's own scratch blocks concurrently, as rows beyond kKeptBytes do.
//   3. Concurrent calls, as concurrent runs of one session: each thread runs whole calls of its own on the same
//      inputs, in an order of its own, so that its kept scratch grows and is reused across calls and sizes.
// Calls: float32, float16, bfloat16; RMSNorm and SkipRMSNorm (with and without sum, bias, the float32 sum, no
// scale); rows in cache and rows written with streaming stores (pipelined); every instruction set this CPU runs.
//
//   kernel_thread_harness [--threads N] [--rounds R]
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "kernel_test_support.h"  // AlignedBuffer, Expect, Summary
#include "thread_scratch.h"

using namespace ort_rmsnorm;

namespace {

// Threads wait until all have arrived; reusable.
class Barrier {
 public:
  explicit Barrier(int count) : count_(count) {}
  void Wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    const int64_t generation = generation_;
    if (++waiting_ == count_) {
      waiting_ = 0;
      ++generation_;
      released_.notify_all();
      return;
    }
    released_.wait(lock, [&] { return generation_ != generation; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable released_;
  const int count_;
  int waiting_ = 0;
  int64_t generation_ = 0;
};

// The settings of one kernel call.
struct Call {
  std::string name;
  int type = 0;  // 0 float32, 1 float16, 2 bfloat16
  int64_t rows = 0, cols = 0;
  bool skip = false, sum = false, scale = false, bias = false, float32_sum = false, streaming = false;
};

size_t ElementBytes(int type) { return type == 0 ? 4 : 2; }
const char* TypeOfCall(int type) { return type == 0 ? "float32" : type == 1 ? "float16" : "bfloat16"; }

// The inputs every thread reads, large enough for the largest call: random values rounded to each type.
struct SharedInputs {
  AlignedBuffer<float> x32, skip32;
  AlignedBuffer<Float16> x16, skip16;
  AlignedBuffer<BFloat16> xb, skipb;
  std::vector<float> scale, bias[3];  // bias: values of each type, as float32
  explicit SharedInputs(size_t n) : x32(n), skip32(n), x16(n), skip16(n), xb(n), skipb(n), scale(n) {
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.3f, 1.0f);
    for (size_t i = 0; i < n; ++i) {
      x32[i] = normal(rng);
      skip32[i] = normal(rng) / 32;  // small against x: rounding the sum to T changes it
      x16[i] = FromFloat<Float16>(x32[i]);
      skip16[i] = FromFloat<Float16>(skip32[i]);
      xb[i] = FromFloat<BFloat16>(x32[i]);
      skipb[i] = FromFloat<BFloat16>(skip32[i]);
      scale[i] = 0.5f + std::abs(normal(rng)) / 2;
    }
    for (auto& b : bias) b.resize(n);
    for (size_t i = 0; i < n; ++i) {
      const float v = normal(rng) / 16;
      bias[0][i] = v;
      bias[1][i] = ToFloat(FromFloat<Float16>(v));
      bias[2][i] = ToFloat(FromFloat<BFloat16>(v));
    }
  }
};

// The outputs of one call, 64-byte aligned (streaming stores need it).
struct Outputs {
  size_t bytes;
  AlignedBuffer<unsigned char> y, sum;
  explicit Outputs(const Call& call)
      : bytes(static_cast<size_t>(call.rows * call.cols) * ElementBytes(call.type)), y(bytes), sum(bytes) {}
  bool SameAs(const Outputs& other, bool with_sum) {
    return std::memcmp(y.data(), const_cast<Outputs&>(other).y.data(), bytes) == 0 &&
           (!with_sum || std::memcmp(sum.data(), const_cast<Outputs&>(other).sum.data(), bytes) == 0);
  }
};

class Harness {
 public:
  Harness(int threads, int rounds) : threads_(threads), rounds_(rounds), barrier_(threads) {
    // Rows in cache, and rows of whole cache lines written with streaming stores (the kernels pipeline those).
    const int64_t shapes[][3] = {{64, 1000, 0}, {7, 33, 0}, {48, 1024, 1}, {3, 4096, 0}, {8, 2048, 1}};
    for (int type = 0; type < 3; ++type) {
      for (const auto& shape : shapes) {
        for (int op = 0; op < 5; ++op) {  // RMSNorm; SkipRMSNorm with sum; without scale; with bias and float32 sum
          Call call;
          call.type = type;
          call.rows = shape[0], call.cols = shape[1], call.streaming = shape[2] != 0;
          call.skip = op > 0;
          call.sum = op == 1 || op == 3;
          call.scale = op != 2;
          call.bias = call.float32_sum = op >= 3;
          call.name = std::string(TypeOfCall(type)) + " " + (call.skip ? "SkipRMSNorm" : "RMSNorm") +
                      (call.sum ? " sum" : "") + (call.bias ? " bias float32-sum" : "") +
                      (call.scale ? "" : " no-scale") + (call.streaming ? " streaming" : "") + " " +
                      std::to_string(call.rows) + "x" + std::to_string(call.cols);
          calls_.push_back(call);
        }
      }
    }
    size_t largest = 0;
    for (const Call& call : calls_) largest = std::max(largest, static_cast<size_t>(call.rows * call.cols));
    inputs_ = std::make_unique<SharedInputs>(largest);
    selected_.resize(static_cast<size_t>(threads));
  }

  int Run() {
    std::vector<std::thread> threads;
    for (int t = 0; t < threads_; ++t) threads.emplace_back([this, t] { Worker(t); });
    for (std::thread& thread : threads) thread.join();
    bool same_selection = true;
    for (const auto& selection : selected_) same_selection = same_selection && selection == selected_.front();
    Expect(same_selection, "every thread selects the same kernels");
    for (const std::string& failure : failures_) std::printf("FAIL: %s\n", failure.c_str());
    g_checks += static_cast<int>(checked_.load());
    g_failures += static_cast<int>(failed_.load());
    std::printf("%d threads, instruction sets:", threads_);
    for (const CpuKernels* kernels : isas_) std::printf(" %s", kernels->isa);
    std::printf("; %zu calls x %d rounds each: %lld tasks of shared calls, %lld concurrent calls, %lld outputs "
                "bit-checked against one thread's\n",
                calls_.size(), rounds_, static_cast<long long>(tasks_run_.load()),
                static_cast<long long>(concurrent_calls_.load()), static_cast<long long>(checked_.load()));
    return Summary();
  }

 private:
  template <typename F>
  void WithInputs(const Call& call, const F& fn) {
    if (call.type == 0) {
      fn(inputs_->x32.data(), inputs_->skip32.data());
    } else if (call.type == 1) {
      fn(inputs_->x16.data(), inputs_->skip16.data());
    } else {
      fn(inputs_->xb.data(), inputs_->skipb.data());
    }
  }

  // Rows [begin, end) of `call` into `out`, as the glue runs a task: a copy of the batch with the task's scratch
  // from `memory`, and `ones` (the calling thread's) for an absent scale.
  void RunRows(const CpuKernels& kernels, const Call& call, Outputs& out, CallMemory& memory, const float* ones,
               int64_t begin, int64_t end) {
    WithInputs(call, [&](const auto* x, const auto* skip) {
      using T = std::remove_cv_t<std::remove_pointer_t<decltype(x)>>;
      RowBatch<T> batch;
      batch.x = x;
      batch.skip = call.skip ? skip : nullptr;
      batch.y = reinterpret_cast<T*>(out.y.data());
      batch.sum = call.skip && call.sum ? reinterpret_cast<T*>(out.sum.data()) : nullptr;
      batch.scale = call.scale ? inputs_->scale.data() : ones;
      batch.bias = call.skip && call.bias ? inputs_->bias[call.type].data() : nullptr;
      batch.normalize_float32_sum = call.float32_sum;
      batch.cols = call.cols;
      batch.streaming_stores = call.streaming;
      const CallMemory::Scratch scratch = memory.TaskScratch(static_cast<size_t>(ScratchBytes(batch)));
      batch.scratch = scratch.data();
      kernels.get<T>()(batch, begin, end);
    });
  }

  void RunCall(const CpuKernels& kernels, const Call& call, Outputs& out) {
    CallMemory memory;
    RunRows(kernels, call, out, memory, memory.Ones(static_cast<size_t>(call.cols)), 0, call.rows);
  }

  int64_t RowsPerTaskOf(const Call& call) const {
    const int64_t tensors = 2 + (call.skip ? 1 : 0) + (call.sum ? 1 : 0);
    return RowsPerTask(call.rows, tensors * call.cols * static_cast<int64_t>(ElementBytes(call.type)),
                       call.streaming);
  }

  void Check(bool ok, const std::string& what) {
    checked_.fetch_add(1);
    if (ok) return;
    failed_.fetch_add(1);
    std::lock_guard<std::mutex> lock(failures_mutex_);
    if (failures_.size() < 30) failures_.push_back(what);
  }

  void Worker(int t) {
    barrier_.Wait();  // released together: nothing in the process has selected the kernels yet
    const char* error = nullptr;
    std::vector<const CpuKernels*>& selected = selected_[static_cast<size_t>(t)];
    selected.push_back(SelectCpuKernels(nullptr, &error));
    for (CpuIsa isa : kAllCpuIsas) {
      if (const CpuKernels* kernels = CpuKernelsFor(isa)) selected.push_back(kernels);
    }
    {
      const Call& call = calls_[static_cast<size_t>(t * 11) % calls_.size()];
      Outputs first(call);
      RunCall(*selected.front(), call, first);  // at once, through the dispatch's choice
    }
    barrier_.Wait();
    if (t == 0) isas_.assign(selected.begin() + 1, selected.end());
    barrier_.Wait();

    for (const CpuKernels* kernels : isas_) {
      // One thread's outputs of every call: what the threaded runs must reproduce bit for bit.
      if (t == 0) {
        expected_.clear();
        for (const Call& call : calls_) {
          expected_.push_back(std::make_unique<Outputs>(call));
          RunCall(*kernels, call, *expected_.back());
        }
      }
      barrier_.Wait();
      for (int round = 0; round < rounds_; ++round) {
        // Shared calls: thread 0 prepares each as the calling thread does; every thread claims its tasks.
        for (size_t c = 0; c < calls_.size(); ++c) {
          const Call& call = calls_[c];
          if (t == 0) {
            shared_out_ = std::make_unique<Outputs>(call);
            shared_memory_ = std::make_unique<CallMemory>(round % 2 ? 0 : kKeptBytes);
            shared_ones_ = shared_memory_->Ones(static_cast<size_t>(call.cols));
            next_row_.store(0);
          }
          barrier_.Wait();
          const int64_t per_task = RowsPerTaskOf(call);
          for (int64_t begin; (begin = next_row_.fetch_add(per_task)) < call.rows;) {
            RunRows(*kernels, call, *shared_out_, *shared_memory_, shared_ones_, begin,
                    std::min(call.rows, begin + per_task));
            tasks_run_.fetch_add(1);
          }
          barrier_.Wait();
          if (t == 0) {
            Check(shared_out_->SameAs(*expected_[c], call.sum),
                  std::string(kernels->isa) + " " + call.name + ": a call shared by the threads differs from one "
                  "thread's");
          }
        }
        // Concurrent calls: every thread runs whole calls of its own, from a call of its own on.
        for (size_t k = 0; k < calls_.size(); ++k) {
          const size_t c = (k + static_cast<size_t>(t) * 7) % calls_.size();
          const Call& call = calls_[c];
          Outputs out(call);
          RunCall(*kernels, call, out);
          concurrent_calls_.fetch_add(1);
          Check(out.SameAs(*expected_[c], call.sum),
                std::string(kernels->isa) + " " + call.name + ": a concurrent call differs from one thread's");
        }
        barrier_.Wait();
      }
    }
  }

  const int threads_, rounds_;
  Barrier barrier_;
  std::vector<Call> calls_;
  std::unique_ptr<SharedInputs> inputs_;
  std::vector<std::vector<const CpuKernels*>> selected_;  // per thread: the dispatch's choice, then every set
  std::vector<const CpuKernels*> isas_;
  std::vector<std::unique_ptr<Outputs>> expected_;
  // The shared call in progress: set by thread 0 before the barrier that starts it.
  std::unique_ptr<Outputs> shared_out_;
  std::unique_ptr<CallMemory> shared_memory_;
  const float* shared_ones_ = nullptr;
  std::atomic<int64_t> next_row_{0};
  std::atomic<int64_t> tasks_run_{0}, concurrent_calls_{0}, checked_{0}, failed_{0};
  std::mutex failures_mutex_;
  std::vector<std::string> failures_;
};

}  // namespace

int main(int argc, char** argv) {
  int threads = 8, rounds = 2;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
      threads = std::max(2, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) {
      rounds = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s [--threads N] [--rounds R]\n", argv[0]);
      return 2;
    }
  }
  return Harness(threads, rounds).Run();
}
