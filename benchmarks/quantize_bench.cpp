// bench_quantize: block-wise int8 quantization and dequantization of f32 data
// (zero/device/quantize.hpp) against a memcpy of the same f32 array measured in the same run,
// interleaved iteration by iteration on the same threads (oneTBB's default arena: the machine's
// cores).
//
//   BM_Quantize/<elements>/<block>    counters: GB/s (ours: 4 B read + 1 B written per element),
//   BM_Dequantize/<elements>/<block>    ceiling_GB/s (memcpy: 4 B read + 4 B written, split in
//                                        oneTBB blocks of 64 Ki elements), pct_of_ceiling
// Dequantize moves 1 B read + 4 B written per element.
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "benchmarks/benchmark_main.hpp"
#include "zero/device/memory.hpp"
#include "zero/device/quantize.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void copy_parallel(float* dst, const float* src, std::size_t n) {
  constexpr std::size_t kBlock = 65536;
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, (n + kBlock - 1) / kBlock, 1),
                    [&](const tbb::blocked_range<std::size_t>& r) {
                      for (std::size_t b = r.begin(); b != r.end(); ++b) {
                        const std::size_t i = b * kBlock;
                        std::memcpy(dst + i, src + i, std::min(kBlock, n - i) * sizeof(float));
                      }
                    });
}

// arg 2: 0 quantize, 1 dequantize.
void run(benchmark::State& state, bool dequantize) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const auto block = static_cast<std::size_t>(state.range(1));
  zero::MemoryTracker tracker;
  zero::AllocOptions pre;
  pre.prefault = true;
  zero::Buffer x = zero::Buffer::host(tracker, zero::MemCategory::kOther, n * 4, pre);
  zero::Buffer y = zero::Buffer::host(tracker, zero::MemCategory::kOther, n * 4, pre);
  zero::Buffer q = zero::Buffer::host(tracker, zero::MemCategory::kOther, n, pre);
  std::vector<float> scales(zero::num_blocks(n, block));
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (std::size_t i = 0; i < n; ++i) x.as<float>()[i] = dist(rng);
  auto* q8 = static_cast<std::int8_t*>(q.data());
  zero::quantize_int8(x.as<float>(), n, block, q8, scales.data());
  double ours_s = 0, ceiling_s = 0;
  for (auto _ : state) {
    auto t0 = Clock::now();
    if (dequantize) {
      zero::dequantize_int8(q8, scales.data(), n, block, y.as<float>());
    } else {
      zero::quantize_int8(x.as<float>(), n, block, q8, scales.data());
    }
    ours_s += seconds(t0);
    state.PauseTiming();
    t0 = Clock::now();
    copy_parallel(y.as<float>(), x.as<float>(), n);
    ceiling_s += seconds(t0);
    state.ResumeTiming();
  }
  const double it = static_cast<double>(state.iterations());
  const double ours_gbs = 5.0 * static_cast<double>(n) * it / ours_s / 1e9;
  const double ceiling_gbs = 8.0 * static_cast<double>(n) * it / ceiling_s / 1e9;
  state.counters["GB/s"] = ours_gbs;
  state.counters["ceiling_GB/s"] = ceiling_gbs;
  state.counters["pct_of_ceiling"] = 100.0 * ours_gbs / ceiling_gbs;
}

void BM_Quantize(benchmark::State& state) { run(state, false); }
void BM_Dequantize(benchmark::State& state) { run(state, true); }
BENCHMARK(BM_Quantize)->Args({1 << 24, 256})->Args({1 << 24, 2048})->UseRealTime();
BENCHMARK(BM_Dequantize)->Args({1 << 24, 256})->Args({1 << 24, 2048})->UseRealTime();

}  // namespace

ZERO_BENCHMARK_MAIN("bench_quantize")
