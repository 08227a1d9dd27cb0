// bench_engine — step time of each ZeRO stage over stage 0 on the same model in the same run,
// and bytes communicated per step over the theory (DESIGN.md: 2Ψ for stages 0-2, 3Ψ for 3).
//
//   ./bench_engine [--benchmark_filter=...]
//
// The model: `units` units of `elems` bf16 parameters each (AdamW, fp32 master and moments),
// N = 2 in-process ranks. The trainer is synthetic and memory-bound on purpose: its forward
// reads every parameter of a unit once (a sum), its backward writes every gradient once (a copy
// of a prepared random buffer), so the figure is the engine's overhead with nothing to hide it
// behind — a real model's matmuls only make the ratios smaller.
//
// Each benchmark alternates stage 0 and stage k (A/B, `rounds` times, `steps` steps each) and
// reports the ratio of the medians measured in the same run. Counters:
//   over_stage0   median step time of stage k / of stage 0 (targets: <= 1.05 stages 1-2,
//                 <= 1.25 stage 3)
//   comm_over_theory   bytes sent per step per rank / the theory for this stage, where the
//                 theory counts the gradients in the reduce dtype (fp32) and parameters in bf16:
//                 stages 0-2: (N-1)/N (2 x 4Ψ) for all_reduce, (N-1)/N (4Ψ + 2Ψ) for
//                 reduce_scatter + all_gather; stage 3 adds the second gather (+ (N-1)/N 2Ψ).
//                 DESIGN.md's "2Ψ / 3Ψ" is this with 16-bit gradients.
//
// BM_BucketsOverPerUnit/<stage>: merged buckets against a collective per unit (see below).
//
// BM_OffloadOverNoOffload/<stage>/<offload>: the same A/B between stage k without and with the
// optimizer offloaded (offload 1: pinned host memory; 2: NVMe files under $ZERO_BENCH_DIR or
// /tmp, 4 staging buffers of 1M elements, read/write pipeline on). Counter over_no_offload. On
// this CPU-only machine host offload only adds the chunked copies (nothing moves off a device);
// NVMe adds the file I/O of 12 bytes per parameter each way.
#include "benchmarks/benchmark_main.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "zero/comm/comm.hpp"
#include "zero/config/config.hpp"
#include "zero/engine/engine.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using namespace zero;

constexpr int kRanks = 2;

std::string offload_json(int offload) {
  if (offload == 0) return "";
  const char* dir = std::getenv("ZERO_BENCH_DIR");
  return std::string(R"(, "offload_optimizer": {"device": ")") + (offload == 1 ? "cpu" : "nvme") +
         R"(", "nvme_path": ")" + (dir != nullptr ? dir : "/tmp") +
         R"(", "buffer_count": 4, "buffer_size": 1048576, "pipeline_read": true,
            "pipeline_write": true})";
}

Config config_for(int stage, int offload = 0, long bucket = 0) {
  return parse_config(R"({"zero_optimization": {"stage": )" + std::to_string(stage) +
                      R"(, "overlap_comm": true, "reduce_bucket_size": )" + std::to_string(bucket) +
                      R"(, "allgather_bucket_size": )" + std::to_string(bucket) +
                      (stage == 3 ? R"(, "stage3_param_persistence_threshold": 0)" : "") +
                      offload_json(offload) + R"(},
      "bf16": {"enabled": true}, "gradient_clipping": 1.0,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}}})");
}

struct Timing {
  std::vector<double> step_s;  // per measured step (rank 0)
  double bytes_per_step = 0;
  double collectives_per_step = 0;  // every collective but barriers (rank 0)
  std::size_t psi = 0;
};

// Runs warmup + `steps` steps at `stage` on N in-process ranks; rank 0's step times.
Timing run(int stage, int units, std::size_t elems, int steps, int offload = 0, long bucket = 0) {
  Timing t;
  std::mutex mu;
  const Config cfg = config_for(stage, offload, bucket);
  ThreadGroup::run(kRanks, [&](Communicator& comm) {
    EngineOptions opts;
    opts.poison_released = false;
    Engine e(comm, cfg, opts);
    for (int u = 0; u < units; ++u) {
      e.add_unit({"unit" + std::to_string(u), {{"w", {static_cast<std::int64_t>(elems)}}}});
    }
    std::vector<float> init(elems);
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0.0f, 0.02f);
    for (float& v : init) v = nd(rng);
    for (int u = 0; u < units; ++u) e.set_param(u, 0, init.data(), elems);
    std::vector<std::uint16_t> grad16(elems);
    for (auto& g : grad16) g = f32_to_bf16(nd(rng));
    volatile float sink = 0;
    auto one_step = [&] {
      for (int u = 0; u < units; ++u) {  // forward: read every parameter
        GatherGuard g = e.gather(u);
        const auto* p = static_cast<const std::uint16_t*>(g.param(0).data);
        std::uint32_t acc = 0;
        for (std::size_t i = 0; i < elems; ++i) acc += p[i];
        sink = sink + static_cast<float>(acc);
      }
      for (int u = units - 1; u >= 0; --u) {  // backward: write every gradient
        GatherGuard g = e.gather(u);
        std::memcpy(e.grad(u, 0).data, grad16.data(), elems * 2);
        e.grads_ready(u);
      }
      e.step();
    };
    for (int i = 0; i < 2; ++i) one_step();  // warm-up: first touch, pools, prefetch trace
    comm.reset_stats();
    std::vector<double> times;
    for (int i = 0; i < steps; ++i) {
      comm.barrier();
      const auto t0 = Clock::now();
      one_step();
      comm.barrier();
      times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    if (comm.rank() == 0) {
      std::lock_guard<std::mutex> lock(mu);
      t.step_s = times;
      // Barriers count nothing; the norm all-gather (16 bytes) is part of the step.
      t.bytes_per_step = static_cast<double>(comm.stats().bytes_sent()) / steps;
      const CommStats cs = comm.stats();
      for (Collective c : {Collective::kAllReduce, Collective::kReduceScatter,
                           Collective::kAllGather, Collective::kBroadcast}) {
        t.collectives_per_step += static_cast<double>(cs[c].calls) / steps;
      }
      for (int u = 0; u < units; ++u) t.psi += e.unit_padded_numel(u);
    }
  });
  return t;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void BM_StageOverStage0(benchmark::State& st) {
  const int stage = static_cast<int>(st.range(0));
  const int units = static_cast<int>(st.range(1));
  const auto elems = static_cast<std::size_t>(st.range(2));
  constexpr int kSteps = 4, kRounds = 3;
  std::vector<double> t0, tk;
  double bytes = 0;
  std::size_t psi = 0;
  for (auto _ : st) {
    t0.clear();
    tk.clear();
    for (int r = 0; r < kRounds; ++r) {  // A/B alternation: both see the same machine state
      Timing a = run(0, units, elems, kSteps);
      Timing b = run(stage, units, elems, kSteps);
      t0.insert(t0.end(), a.step_s.begin(), a.step_s.end());
      tk.insert(tk.end(), b.step_s.begin(), b.step_s.end());
      bytes = b.bytes_per_step;
      psi = b.psi;
    }
    st.SetIterationTime(median(tk));
  }
  const double f = static_cast<double>(kRanks - 1) / kRanks;
  double theory = 0;
  if (stage == 0) theory = f * 2 * 4.0 * psi;
  if (stage == 1 || stage == 2) theory = f * (4.0 + 2.0) * psi;
  if (stage == 3) theory = f * (4.0 + 2.0 + 2.0) * psi;
  st.counters["stage0_ms"] = median(t0) * 1e3;
  st.counters["stage_ms"] = median(tk) * 1e3;
  st.counters["over_stage0"] = median(tk) / median(t0);
  st.counters["comm_MB_per_step"] = bytes / 1e6;
  st.counters["comm_over_theory"] = bytes / theory;
  st.counters["params_M"] = static_cast<double>(psi) / 1e6;
}

void BM_OffloadOverNoOffload(benchmark::State& st) {
  const int stage = static_cast<int>(st.range(0));
  const int offload = static_cast<int>(st.range(1));
  constexpr int kUnits = 8, kSteps = 4, kRounds = 3;
  constexpr std::size_t kElems = std::size_t{1} << 20;
  std::vector<double> ta, tb;
  for (auto _ : st) {
    ta.clear();
    tb.clear();
    for (int r = 0; r < kRounds; ++r) {
      Timing a = run(stage, kUnits, kElems, kSteps);
      Timing b = run(stage, kUnits, kElems, kSteps, offload);
      ta.insert(ta.end(), a.step_s.begin(), a.step_s.end());
      tb.insert(tb.end(), b.step_s.begin(), b.step_s.end());
    }
    st.SetIterationTime(median(tb));
  }
  st.counters["no_offload_ms"] = median(ta) * 1e3;
  st.counters["offload_ms"] = median(tb) * 1e3;
  st.counters["over_no_offload"] = median(tb) / median(ta);
  st.SetLabel(offload == 1 ? "offload cpu" : "offload nvme");
}

// BM_BucketsOverPerUnit/<stage>/<bucket>: 64 units of 16 Ki elements (a model of many small
// units, as a LibTorch model with a unit per module) with reduce_bucket_size =
// allgather_bucket_size = bucket (5e8, DeepSpeed's default: everything in one bucket; 262144:
// four buckets of 16 units) against 0 (a collective per unit), A/B in the same run. Counters:
// collectives per step of each (counted by the communicator) and the step-time ratio over_per_unit.
// The parameters are bitwise equal either way (engine_bucket_test).
void BM_BucketsOverPerUnit(benchmark::State& st) {
  const int stage = static_cast<int>(st.range(0));
  const long bucket = static_cast<long>(st.range(1));
  constexpr int kUnits = 64, kSteps = 20, kRounds = 5;
  constexpr std::size_t kElems = 16 * 1024;
  std::vector<double> ta, tb;
  double calls_a = 0, calls_b = 0;
  for (auto _ : st) {
    ta.clear();
    tb.clear();
    for (int r = 0; r < kRounds; ++r) {
      Timing a = run(stage, kUnits, kElems, kSteps);
      Timing b = run(stage, kUnits, kElems, kSteps, 0, bucket);
      ta.insert(ta.end(), a.step_s.begin(), a.step_s.end());
      tb.insert(tb.end(), b.step_s.begin(), b.step_s.end());
      calls_a = a.collectives_per_step;
      calls_b = b.collectives_per_step;
    }
    st.SetIterationTime(median(tb));
  }
  st.counters["per_unit_ms"] = median(ta) * 1e3;
  st.counters["bucketed_ms"] = median(tb) * 1e3;
  st.counters["over_per_unit"] = median(tb) / median(ta);
  st.counters["per_unit_collectives"] = calls_a;
  st.counters["bucketed_collectives"] = calls_b;
}

BENCHMARK(BM_BucketsOverPerUnit)
    ->ArgNames({"stage", "bucket"})
    ->ArgsProduct({{1, 2, 3}, {500'000'000, 262'144}})
    ->UseManualTime()
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

BENCHMARK(BM_OffloadOverNoOffload)
    ->ArgNames({"stage", "offload"})
    ->Args({2, 1})
    ->Args({2, 2})
    ->Args({3, 2})
    ->UseManualTime()
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

BENCHMARK(BM_StageOverStage0)
    ->ArgNames({"stage", "units", "elems"})
    ->Args({1, 8, 1 << 20})
    ->Args({2, 8, 1 << 20})
    ->Args({3, 8, 1 << 20})
    ->UseManualTime()
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

}  // namespace

ZERO_BENCHMARK_MAIN("bench_engine")
