// calibrate(): the machine profile measured here (zero/plan/profile.hpp). Every figure is the best
// of a few repeats after one warm-up, so that first touch and a busy neighbour's burst weigh least.
#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>
#include <thread>

#include "offload/nvme_swapper.hpp"
#include "plan/calibrate_parts.hpp"
#include "zero/comm/comm.hpp"
#include "zero/config/config.hpp"
#include "zero/core/error.hpp"
#include "zero/device/memory.hpp"
#include "zero/optim/optimizer.hpp"
#include "zero/plan/profile.hpp"

namespace zero {

namespace {

using Clock = std::chrono::steady_clock;

// Seconds spent timing one optimizer size (at least: CalibrateOptions::repeats runs).
constexpr double kOptimizerSeconds = 0.1;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The best time of at least `repeats` runs of fn after one warm-up run, repeated further (up to
// 100 runs) until `min_seconds` have passed: on a shared machine a short run's best needs more
// tries to meet a quiet moment (256 Ki optimizer elements: best of 3 varied 2x under load 8).
template <typename Fn>
double best_of(int repeats, Fn&& fn, double min_seconds = 0) {
  fn();
  double best = 1e300;
  const auto start = Clock::now();
  for (int k = 0; k < std::max(repeats, 1) || (seconds_since(start) < min_seconds && k < 100);
       ++k) {
    const auto t0 = Clock::now();
    fn();
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

double copy_rate(std::size_t bytes, int repeats) {
  MemoryTracker t;
  const Buffer a = Buffer::host(t, MemCategory::kOther, bytes, {.prefault = true});
  const Buffer b = Buffer::host(t, MemCategory::kOther, bytes, {.prefault = true});
  std::memset(a.data(), 1, bytes);
  return static_cast<double>(bytes) /
         best_of(repeats, [&] { std::memcpy(b.data(), a.data(), bytes); });
}

// AdamW over `n` elements with f32 gradients (the trainer's f32 run) and `dtype` moments.
double optimizer_rate(MomentDType dtype, std::size_t n, int repeats) {
  MemoryTracker t;
  OptimizerParams params;
  params.moment_dtype = dtype;
  const AllocOptions pre{.prefault = true};
  const Buffer master = Buffer::host(t, MemCategory::kMasterParams, n * 4, pre);
  const Buffer grad = Buffer::host(t, MemCategory::kGradients, n * 4, pre);
  const Buffer m = Buffer::host(t, MemCategory::kOptimizerState, state_bytes(dtype, n), pre);
  const Buffer v = Buffer::host(t, MemCategory::kOptimizerState, state_bytes(dtype, n), pre);
  std::fill_n(static_cast<float*>(master.data()), n, 0.5f);
  std::fill_n(static_cast<float*>(grad.data()), n, 1e-3f);
  ShardRef s;
  s.count = n;
  s.master = static_cast<float*>(master.data());
  s.grad = grad.data();
  s.state[0] = m.data();
  s.state[1] = v.data();
  const CpuOptimizer opt;
  opt.init_state(params, s);
  std::int64_t step = 0;
  return static_cast<double>(n) /
         best_of(
             repeats, [&] { opt.step(params, s, ++step); }, kOptimizerSeconds);
}

// Writes and reads `bytes` through the NVMe swapper in `request` chunks (the config's aio
// defaults), as zero-env's probe does, each the best of `repeats` passes after a warm-up: a
// training run rewrites a swap file whose blocks exist, and one pass on a busy machine is a
// lottery; the file is removed afterwards.
void nvme_rates(const CalibrateOptions& o, MachineProfile& p) {
  MemoryTracker t;
  const std::size_t request = o.nvme_request_bytes;
  std::vector<std::size_t> chunks(std::max<std::size_t>(1, o.nvme_bytes / request), request);
  offload::ChunkSwapper::Options so;
  so.dir = o.nvme_path;
  so.stem = "calibrate";
  so.origin = "zero-env --calibrate --nvme-path";
  so.aio = offload::AioOptions::from_config(AioConfig{});
  offload::ChunkSwapper sw(t, chunks, {{MemCategory::kOther, 1}}, so);
  const auto bytes = static_cast<double>(sw.file_bytes());
  const double w = best_of(o.repeats, [&] {
    sw.run(0, chunks.size(), false, true,
           [](const offload::ChunkSwapper::Staged& s) { std::memset(s.part[0], 1, s.count); });
  });
  const double r = best_of(o.repeats, [&] {
    sw.run(0, chunks.size(), true, false, [](const offload::ChunkSwapper::Staged&) {});
  });
  p.nvme_path = o.nvme_path;
  p.nvme_request_bytes = request;
  p.nvme_write_bytes_per_s = bytes / w;
  p.nvme_read_bytes_per_s = bytes / r;
}

// One op at `bytes` per rank over `ranks` in-process ranks: the slowest rank's time of each
// repeat (a barrier before each), the best repeat.
double collective_time(const std::string& op, int ranks, std::size_t bytes, int repeats) {
  const std::size_t count = std::max<std::size_t>(bytes / 4 / static_cast<std::size_t>(ranks), 1) *
                            static_cast<std::size_t>(ranks);
  std::vector<double> times(static_cast<std::size_t>(std::max(repeats, 1)) + 1, 0.0);
  ThreadGroup::run(ranks, [&](Communicator& c) {
    std::vector<float> send(count, 1.0f), recv(count, 0.0f);
    for (std::size_t k = 0; k < times.size(); ++k) {
      const double s = detail::timed_collective(c, op, send.data(), recv.data(), count);
      if (c.rank() == 0) times[k] = s;
    }
  });
  return *std::min_element(times.begin() + 1, times.end());  // the first is the warm-up
}

std::string source_text() {
  char host[256] = "";
  (void)gethostname(host, sizeof host - 1);
  char when[64] = "";
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return std::string("zero-env --calibrate on ") + host + " at " + when;
}

}  // namespace

double detail::timed_collective(Communicator& c, const std::string& op, const void* send,
                                void* recv, std::size_t count) {
  const std::size_t part = count / static_cast<std::size_t>(c.size());
  c.barrier();
  const auto t0 = Clock::now();
  if (op == "all_reduce") {
    c.all_reduce(send, recv, count, DType::kF32, ReduceOp::kSum);
  } else if (op == "reduce_scatter") {
    c.reduce_scatter(send, recv, part, DType::kF32, ReduceOp::kSum);
  } else {
    ZERO_CHECK(op == "all_gather", kInvalidArgument, "calibrate: no collective '", op, "'");
    c.all_gather(send, recv, part, DType::kF32);
  }
  c.barrier();
  return seconds_since(t0);
}

MachineProfile calibrate(const CalibrateOptions& o) {
  ZERO_CHECK(o.copy_bytes > 0 && !o.optimizer_sizes.empty() &&
                 *std::min_element(o.optimizer_sizes.begin(), o.optimizer_sizes.end()) > 0 &&
                 o.nvme_request_bytes > 0 && o.nvme_bytes >= o.nvme_request_bytes &&
                 !o.sizes.empty() && !o.ranks.empty(),
             kInvalidArgument, "calibrate: sizes, ranks and byte counts must be > 0");
  MachineProfile p;
  p.source = source_text();
  p.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  p.copy_bytes_per_s = copy_rate(o.copy_bytes, o.repeats);
  // Every size per dtype; the largest gives the large-state rate.
  const std::size_t largest = *std::max_element(o.optimizer_sizes.begin(), o.optimizer_sizes.end());
  for (auto [dtype, rate] : {std::pair{MomentDType::kF32, &p.optimizer_f32_per_s},
                             std::pair{MomentDType::kBF16, &p.optimizer_bf16_per_s},
                             std::pair{MomentDType::kInt8, &p.optimizer_int8_per_s}}) {
    for (std::size_t n : o.optimizer_sizes) {
      const double r = optimizer_rate(dtype, n, o.repeats);
      p.optimizer_points.push_back({std::string(to_string(dtype)), n, r});
      if (n == largest) *rate = r;
    }
  }
  if (!o.nvme_path.empty()) nvme_rates(o, p);
  for (const char* op : {"all_reduce", "reduce_scatter", "all_gather"}) {
    for (int n : o.ranks) {
      ZERO_CHECK(n >= 2, kInvalidArgument, "calibrate: collectives need >= 2 ranks, got ", n);
      for (std::size_t b : o.sizes) {
        p.collectives.push_back({op, n, b, collective_time(op, n, b, o.repeats)});
      }
    }
  }
  detail::calibrate_cuda(o, p);
  return p;
}

}  // namespace zero
