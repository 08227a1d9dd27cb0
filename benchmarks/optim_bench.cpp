// bench_optim: the CPU AdamW step against an "Adam-shaped" STREAM ceiling measured in the same
// run (read 4 fp32 arrays, write 3; 28 B/element), and oneTBB's load balancing against a static
// split when another thread keeps one core busy.
//
//   BM_AdamW/<elements>/<threads>/<copy>/<moments>   copy 0: none, 1: + bf16 copy (2 B more);
//     moments 0: f32 (28 B/element), 1: bf16 (20 B), 2: int8 (16 B + 2 x 4 B per 256-element
//     block for the absmax scales: 16.0625 B), each against a ceiling of its own bytes: the
//     STREAM kernel reads the master and gradient (f32) and the two moment arrays (f32, bf16 or
//     bytes) and writes the master and the moments, with trivial arithmetic
//     counters: GB/s (ours), ceiling_GB/s (the STREAM kernel, interleaved with ours iteration by
//     iteration on the same buffers and threads), pct_of_ceiling = 100 x GB/s / ceiling_GB/s,
//     pct_median: the same ratio per (step, ceiling) pair, median over the iterations;
//     instr_per_elem and ceiling_instr_per_elem: user-space instructions retired per element by
//     every thread of the process during the steps and during the ceiling runs (hardware
//     counters through perf_event_open; where the host has none the label says so and the
//     counters are absent); cpu_ns_per_elem, ceiling_cpu_ns_per_elem: the CPU time the same way
//     (task-clock, a software counter: present in VMs) and cpu_pct_of_ceiling the CPU-time
//     ratio as pct_of_ceiling (what the step costs a core, apart from the time other processes
//     took it); nonfinite and subnormal: values in the shard's buffers after the run (a
//     non-finite value fails the benchmark: exit status 1)
//   BM_AdamW_Int8Speedup/<elements>/<threads>: the f32-moment and the int8-moment step (bf16
//     copy, f32 gradients) interleaved iteration by iteration; speedup_median = f32 time / int8
//     time per pair (the bytes say 30 / 18.06 = 1.66), f32_GB/s and int8_GB/s
//   BM_AdamW_BusyNeighbour/<elements>: while a spinning thread pinned to the last CPU runs,
//     each iteration steps once with oneTBB blocks (2 threads) and once with static halves on
//     2 std::threads pinned one per CPU (OpenMP schedule(static) with OMP_PROC_BIND); counters
//     tbb_GB/s, static_GB/s, tbb_speedup_median (static / oneTBB time, median over iteration
//     pairs). The reported time is oneTBB's.
//
// The data stay finite and normal for every iteration: the gradients are never 0, and the
// ceiling kernels write every value back unchanged (x * 1 + g * 0, moments of 16 or 8 bits
// xor 0, the factors opaque to the compiler), so what each step reads is what the step before
// it wrote: the state of a run of that many steps on a fixed gradient.
//
// Run: build/<dir>/benchmarks/bench_optim [--benchmark_format=json]
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>

#include <cmath>
#include <cstring>
#include <string>

#include "benchmarks/benchmark_main.hpp"
#include "benchmarks/process_counter.hpp"

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

#include "zero/core/cpu_features.hpp"
#include "zero/core/dtype.hpp"
#include "zero/device/memory.hpp"
#include "zero/optim/optimizer.hpp"

namespace {

using zero::AllocOptions;
using zero::Buffer;
using zero::MemCategory;

constexpr std::size_t kBlock = 65536;  // the optimizer's default block (elements)

// ---- the ceiling: the memory traffic of Adam with trivial arithmetic
// a = a*keep + b*mix; c = c*keep + b*mix; d = d*keep + b*mix (reads a b c d, writes a c d) with
// keep = 1, mix = 0 passed in at run time: every value written back as it was (finite b).
// AVX-512 when the CPU has it, else the compiler's baseline vectorisation.
__attribute__((target("avx512f"))) void stream_avx512(float* a, const float* b, float* c, float* d,
                                                      std::size_t n, float keep, float mix) {
  const __m512 h = _mm512_set1_ps(keep), q = _mm512_set1_ps(mix);
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 bq = _mm512_mul_ps(_mm512_loadu_ps(b + i), q);
    _mm512_storeu_ps(a + i, _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(a + i), h), bq));
    _mm512_storeu_ps(c + i, _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(c + i), h), bq));
    _mm512_storeu_ps(d + i, _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(d + i), h), bq));
  }
  for (; i < n; ++i) {
    a[i] = a[i] * keep + b[i] * mix;
    c[i] = c[i] * keep + b[i] * mix;
    d[i] = d[i] * keep + b[i] * mix;
  }
}

void stream_plain(float* a, const float* b, float* c, float* d, std::size_t n, float keep,
                  float mix) {
  for (std::size_t i = 0; i < n; ++i) {
    a[i] = a[i] * keep + b[i] * mix;
    c[i] = c[i] * keep + b[i] * mix;
    d[i] = d[i] * keep + b[i] * mix;
  }
}

// The same with moments of 16 or 8 bits, each xor `flip` (0 at run time: the moment bytes, bf16
// values or int8 records, written back as they were), so the traffic is that of the moment
// arrays' bytes.
__attribute__((target("avx512f,avx512bw"))) void stream16_avx512(float* a, const float* b,
                                                                 std::uint16_t* c, std::uint16_t* d,
                                                                 std::size_t n, float keep,
                                                                 float mix, std::uint16_t flip) {
  const __m512 h = _mm512_set1_ps(keep), q = _mm512_set1_ps(mix);
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 bq = _mm512_mul_ps(_mm512_loadu_ps(b + i), q);
    _mm512_storeu_ps(a + i, _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(a + i), h), bq));
    auto* pc = reinterpret_cast<__m256i*>(c + i);
    auto* pd = reinterpret_cast<__m256i*>(d + i);
    const __m256i one = _mm256_set1_epi16(static_cast<short>(flip));
    _mm256_storeu_si256(pc, _mm256_xor_si256(_mm256_loadu_si256(pc), one));
    _mm256_storeu_si256(pd, _mm256_xor_si256(_mm256_loadu_si256(pd), one));
  }
  for (; i < n; ++i) {
    a[i] = a[i] * keep + b[i] * mix;
    c[i] ^= flip;
    d[i] ^= flip;
  }
}

__attribute__((target("avx512f,avx512bw"))) void stream8_avx512(float* a, const float* b,
                                                                std::uint8_t* c, std::uint8_t* d,
                                                                std::size_t n, float keep,
                                                                float mix, std::uint8_t flip) {
  const __m512 h = _mm512_set1_ps(keep), q = _mm512_set1_ps(mix);
  const __m128i one = _mm_set1_epi8(static_cast<char>(flip));
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 bq = _mm512_mul_ps(_mm512_loadu_ps(b + i), q);
    _mm512_storeu_ps(a + i, _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(a + i), h), bq));
    auto* pc = reinterpret_cast<__m128i*>(c + i);
    auto* pd = reinterpret_cast<__m128i*>(d + i);
    _mm_storeu_si128(pc, _mm_xor_si128(_mm_loadu_si128(pc), one));
    _mm_storeu_si128(pd, _mm_xor_si128(_mm_loadu_si128(pd), one));
  }
  for (; i < n; ++i) {
    a[i] = a[i] * keep + b[i] * mix;
    c[i] ^= flip;
    d[i] ^= flip;
  }
}

template <typename T>
void stream_narrow_plain(float* a, const float* b, T* c, T* d, std::size_t n, float keep, float mix,
                         T flip) {
  for (std::size_t i = 0; i < n; ++i) {
    a[i] = a[i] * keep + b[i] * mix;
    c[i] ^= flip;
    d[i] ^= flip;
  }
}

// ---- one AdamW shard in huge-page, pre-faulted host memory
struct Shard {
  zero::MemoryTracker tracker;
  Buffer p, g, m, v, copy;
  zero::ShardRef ref;
  zero::MomentDType moments;

  Shard(std::size_t n, bool with_copy, zero::MomentDType md = zero::MomentDType::kF32)
      : moments(md) {
    AllocOptions pre;
    pre.prefault = true;
    p = Buffer::host(tracker, MemCategory::kMasterParams, n * 4, pre);
    g = Buffer::host(tracker, MemCategory::kGradients, n * 4, pre);
    m = Buffer::host(tracker, MemCategory::kOptimizerState, zero::state_bytes(md, n), pre);
    v = Buffer::host(tracker, MemCategory::kOptimizerState, zero::state_bytes(md, n), pre);
    if (with_copy) copy = Buffer::host(tracker, MemCategory::kParams16, n * 2, pre);
    float* pf = p.as<float>();
    float* gf = g.as<float>();
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n, kBlock),
                      [&](const tbb::blocked_range<std::size_t>& r) {
                        for (std::size_t i = r.begin(); i != r.end(); ++i) {
                          pf[i] = 0.01f * static_cast<float>(i % 1000) - 5.0f;
                          // In [-0.2995, 0.4765], never 0 (|g| >= 0.0005): no moment decays.
                          gf[i] = 0.001f * static_cast<float>(i % 777) - 0.2995f;
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

zero::OptimizerParams adamw(zero::MomentDType md = zero::MomentDType::kF32) {
  zero::OptimizerParams hp;
  hp.type = zero::OptimizerType::kAdamW;
  hp.lr = 1e-4;
  hp.weight_decay = 0.01;
  hp.moment_dtype = md;
  return hp;
}

// Bytes per element the step moves: master read + written, f32 gradient read, each moment read
// and written (int8: with its block's absmax), the copy written.
double step_bytes(zero::MomentDType md, bool with_copy) {
  const double moment = static_cast<double>(zero::state_bytes(md, zero::kInt8MomentBlock)) /
                        static_cast<double>(zero::kInt8MomentBlock);
  return 8.0 + 4.0 + 4.0 * moment + (with_copy ? 2.0 : 0.0);
}
// What the STREAM kernel for these moments moves: the same without the copy and the scales.
double ceiling_bytes(zero::MomentDType md) {
  const double moment =
      md == zero::MomentDType::kF32 ? 4.0 : (md == zero::MomentDType::kBF16 ? 2.0 : 1.0);
  return 8.0 + 4.0 + 4.0 * moment;
}

// The STREAM kernel over shard s's arrays, block by block as the optimizer splits the work.
void run_ceiling(Shard& s, std::size_t n, tbb::task_arena& arena) {
  const bool avx512 = zero::isa_supported(zero::Isa::kAvx512);
  // The identity's factors, read from volatiles: constants the compiler could fold away (and
  // with them the loads and stores of the moments) if it saw them.
  volatile float keep_v = 1.0f, mix_v = 0.0f;
  volatile std::uint8_t flip_v = 0;
  const float keep = keep_v, mix = mix_v;
  const std::uint8_t flip8 = flip_v;
  const auto flip16 = static_cast<std::uint16_t>(flip8);
  arena.execute([&] {
    tbb::parallel_for(
        tbb::blocked_range<std::size_t>(0, (n + kBlock - 1) / kBlock, 1),
        [&](const tbb::blocked_range<std::size_t>& r) {
          for (std::size_t b = r.begin(); b != r.end(); ++b) {
            const std::size_t i = b * kBlock, len = std::min(kBlock, n - i);
            float* a = s.p.as<float>() + i;
            const float* bb = s.g.as<float>() + i;
            switch (s.moments) {
              case zero::MomentDType::kF32: {
                float* c = s.m.as<float>() + i;
                float* d = s.v.as<float>() + i;
                avx512 ? stream_avx512(a, bb, c, d, len, keep, mix)
                       : stream_plain(a, bb, c, d, len, keep, mix);
                break;
              }
              case zero::MomentDType::kBF16: {
                auto* c = s.m.as<std::uint16_t>() + i;
                auto* d = s.v.as<std::uint16_t>() + i;
                avx512 ? stream16_avx512(a, bb, c, d, len, keep, mix, flip16)
                       : stream_narrow_plain(a, bb, c, d, len, keep, mix, flip16);
                break;
              }
              case zero::MomentDType::kInt8: {
                auto* c = s.m.as<std::uint8_t>() + i;
                auto* d = s.v.as<std::uint8_t>() + i;
                avx512 ? stream8_avx512(a, bb, c, d, len, keep, mix, flip8)
                       : stream_narrow_plain(a, bb, c, d, len, keep, mix, flip8);
                break;
              }
            }
          }
        },
        tbb::simple_partitioner());
  });
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// ---- what the buffers hold after a run: non-finite and subnormal values per buffer
struct Census {
  std::string buffer;
  std::size_t nonfinite = 0, subnormal = 0;
};

void count_value(float x, Census& c) {
  if (!std::isfinite(x)) ++c.nonfinite;
  if (std::fpclassify(x) == FP_SUBNORMAL) ++c.subnormal;
}

Census census_f32(const char* name, const float* x, std::size_t n) {
  Census c{name};
  for (std::size_t i = 0; i < n; ++i) count_value(x[i], c);
  return c;
}
Census census_bf16(const char* name, const std::uint16_t* x, std::size_t n) {
  Census c{name};
  for (std::size_t i = 0; i < n; ++i) count_value(zero::bf16_to_f32(x[i]), c);
  return c;
}
// int8 moments: records of an f32 absmax and one code per element; a code names a finite value
// in [-1, 1], so the moments are finite where the absmax is; the absmax words are counted.
Census census_int8(const char* name, const void* records, std::size_t n) {
  Census c{name};
  const std::size_t record = zero::state_bytes(zero::MomentDType::kInt8, zero::kInt8MomentBlock);
  const auto* base = static_cast<const unsigned char*>(records);
  for (std::size_t b = 0; b * zero::kInt8MomentBlock < n; ++b) {
    float absmax;
    std::memcpy(&absmax, base + b * record, sizeof absmax);
    count_value(absmax, c);
  }
  return c;
}

std::vector<Census> census(const Shard& s) {
  const std::size_t n = s.ref.count;
  std::vector<Census> out{census_f32("master", s.p.as<float>(), n),
                          census_f32("grad", s.g.as<float>(), n)};
  const char* names[2] = {"m", "v"};
  const Buffer* state[2] = {&s.m, &s.v};
  for (int k = 0; k < 2; ++k) {
    switch (s.moments) {
      case zero::MomentDType::kF32:
        out.push_back(census_f32(names[k], state[k]->as<float>(), n));
        break;
      case zero::MomentDType::kBF16:
        out.push_back(census_bf16(names[k], state[k]->as<std::uint16_t>(), n));
        break;
      case zero::MomentDType::kInt8:
        out.push_back(census_int8(names[k], state[k]->data(), n));
        break;
    }
  }
  if (s.ref.param_copy != nullptr) {
    out.push_back(census_bf16("bf16 copy", s.copy.as<std::uint16_t>(), n));
  }
  return out;
}

// Counters `nonfinite` and `subnormal` (summed over the shards' buffers); any non-finite value
// fails the benchmark, naming the buffers.
void report_census(benchmark::State& state, const std::vector<const Shard*>& shards) {
  std::size_t nonfinite = 0, subnormal = 0;
  std::string where;
  for (const Shard* s : shards) {
    for (const Census& c : census(*s)) {
      nonfinite += c.nonfinite;
      subnormal += c.subnormal;
      if (c.nonfinite + c.subnormal > 0) {
        where += " " + c.buffer + ": " + std::to_string(c.nonfinite) + " non-finite, " +
                 std::to_string(c.subnormal) + " subnormal;";
      }
    }
  }
  state.counters["nonfinite"] = static_cast<double>(nonfinite);
  state.counters["subnormal"] = static_cast<double>(subnormal);
  if (nonfinite > 0) zero::bench::fail(state, "non-finite values after the run:" + where);
}

// ---- BM_AdamW
// Instructions and CPU time of every thread during one kernel's runs (perf counters).
struct Counters {
  zero::bench::ProcessCounter instr{zero::bench::ProcessCounter::Kind::kInstructions};
  zero::bench::ProcessCounter cpu{zero::bench::ProcessCounter::Kind::kTaskClockNs};
  void start() {
    instr.start();
    cpu.start();
  }
  void stop() {
    cpu.stop();
    instr.stop();
  }
};

void BM_AdamW(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const int threads = static_cast<int>(state.range(1));
  const bool with_copy = state.range(2) != 0;
  const auto md = static_cast<zero::MomentDType>(state.range(3));
  Shard s(n, with_copy, md);
  zero::CpuExecOptions o;
  o.threads = threads;
  zero::CpuOptimizer opt(o);
  const zero::OptimizerParams hp = adamw(md);
  opt.init_state(hp, s.ref);
  tbb::task_arena arena(threads);
  auto ceiling = [&] { run_ceiling(s, n, arena); };
  // Warm up both (page tables, TBB workers), then interleave: the same conditions for both.
  opt.step(hp, s.ref, 1);
  ceiling();
  opt.init_state(hp, s.ref);
  Counters ours_count, ceiling_count;
  double ours_s = 0, ceiling_s = 0;
  std::vector<double> ratios;  // per iteration: ceiling time / our time
  std::int64_t step = 1;
  for (auto _ : state) {
    ours_count.start();
    auto t0 = std::chrono::steady_clock::now();
    opt.step(hp, s.ref, step++);
    const double t = seconds_since(t0);
    ours_count.stop();
    ours_s += t;
    state.SetIterationTime(t);
    ceiling_count.start();
    t0 = std::chrono::steady_clock::now();
    ceiling();
    const double tc = seconds_since(t0);
    ceiling_count.stop();
    ceiling_s += tc;
    ratios.push_back(tc / t);
  }
  const double iters = static_cast<double>(state.iterations());
  const double bytes_ours = static_cast<double>(n) * step_bytes(md, with_copy);
  const double bytes_ceiling = static_cast<double>(n) * ceiling_bytes(md);
  const double ours = bytes_ours * iters / ours_s / 1e9;
  const double ceil = bytes_ceiling * iters / ceiling_s / 1e9;
  state.counters["GB/s"] = ours;
  state.counters["ceiling_GB/s"] = ceil;
  state.counters["pct_of_ceiling"] = 100.0 * ours / ceil;
  // The same ratio taken pair by pair (each step against the ceiling run right after it) and
  // the median kept: robust to other processes taking a core for part of the run.
  std::nth_element(ratios.begin(), ratios.begin() + ratios.size() / 2, ratios.end());
  state.counters["pct_median"] = 100.0 * ratios[ratios.size() / 2] * bytes_ours / bytes_ceiling;
  std::string instr;
  const double elements = static_cast<double>(n) * iters;
  if (ours_count.instr.available() && ceiling_count.instr.available()) {
    state.counters["instr_per_elem"] = ours_count.instr.total() / elements;
    state.counters["ceiling_instr_per_elem"] = ceiling_count.instr.total() / elements;
  } else {
    instr = "; instructions per element unavailable: " + ours_count.instr.why_unavailable();
  }
  if (ours_count.cpu.available() && ceiling_count.cpu.available()) {
    const double ours_cpu = ours_count.cpu.total(), ceiling_cpu = ceiling_count.cpu.total();
    state.counters["cpu_ns_per_elem"] = ours_cpu / elements;
    state.counters["ceiling_cpu_ns_per_elem"] = ceiling_cpu / elements;
    state.counters["cpu_pct_of_ceiling"] =
        100.0 * ceiling_cpu * bytes_ours / ours_cpu / bytes_ceiling;
  }
  state.SetLabel(std::string(zero::to_string(opt.isa())) + " " + std::string(zero::to_string(md)) +
                 " moments" + (with_copy ? " +bf16 copy" : "") + instr);
  report_census(state, {&s});
}

// ---- BM_AdamW_Int8Speedup
void BM_AdamW_Int8Speedup(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const int threads = static_cast<int>(state.range(1));
  Shard f(n, true, zero::MomentDType::kF32), q(n, true, zero::MomentDType::kInt8);
  zero::CpuExecOptions o;
  o.threads = threads;
  zero::CpuOptimizer opt(o);
  const zero::OptimizerParams hf = adamw(zero::MomentDType::kF32);
  const zero::OptimizerParams hq = adamw(zero::MomentDType::kInt8);
  opt.init_state(hf, f.ref);
  opt.init_state(hq, q.ref);
  opt.step(hf, f.ref, 1);
  opt.step(hq, q.ref, 1);
  std::int64_t step = 2;
  double f_s = 0, q_s = 0;
  std::vector<double> speedups;
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    opt.step(hq, q.ref, step);
    const double tq = seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    opt.step(hf, f.ref, step);
    const double tf = seconds_since(t0);
    ++step;
    q_s += tq;
    f_s += tf;
    speedups.push_back(tf / tq);
    state.SetIterationTime(tq);
  }
  const double iters = static_cast<double>(state.iterations());
  state.counters["int8_GB/s"] =
      static_cast<double>(n) * step_bytes(zero::MomentDType::kInt8, true) * iters / q_s / 1e9;
  state.counters["f32_GB/s"] =
      static_cast<double>(n) * step_bytes(zero::MomentDType::kF32, true) * iters / f_s / 1e9;
  std::nth_element(speedups.begin(), speedups.begin() + speedups.size() / 2, speedups.end());
  state.counters["speedup_median"] = speedups[speedups.size() / 2];
  state.counters["bytes_ratio"] =
      step_bytes(zero::MomentDType::kF32, true) / step_bytes(zero::MomentDType::kInt8, true);
  state.SetLabel(std::string(zero::to_string(opt.isa())) +
                 ": int8 vs f32 moments, +bf16 copy, reported time int8's");
  report_census(state, {&f, &q});
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
  report_census(state, {&s});
}

}  // namespace

BENCHMARK(BM_AdamW)
    ->ArgNames({"elements", "threads", "copy", "moments"})
    ->ArgsProduct({{16 << 20, 64 << 20}, {1, 2}, {0, 1}, {0, 1, 2}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->MinTime(1.0);

BENCHMARK(BM_AdamW_Int8Speedup)
    ->ArgNames({"elements", "threads"})
    ->ArgsProduct({{16 << 20, 64 << 20}, {1, 2}})
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
