// bench_offload: the NVMe swapper against raw O_DIRECT I/O of the same bytes, and an offloaded
// optimizer step against its two parts, each pair measured in the same run.
//
//   BM_SwapThroughput/<MiB>/<write>   write 1: ChunkSwapper writes every chunk (pipelined, the
//     engine's aio defaults: io_uring, 1 MiB pieces, queue depth 8, 4 staging buffers); write 0:
//     reads them. Interleaved iteration by iteration with two raw O_DIRECT passes over the same
//     bytes of another file: one thread of sequential 8 MiB pwrite / pread (dd oflag=direct
//     bs=8M), and 8 threads each taking every 8th 1 MiB request (queue depth 8 without io_uring).
//     Counters: swap_GB/s, raw_GB/s, raw8_GB/s, pct_of_raw = 100 x swap / raw (target >= 85),
//     pct_of_raw8 = 100 x swap / raw8.
//   BM_OffloadedStep/<M elements>/<buffers>   AdamW over fp32 master + m + v in an NVMe file,
//     chunk by chunk (8 MiB of state per chunk), read i+1 / step i / write i-1. Each iteration
//     times three passes: the CPU Adam alone on resident copies of the same chunks, the swapper's
//     read+write alone (no compute), and the pipelined step. Counters: adam_ms, io_ms, step_ms,
//     step_over_max = step / max(adam, io) (target <= 1.2: the pipeline hides the smaller).
//
// Files go under $ZERO_BENCH_DIR (default /tmp; it must be a file system with O_DIRECT: the
// work disk, not tmpfs). Run: build/<dir>/benchmarks/bench_offload
#include <fcntl.h>
#include <unistd.h>
#include "benchmarks/benchmark_main.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "offload/aio.hpp"
#include "offload/nvme_swapper.hpp"
#include "zero/core/error.hpp"
#include "zero/device/memory.hpp"
#include "zero/optim/optimizer.hpp"

namespace {

using zero::Buffer;
using zero::MemCategory;
using zero::MemoryTracker;
using zero::offload::ChunkSwapper;
using Clock = std::chrono::steady_clock;

std::string bench_dir() {
  const char* d = std::getenv("ZERO_BENCH_DIR");
  return d != nullptr ? d : "/tmp";
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// ---- the raw baseline: one O_DIRECT file, sequential 8 MiB requests
class RawFile {
 public:
  explicit RawFile(std::size_t bytes) : file_(bench_dir(), "raw", "ZERO_BENCH_DIR"), bytes_(bytes) {
    ZERO_CHECK(file_.direct(), kIO, "bench_offload: '", bench_dir(),
               "' refuses O_DIRECT (tmpfs?); set ZERO_BENCH_DIR to a directory on a disk");
    buf_ = static_cast<char*>(std::aligned_alloc(zero::offload::kDirectAlignment, kRequest));
    std::memset(buf_, 0x5a, kRequest);
  }
  ~RawFile() { std::free(buf_); }
  // One thread, requests of `request` bytes (each thread its own `stride`-th request).
  void pass(bool write, std::size_t request = kRequest, std::size_t first = 0,
            std::size_t stride = 1, char* buf = nullptr) {
    if (buf == nullptr) buf = buf_;
    for (std::size_t at = first * request; at < bytes_; at += stride * request) {
      const std::size_t n = std::min(request, bytes_ - at);
      const ssize_t r = write ? ::pwrite(file_.fd(), buf, n, static_cast<off_t>(at))
                              : ::pread(file_.fd(), buf, n, static_cast<off_t>(at));
      ZERO_CHECK(r == static_cast<ssize_t>(n), kIO, "raw ", write ? "write" : "read", " at ", at,
                 " of '", file_.path(), "': ", r < 0 ? std::strerror(errno) : "short");
    }
  }
  // `threads` (<= 8) threads, each with its own 1 MiB of the buffer, interleaving 1 MiB requests.
  void parallel_pass(bool write, std::size_t threads) {
    constexpr std::size_t kPiece = std::size_t{1} << 20;
    std::vector<std::thread> ts;
    for (std::size_t t = 0; t < threads; ++t) {
      ts.emplace_back(
          [this, write, t, threads] { pass(write, kPiece, t, threads, buf_ + t * kPiece); });
    }
    for (auto& t : ts) t.join();
  }

 private:
  static constexpr std::size_t kRequest = std::size_t{8} << 20;
  zero::offload::SwapFile file_;
  std::size_t bytes_;
  char* buf_ = nullptr;
};

ChunkSwapper::Options swap_options(std::size_t buffers) {
  ChunkSwapper::Options o;
  o.dir = bench_dir();
  o.stem = "bench";
  o.origin = "ZERO_BENCH_DIR";
  o.buffer_count = buffers;
  o.pipeline_read = o.pipeline_write = true;
  return o;  // aio: the engine's defaults (AioConfig)
}

void BM_SwapThroughput(benchmark::State& state) {
  const std::size_t bytes = static_cast<std::size_t>(state.range(0)) << 20;
  const bool write = state.range(1) != 0;
  constexpr std::size_t kChunk = std::size_t{8} << 20;  // bytes per chunk (one part)
  MemoryTracker t;
  std::vector<std::size_t> chunks(bytes / kChunk, kChunk);
  ChunkSwapper sw(t, chunks, {{MemCategory::kOptimizerState, 1}}, swap_options(4));
  RawFile raw(bytes);
  auto fill = [](const ChunkSwapper::Staged& s) { std::memset(s.part[0], 1, s.count); };
  // Both files exist at full size before any timed read.
  sw.run(0, chunks.size(), false, true, fill);
  raw.pass(true);
  double swap_s = 0, raw_s = 0, raw8_s = 0;
  for (auto _ : state) {
    auto t0 = Clock::now();
    sw.run(
        0, chunks.size(), !write, write, write ? fill : [](const ChunkSwapper::Staged&) {});
    swap_s += seconds_since(t0);
    t0 = Clock::now();
    raw.pass(write);
    raw_s += seconds_since(t0);
    t0 = Clock::now();
    raw.parallel_pass(write, 8);
    raw8_s += seconds_since(t0);
  }
  const double n = static_cast<double>(state.iterations()) * static_cast<double>(bytes);
  state.counters["swap_GB/s"] = n / swap_s / 1e9;
  state.counters["raw_GB/s"] = n / raw_s / 1e9;
  state.counters["pct_of_raw"] = 100.0 * raw_s / swap_s;
  state.counters["raw8_GB/s"] = n / raw8_s / 1e9;
  state.counters["pct_of_raw8"] = 100.0 * raw8_s / swap_s;
  state.SetLabel(std::string(write ? "write" : "read") + ", aio " + sw.engine());
}
BENCHMARK(BM_SwapThroughput)
    ->Args({512, 1})
    ->Args({512, 0})
    ->Iterations(3)
    ->Unit(benchmark::kMillisecond);

void BM_OffloadedStep(benchmark::State& state) {
  const std::size_t elems = static_cast<std::size_t>(state.range(0)) << 20;
  const auto buffers = static_cast<std::size_t>(state.range(1));
  constexpr std::size_t kChunkElems = std::size_t{8} << 20 >> 2;  // 8 MiB of fp32 per part
  std::vector<std::size_t> chunks;
  for (std::size_t at = 0; at < elems; at += kChunkElems) {
    chunks.push_back(std::min(kChunkElems, elems - at));
  }
  MemoryTracker t;
  ChunkSwapper sw(t, chunks,
                  {{MemCategory::kMasterParams, 4},
                   {MemCategory::kOptimizerState, 4},
                   {MemCategory::kOptimizerState, 4}},
                  swap_options(buffers));
  zero::CpuOptimizer opt;
  zero::OptimizerParams p;  // AdamW defaults
  p.lr = 1e-3;
  p.weight_decay = 0.01;
  // The gradients (host-resident, as after the reduce-scatter) and a resident copy of the state
  // for the compute-only pass.
  Buffer grad = Buffer::host(t, MemCategory::kGradients, elems * 4, {.prefault = true});
  Buffer rm = Buffer::host(t, MemCategory::kMasterParams, elems * 4, {.zero = true});
  Buffer rs[2] = {Buffer::host(t, MemCategory::kOptimizerState, elems * 4, {.zero = true}),
                  Buffer::host(t, MemCategory::kOptimizerState, elems * 4, {.zero = true})};
  for (std::size_t i = 0; i < elems; ++i) grad.as<float>()[i] = 1e-3f * static_cast<float>(i % 97);
  std::vector<std::size_t> offset(chunks.size());
  for (std::size_t c = 1; c < chunks.size(); ++c) offset[c] = offset[c - 1] + chunks[c - 1];
  auto step_chunk = [&](std::size_t c, float* master, void* m, void* v, std::int64_t k) {
    zero::ShardRef s;
    s.count = chunks[c];
    s.master = master;
    s.grad = grad.as<float>() + offset[c];
    s.grad_dtype = zero::DType::kF32;
    s.state[0] = m;
    s.state[1] = v;
    opt.step(p, s, k, 1.0f);
  };
  sw.run(0, chunks.size(), false, true, [&](const ChunkSwapper::Staged& s) {
    std::memset(s.part[0], 0, s.count * 4);
    std::memset(s.part[1], 0, s.count * 4);
    std::memset(s.part[2], 0, s.count * 4);
  });
  double adam_s = 0, io_s = 0, step_s = 0;
  std::int64_t k = 0;
  for (auto _ : state) {
    ++k;
    auto t0 = Clock::now();
    for (std::size_t c = 0; c < chunks.size(); ++c) {
      step_chunk(c, rm.as<float>() + offset[c], rs[0].as<float>() + offset[c],
                 rs[1].as<float>() + offset[c], k);
    }
    adam_s += seconds_since(t0);
    t0 = Clock::now();
    sw.run(0, chunks.size(), true, true, [](const ChunkSwapper::Staged&) {});
    io_s += seconds_since(t0);
    t0 = Clock::now();
    sw.run(0, chunks.size(), true, true, [&](const ChunkSwapper::Staged& s) {
      step_chunk(s.chunk, reinterpret_cast<float*>(s.part[0]), s.part[1], s.part[2], k);
    });
    step_s += seconds_since(t0);
  }
  const double it = static_cast<double>(state.iterations());
  state.counters["adam_ms"] = 1e3 * adam_s / it;
  state.counters["io_ms"] = 1e3 * io_s / it;
  state.counters["step_ms"] = 1e3 * step_s / it;
  state.counters["step_over_max"] = step_s / std::max(adam_s, io_s);
  state.counters["state_GB"] = static_cast<double>(sw.file_bytes()) / 1e9;
  state.SetLabel(std::string("aio ") + sw.engine());
}
BENCHMARK(BM_OffloadedStep)
    ->Args({16, 4})
    ->Args({16, 2})
    ->Iterations(3)
    ->Unit(benchmark::kMillisecond);

}  // namespace

ZERO_BENCHMARK_MAIN("bench_offload")
