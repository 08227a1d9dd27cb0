// The timeline's cost per recording site: a TraceScope with no tracer (tracing off: one branch
// on a null pointer), with one (two clock reads and the ring's mutex), the always-on phase timer
// behind StepMetrics, and a small in-process collective with and without a tracer on its
// communicator. Multiplied by the sites a step records (zero-bench --trace: events per step) the
// off cost is a fraction of a step; zero-bench --trace reports the on cost against the same
// configuration run untraced.
#include <benchmark/benchmark.h>

#include <memory>
#include <thread>
#include <vector>

#include "benchmarks/benchmark_main.hpp"
#include "zero/comm/comm.hpp"
// Private: detail::PhaseTimer is the engine's own (not API), and its cost is what every hook
// pays whether tracing is on or not, so it is measured where it lives.
#include "core/observe.hpp"
#include "zero/core/trace.hpp"

namespace zero {
namespace {

// arg 0: tracing off (null tracer); 1: on.
void BM_TraceScope(benchmark::State& state) {
  const bool on = state.range(0) != 0;
  Tracer tracer(0, 1 << 16);
  Tracer* t = on ? &tracer : nullptr;
  std::int64_t unit = 0;
  for (auto _ : state) {
    TraceScope region(t, TraceLane::kTrainer, "forward", unit++);
    benchmark::DoNotOptimize(unit);
  }
  state.counters["per_region"] =
      benchmark::Counter(static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_TraceScope)->Arg(0)->Arg(1);

// The engine's hooks time their phase always (StepMetrics), tracing or not.
void BM_PhaseTimer(benchmark::State& state) {
  double seconds = 0;
  for (auto _ : state) {
    detail::PhaseTimer phase(seconds, nullptr, TraceLane::kEngine, "gather");
    benchmark::DoNotOptimize(seconds);
  }
  state.counters["per_phase"] =
      benchmark::Counter(static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_PhaseTimer);

// A 1024-element all_gather over 2 in-process ranks: arg 0 without a tracer, 1 with one on
// each rank's communicator (3 regions a collective: execution, in flight, wait).
void BM_AllGather(benchmark::State& state) {
  const bool on = state.range(0) != 0;
  ThreadGroup group(2);
  std::unique_ptr<Communicator> c0 = group.communicator(0), c1 = group.communicator(1);
  Tracer t0(0, 1 << 16), t1(1, 1 << 16);
  if (on) {
    c0->set_tracer(&t0);
    c1->set_tracer(&t1);
  }
  std::vector<float> s0(1024), s1(1024), r0(2048), r1(2048);
  std::atomic<bool> stop{false};
  std::atomic<std::int64_t> rounds{0};
  // Rank 1 on a thread of its own, matching rank 0's collectives one for one.
  std::thread peer([&] {
    std::int64_t done = 0;
    while (true) {
      while (rounds.load() == done && !stop.load()) std::this_thread::yield();
      if (stop.load() && rounds.load() == done) break;
      c1->all_gather(s1.data(), r1.data(), 1024, DType::kF32);
      ++done;
    }
  });
  for (auto _ : state) {
    rounds.fetch_add(1);
    c0->all_gather(s0.data(), r0.data(), 1024, DType::kF32);
  }
  stop.store(true);
  peer.join();
  state.counters["per_collective"] =
      benchmark::Counter(static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_AllGather)->Arg(0)->Arg(1)->UseRealTime();

}  // namespace
}  // namespace zero

ZERO_BENCHMARK_MAIN("bench_trace")
