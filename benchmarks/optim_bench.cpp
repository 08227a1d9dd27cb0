// bench_optim: the CPU AdamW step against an "Adam-shaped" STREAM ceiling measured in the same
// run (read 4 fp32 arrays, write 3; 28 B/element), and oneTBB's load balancing against a static
// split when another thread keeps one core busy.
//
//   BM_AdamW/<elements>/<threads>/<copy>   copy 0: fp32 (28 B/element), 1: + bf16 copy (30 B)
//     counters: GB/s (ours), ceiling_GB/s (the STREAM kernel, interleaved with ours iteration by
//     iteration on the same buffers and threads), pct_of_ceiling = 100 x GB/s / ceiling_GB/s,
//     pct_median: the same ratio per (step, ceiling) pair, median over the iterations
//   BM_AdamW_BusyNeighbour/<elements>: while a spinning thread pinned to the last CPU runs,
//     each iteration steps once with oneTBB blocks (2 threads) and once with static halves on
//     2 std::threads pinned one per CPU (OpenMP schedule(static) with OMP_PROC_BIND); counters
//     tbb_GB/s, static_GB/s, tbb_speedup_median (static / oneTBB time, median over iteration
//     pairs). The reported time is oneTBB's.
//
// Run: build/<dir>/benchmarks/bench_optim [--benchmark_format=json]
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include "benchmarks/benchmark_main.hpp"

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/partitioner.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "zero/cpu_features.hpp"
#include "zero/memory.hpp"
#include "zero/optimizer.hpp"

namespace {

using zero::AllocOptions;
using zero::Buffer;
using zero::MemCategory;

constexpr std::size_t kBlock = 65536;  // the optimizer's default block (elements)

// ---- the ceiling: the memory traffic of Adam with trivial arithmetic
// a = a*0.5 + b*0.25; c = c*0.5 + b*0.25; d = d*0.5 + b*0.25 (bounded values; reads a b c d,
// writes a c d). AVX-512 when the CPU has it, else the compiler's baseline vectorisation.
__attribute__((target("avx512f"))) void stream_avx512(float* a, const float* b, float* c, float* d,
                                                      std::size_t n) {
  const __m512 h = _mm512_set1_ps(0.5f), q = _mm512_set1_ps(0.25f);
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 bq = _mm512_mul_ps(_mm512_loadu_ps(b + i), q);
    _mm512_storeu_ps(a + i, _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(a + i), h), bq));
    _mm512_storeu_ps(c + i, _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(c + i), h), bq));
    _mm512_storeu_ps(d + i, _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(d + i), h), bq));
  }
  for (; i < n; ++i) {
    a[i] = a[i] * 0.5f + b[i] * 0.25f;
    c[i] = c[i] * 0.5f + b[i] * 0.25f;
    d[i] = d[i] * 0.5f + b[i] * 0.25f;
  }
}

void stream_plain(float* a, const float* b, float* c, float* d, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    a[i] = a[i] * 0.5f + b[i] * 0.25f;
    c[i] = c[i] * 0.5f + b[i] * 0.25f;
    d[i] = d[i] * 0.5f + b[i] * 0.25f;
  }
}

// ---- one AdamW shard in huge-page, pre-faulted host memory
struct Shard {
  zero::MemoryTracker tracker;
  Buffer p, g, m, v, copy;
  zero::ShardRef ref;

  Shard(std::size_t n, bool with_copy) {
    AllocOptions pre;
    pre.prefault = true;
    p = Buffer::host(tracker, MemCategory::kMasterParams, n * 4, pre);
    g = Buffer::host(tracker, MemCategory::kGradients, n * 4, pre);
    m = Buffer::host(tracker, MemCategory::kOptimizerState, n * 4, pre);
    v = Buffer::host(tracker, MemCategory::kOptimizerState, n * 4, pre);
    if (with_copy) copy = Buffer::host(tracker, MemCategory::kParams16, n * 2, pre);
    float* pf = p.as<float>();
    float* gf = g.as<float>();
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n, kBlock),
                      [&](const tbb::blocked_range<std::size_t>& r) {
                        for (std::size_t i = r.begin(); i != r.end(); ++i) {
                          pf[i] = 0.01f * static_cast<float>(i % 1000) - 5.0f;
                          gf[i] = 0.001f * static_cast<float>(i % 777) - 0.3f;
                        }
                      });
    ref.count = n;
    ref.master = pf;
    ref.grad = gf;
    ref.grad_dtype = zero::DType::kF32;
    ref.state[0] = m.data();
    ref.state[1] = v.data();
    if (with_copy) {
      ref.param_copy = copy.data();
      ref.param_copy_dtype = zero::DType::kBF16;
    }
  }
};

zero::OptimizerParams adamw() {
  zero::OptimizerParams hp;
  hp.type = zero::OptimizerType::kAdamW;
  hp.lr = 1e-4;
  hp.weight_decay = 0.01;
  return hp;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// ---- BM_AdamW
void BM_AdamW(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const int threads = static_cast<int>(state.range(1));
  const bool with_copy = state.range(2) != 0;
  Shard s(n, with_copy);
  zero::CpuExecOptions o;
  o.threads = threads;
  zero::CpuOptimizer opt(o);
  opt.init_state(adamw(), s.ref);
  tbb::task_arena arena(threads);
  const bool avx512 = zero::isa_supported(zero::Isa::kAvx512);
  auto ceiling = [&] {
    arena.execute([&] {
      tbb::parallel_for(
          tbb::blocked_range<std::size_t>(0, (n + kBlock - 1) / kBlock, 1),
          [&](const tbb::blocked_range<std::size_t>& r) {
            for (std::size_t b = r.begin(); b != r.end(); ++b) {
              const std::size_t i = b * kBlock, len = std::min(kBlock, n - i);
              float* a = s.p.as<float>() + i;
              const float* bb = s.g.as<float>() + i;
              float* c = s.m.as<float>() + i;
              float* d = s.v.as<float>() + i;
              avx512 ? stream_avx512(a, bb, c, d, len) : stream_plain(a, bb, c, d, len);
            }
          },
          tbb::simple_partitioner());
    });
  };
  const zero::OptimizerParams hp = adamw();
  // Warm up both (page tables, TBB workers), then interleave: the same conditions for both.
  opt.step(hp, s.ref, 1);
  ceiling();
  opt.init_state(hp, s.ref);
  double ours_s = 0, ceiling_s = 0;
  std::vector<double> ratios;  // per iteration: ceiling time / our time
  std::int64_t step = 1;
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    opt.step(hp, s.ref, step++);
    const double t = seconds_since(t0);
    ours_s += t;
    state.SetIterationTime(t);
    t0 = std::chrono::steady_clock::now();
    ceiling();
    const double tc = seconds_since(t0);
    ceiling_s += tc;
    ratios.push_back(tc / t);
    // The ceiling kernel rewrote m and v with finite values; the next step stays finite.
  }
  const double iters = static_cast<double>(state.iterations());
  const double bytes_ours = static_cast<double>(n) * (with_copy ? 30.0 : 28.0);
  const double bytes_ceiling = static_cast<double>(n) * 28.0;
  const double ours = bytes_ours * iters / ours_s / 1e9;
  const double ceil = bytes_ceiling * iters / ceiling_s / 1e9;
  state.counters["GB/s"] = ours;
  state.counters["ceiling_GB/s"] = ceil;
  state.counters["pct_of_ceiling"] = 100.0 * ours / ceil;
  // The same ratio taken pair by pair (each step against the ceiling run right after it) and
  // the median kept: robust to other processes taking a core for part of the run.
  std::nth_element(ratios.begin(), ratios.begin() + ratios.size() / 2, ratios.end());
  state.counters["pct_median"] = 100.0 * ratios[ratios.size() / 2] * bytes_ours / bytes_ceiling;
  state.SetLabel(std::string(zero::to_string(opt.isa())) + (with_copy ? " +bf16 copy" : " fp32"));
}

// ---- BM_AdamW_BusyNeighbour
void pin_to_cpu(unsigned cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

struct Spinner {
  std::atomic<bool> stop{false};
  std::thread t;
  Spinner() {
    t = std::thread([this] {
      volatile std::uint64_t x = 0;
      while (!stop.load(std::memory_order_relaxed)) x = x + 1;
    });
    const unsigned ncpu = std::thread::hardware_concurrency();
    if (ncpu > 1) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(ncpu - 1, &set);
      pthread_setaffinity_np(t.native_handle(), sizeof(set), &set);
    }
  }
  ~Spinner() {
    stop = true;
    t.join();
  }
};

void BM_AdamW_BusyNeighbour(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  Shard s(n, false);
  const zero::OptimizerParams hp = adamw();
  zero::CpuExecOptions dyn;
  dyn.threads = 2;
  zero::CpuOptimizer tbb_opt(dyn);
  // Static: each std::thread steps its half in one call (one block: no oneTBB inside), pinned
  // one per CPU: the split `#pragma omp parallel for schedule(static)` makes with
  // OMP_PROC_BIND=true. oneTBB's workers are left to the OS scheduler, as by default.
  const std::size_t half = (n / 2 + 63) / 64 * 64;
  zero::CpuExecOptions one;
  one.block_elems = half;
  zero::CpuOptimizer static_opt(one);
  zero::ShardRef lo = s.ref, hi = s.ref;
  lo.count = half;
  hi.count = n - half;
  hi.master += half;
  hi.grad = static_cast<const float*>(s.ref.grad) + half;
  hi.state[0] = static_cast<float*>(s.ref.state[0]) + half;
  hi.state[1] = static_cast<float*>(s.ref.state[1]) + half;
  tbb_opt.init_state(hp, s.ref);
  tbb_opt.step(hp, s.ref, 1);
  Spinner spinner;
  std::int64_t step = 2;
  double tbb_s = 0, static_s = 0;
  std::vector<double> speedups;  // per iteration: static time / oneTBB time
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    tbb_opt.step(hp, s.ref, step++);
    const double t_tbb = seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    std::thread a([&] {
      pin_to_cpu(0);
      static_opt.step(hp, lo, step);
    });
    std::thread b([&] {
      pin_to_cpu(std::thread::hardware_concurrency() - 1);
      static_opt.step(hp, hi, step);
    });
    a.join();
    b.join();
    ++step;
    const double t_static = seconds_since(t0);
    tbb_s += t_tbb;
    static_s += t_static;
    speedups.push_back(t_static / t_tbb);
    state.SetIterationTime(t_tbb);
  }
  const double bytes = static_cast<double>(n) * 28.0 * static_cast<double>(state.iterations());
  state.counters["tbb_GB/s"] = bytes / tbb_s / 1e9;
  state.counters["static_GB/s"] = bytes / static_s / 1e9;
  std::nth_element(speedups.begin(), speedups.begin() + speedups.size() / 2, speedups.end());
  state.counters["tbb_speedup_median"] = speedups[speedups.size() / 2];
  state.SetLabel("oneTBB blocks vs static halves, one core shared with a spinner");
}

}  // namespace

BENCHMARK(BM_AdamW)
    ->ArgNames({"elements", "threads", "copy"})
    ->ArgsProduct({{16 << 20, 64 << 20}, {1, 2}, {0, 1}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->MinTime(1.0);

BENCHMARK(BM_AdamW_BusyNeighbour)
    ->ArgNames({"elements"})
    ->Arg(16 << 20)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->MinTime(1.0);

ZERO_BENCHMARK_MAIN("bench_optim")
