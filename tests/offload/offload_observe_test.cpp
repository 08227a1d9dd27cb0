// Offload observation: the aio queue's trace regions and byte counters, and the engine's offload
// figures (StepMetrics' host<->device and NVMe bytes, the kNvme / kOffload / kOptimizer regions)
// against sizes computed here from the engine's layout: this rank's shards, the chunk size, the
// dtypes, AdamW's two moments and the 4 KiB padding of every swap-file part.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/discrete_device.hpp"
#include "common/mlp_model.hpp"
#include "common/mlp_training.hpp"
#include "core/observe.hpp"
#include "offload/aio.hpp"
#include "offload/io_fixtures.hpp"
#include "zero/comm/comm.hpp"
#include "zero/core/error.hpp"
#include "zero/core/trace.hpp"
#include "zero/engine/engine.hpp"

namespace zero {
namespace {

namespace fs = std::filesystem;
using offload::align_up;
using testing::Aligned;
using testing::kDims;
using testing::kRows;
using testing::make_config;
using testing::Mlp;
using testing::RunSpec;
using testing::TempDir;

// AdamW (make_config's optimizer): the moments m and v, f32 each.
constexpr std::size_t kNumStates = 2;
constexpr std::size_t kStateBytes = 4;
constexpr int kSteps = 3;
constexpr int kRanks = 2;

// Regions of one lane by name: how many, their bytes. Every region must be well formed.
struct Totals {
  std::size_t count = 0;
  std::uint64_t bytes = 0;
};
std::map<std::string, Totals> lane_totals(const std::vector<TraceEvent>& events, TraceLane lane) {
  std::map<std::string, Totals> out;
  for (const TraceEvent& e : events) {
    if (e.lane != lane) continue;
    EXPECT_LE(e.begin_ns, e.end_ns) << e.name;
    EXPECT_GT(e.begin_ns, 0) << e.name << ": begin never stamped";
    EXPECT_GE(e.bytes, 0) << e.name;
    Totals& t = out[e.name];
    ++t.count;
    t.bytes += static_cast<std::uint64_t>(std::max<std::int64_t>(e.bytes, 0));
  }
  return out;
}
Totals get(const std::map<std::string, Totals>& m, const std::string& name) {
  const auto it = m.find(name);
  return it == m.end() ? Totals{} : it->second;
}

// ---- the aio queue

class AioObserved : public ::testing::TestWithParam<const char*> {};

// Each request: one region from submit to completion, stamped where the completion is seen (the
// region exists before wait() is called), with its bytes and unit; the counters add up.
TEST_P(AioObserved, EachRequestIsOneRegionAndItsBytesAreCounted) {
  TempDir dir;
  const std::string path = dir.path() + "/data";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT, 0600);
  ASSERT_GE(fd, 0);
  Tracer tracer(0);
  detail::IoCounters io;
  offload::AioOptions o;
  o.engine = GetParam();
  o.block_size = 3 * 4096;  // several pieces per request: one region all the same
  o.queue_depth = 2;
  o.thread_count = 2;
  o.observer = {&tracer, &io};
  offload::AioQueue q(o);
  const std::size_t sizes[] = {4096, 7 * 4096, 20 * 4096};
  std::uint64_t off = 0, written = 0;
  std::vector<Aligned> bufs;
  for (std::size_t i = 0; i < std::size(sizes); ++i) {
    bufs.emplace_back(sizes[i]);
    std::memset(bufs.back().p, static_cast<int>(i + 1), sizes[i]);
    const std::int64_t before = trace_ns(TraceClock::now());
    const auto t = q.submit(offload::IoKind::kWrite, fd, path, bufs.back().p, sizes[i], off,
                            static_cast<std::int64_t>(i));
    // Wait for the region to appear, then for the ticket: the region ended before wait().
    const auto deadline = TraceClock::now() + std::chrono::seconds(10);
    while (tracer.events().size() < i + 1 && TraceClock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    const std::int64_t before_wait = trace_ns(TraceClock::now());
    q.wait(t);
    const std::vector<TraceEvent> ev = tracer.events();
    ASSERT_EQ(ev.size(), i + 1) << "no region before wait()";
    const TraceEvent& e = ev.back();
    EXPECT_EQ(e.lane, TraceLane::kNvme);
    EXPECT_STREQ(e.name, "nvme write");
    EXPECT_EQ(e.unit, static_cast<std::int64_t>(i));
    EXPECT_EQ(e.bytes, static_cast<std::int64_t>(sizes[i]));
    EXPECT_LE(before, e.begin_ns);
    EXPECT_LE(e.begin_ns, e.end_ns);
    EXPECT_LE(e.end_ns, before_wait);
    off += sizes[i];
    written += sizes[i];
    EXPECT_EQ(io.nvme_write.load(), written);
  }
  // Reads in flight together, waited out of order; the convenience read without a unit.
  std::vector<Aligned> back;
  std::vector<offload::AioQueue::Ticket> tickets;
  off = 0;
  for (std::size_t i = 0; i < std::size(sizes); ++i) {
    back.emplace_back(sizes[i]);
    tickets.push_back(q.submit(offload::IoKind::kRead, fd, path, back.back().p, sizes[i], off,
                               static_cast<std::int64_t>(10 + i)));
    off += sizes[i];
  }
  for (std::size_t i = tickets.size(); i-- > 0;) q.wait(tickets[i]);
  q.read(fd, path, back[0].p, sizes[0], 0);
  for (std::size_t i = 0; i < std::size(sizes); ++i) {
    EXPECT_EQ(std::memcmp(back[i].p, bufs[i].p, sizes[i]), 0) << i;
  }
  EXPECT_EQ(io.nvme_read.load(), written + sizes[0]);
  EXPECT_EQ(io.nvme_write.load(), written);
  const std::vector<TraceEvent> ev = tracer.events();
  const auto totals = lane_totals(ev, TraceLane::kNvme);
  EXPECT_EQ(get(totals, "nvme read").count, 4u);
  EXPECT_EQ(get(totals, "nvme read").bytes, written + sizes[0]);
  EXPECT_EQ(get(totals, "nvme write").count, 3u);
  EXPECT_EQ(get(totals, "nvme write").bytes, written);
  std::map<std::int64_t, std::int64_t> read_bytes_by_unit;
  for (const TraceEvent& e : ev) {
    if (std::string(e.name) == "nvme read") read_bytes_by_unit[e.unit] += e.bytes;
  }
  const std::map<std::int64_t, std::int64_t> expect_by_unit = {
      {-1, 4096}, {10, 4096}, {11, 7 * 4096}, {12, 20 * 4096}};
  EXPECT_EQ(read_bytes_by_unit, expect_by_unit);
  ::close(fd);
}

// A failed request is a region without bytes and is not counted; counters without a tracer and
// a tracer without counters each work alone.
TEST_P(AioObserved, FailedRequestsAreNotCountedAndEitherHalfWorksAlone) {
  const int fd = ::open("/dev/full", O_WRONLY);
  ASSERT_GE(fd, 0);
  Tracer tracer(0);
  detail::IoCounters io;
  Aligned b(2 * 4096);
  std::memset(b.p, 3, b.size);
  {
    offload::AioOptions o;
    o.engine = GetParam();
    o.observer = {&tracer, &io};
    offload::AioQueue q(o);
    EXPECT_THROW(q.write(fd, "/dev/full", b.p, b.size, 0, 5), Error);
    EXPECT_EQ(io.nvme_write.load(), 0u);
    const std::vector<TraceEvent> ev = tracer.events();
    ASSERT_EQ(ev.size(), 1u);
    EXPECT_STREQ(ev[0].name, "nvme write");
    EXPECT_EQ(ev[0].bytes, -1);
    EXPECT_EQ(ev[0].unit, 5);
    EXPECT_LE(ev[0].begin_ns, ev[0].end_ns);
  }
  ::close(fd);
  TempDir dir;
  const std::string path = dir.path() + "/data";
  const int data = ::open(path.c_str(), O_RDWR | O_CREAT, 0600);
  ASSERT_GE(data, 0);
  tracer.clear();
  {
    offload::AioOptions o;
    o.engine = GetParam();
    o.observer = {nullptr, &io};  // counted, not traced
    offload::AioQueue q(o);
    q.write(data, path, b.p, b.size, 0);
    q.read(data, path, b.p, 4096, 4096);
  }
  EXPECT_EQ(io.nvme_write.load(), b.size);
  EXPECT_EQ(io.nvme_read.load(), 4096u);
  EXPECT_TRUE(tracer.events().empty());
  {
    offload::AioOptions o;
    o.engine = GetParam();
    o.observer = {&tracer, nullptr};  // traced, not counted
    offload::AioQueue q(o);
    q.read(data, path, b.p, b.size, 0);
  }
  EXPECT_EQ(io.nvme_read.load(), 4096u);
  ASSERT_EQ(tracer.events().size(), 1u);
  EXPECT_EQ(tracer.events()[0].bytes, static_cast<std::int64_t>(b.size));
  ::close(data);
}

INSTANTIATE_TEST_SUITE_P(Offload, AioObserved, ::testing::Values("io_uring", "threads"));

// ---- the engine

// This rank's shards as the engine lays them out, and the optimizer's chunks over them.
struct Shards {
  std::vector<std::size_t> numel;   // per unit
  std::vector<std::size_t> chunks;  // elements per chunk, unit by unit
  std::size_t total() const {
    std::size_t n = 0;
    for (std::size_t s : numel) n += s;
    return n;
  }
  // The optimizer's swap file: per chunk the master and both moments, each part padded to 4 KiB.
  std::vector<std::size_t> optim_slots() const {
    std::vector<std::size_t> out;
    for (std::size_t n : chunks)
      out.push_back(align_up(n * 4) + kNumStates * align_up(n * kStateBytes));
    return out;
  }
  // The parameter swap file: per unit its shard in the working dtype, padded.
  std::size_t param_file(std::size_t ws) const {
    std::size_t b = 0;
    for (std::size_t n : numel) b += align_up(n * ws);
    return b;
  }
};

// `buffer_size` is offload_optimizer.buffer_size; the engine caps a chunk at the largest shard.
Shards shards_of(Engine& e, long buffer_size) {
  Shards s;
  for (UnitId u = 0; u < e.num_units(); ++u) s.numel.push_back(e.unit_shard_numel(u));
  const std::size_t chunk = std::min(static_cast<std::size_t>(buffer_size),
                                     *std::max_element(s.numel.begin(), s.numel.end()));
  for (std::size_t n : s.numel) {
    for (std::size_t at = 0; at < n; at += chunk) s.chunks.push_back(std::min(chunk, n - at));
  }
  return s;
}

std::uint64_t sum(const std::vector<std::size_t>& v) {
  std::uint64_t s = 0;
  for (std::size_t x : v) s += x;
  return s;
}

// What one step should show.
struct Expect {
  std::uint64_t nvme_read = 0, nvme_write = 0, host_to_device = 0, device_to_host = 0;
};

struct StepSeen {
  StepMetrics metrics;
  std::vector<TraceEvent> events;  // the step's regions (empty without a tracer)
};

// Declares and initialises the MLP on a fresh engine, then trains kSteps steps; per step its
// metrics and (with a tracer) the regions recorded from its first hook to its end.
template <typename Check>
void run_engine(const RunSpec& spec, bool traced, Check check) {
  ThreadGroup::run(spec.ranks, [&](Communicator& world) {
    Tracer tracer(world.rank());
    std::unique_ptr<testing::DiscreteComm> discrete;
    Communicator* comm = &world;
    Mlp mlp(kDims);
    EngineOptions eo;
    if (traced) eo.tracer = &tracer;
    if (spec.discrete) {
      discrete = std::make_unique<testing::DiscreteComm>(world);
      comm = discrete.get();
      eo.device_ops = std::make_shared<testing::DiscreteCpuDevice>();
      mlp.device = eo.device_ops.get();
    }
    Engine e(*comm, make_config(spec), eo);
    EXPECT_EQ(e.tracer(), traced ? &tracer : nullptr);
    mlp.declare(e);
    mlp.init(e, 7);
    tracer.clear();  // the layout's and set_param's file writes come before the first window
    std::vector<StepSeen> seen;
    for (int step = 0; step < kSteps; ++step) {
      mlp.micro_step(e, testing::make_batch(mlp.in(), mlp.out(), kRows, step, 0, comm->rank()));
      const StepResult r = e.step();
      EXPECT_TRUE(r.boundary);
      seen.push_back({r.metrics, tracer.events()});
      tracer.clear();
    }
    if (!traced) {
      EXPECT_TRUE(tracer.events().empty());
    }
    check(e, seen);
    comm->barrier();
  });
}

void expect_counters(const StepMetrics& m, const Expect& x, const std::string& what) {
  EXPECT_EQ(m.nvme_read_bytes, x.nvme_read) << what;
  EXPECT_EQ(m.nvme_write_bytes, x.nvme_write) << what;
  EXPECT_EQ(m.host_to_device_bytes, x.host_to_device) << what;
  EXPECT_EQ(m.device_to_host_bytes, x.device_to_host) << what;
}

std::string name_of(const RunSpec& s, int step) {
  return testing::describe(s) + " param " + s.offload_param + ", step " + std::to_string(step + 1);
}

// offload_optimizer = nvme (stage 2: the gradient shard already on the host). A step reads every
// chunk's slot (master, m, v) once and writes it back once: F bytes each way, F the file's size.
// The first step also writes the whole file first (the master made from the working parameters,
// the moments zeroed: ChunkSwapper::run without reads), so it writes 2F, and reads those working
// parameters from the device (device -> host: the shard in W). Every step copies the updated
// shard to the device (host -> device: the shard in W) and moves the reduced gradient shard to
// the host partition (device -> host: the shard in the f32 reduce dtype, "reduced grads to
// host", by the gradient reducer).
TEST(OffloadObserve, NvmeOptimizerReadsAndWritesEveryChunkOncePerStep) {
  TempDir dir;
  constexpr long kChunk = 50;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (const char* aio : {"io_uring", "threads"}) {
      for (bool traced : {true, false}) {
        RunSpec spec{.stage = 2, .ranks = kRanks, .dtype = dt, .clip = true};
        spec.offload_buffers = 2;
        spec.offload_chunk = kChunk;
        spec.offload_device = "nvme";
        spec.nvme_path = dir.path();
        spec.aio_engine = aio;
        const std::size_t ws = dtype_size(dt);
        run_engine(spec, traced, [&](Engine& e, const std::vector<StepSeen>& seen) {
          const Shards sh = shards_of(e, kChunk);
          const std::vector<std::size_t> slots = sh.optim_slots();
          const std::uint64_t file = sum(slots);
          const std::size_t chunks = sh.chunks.size();
          ASSERT_GT(chunks, sh.numel.size());  // some unit has several chunks
          for (int step = 0; step < kSteps; ++step) {
            const std::string what = name_of(spec, step) + (traced ? " traced" : "");
            const bool first = step == 0;
            Expect x;
            x.nvme_read = file;
            x.nvme_write = first ? 2 * file : file;
            x.host_to_device = sh.total() * ws;
            const std::uint64_t params_to_host = first ? sh.total() * ws : 0;
            const std::uint64_t grads_to_host = sh.total() * 4;
            x.device_to_host = params_to_host + grads_to_host;
            expect_counters(seen[step].metrics, x, what);
            if (!traced) {
              EXPECT_TRUE(seen[step].events.empty()) << what;
              continue;
            }
            const std::vector<TraceEvent>& ev = seen[step].events;
            const auto nvme = lane_totals(ev, TraceLane::kNvme);
            EXPECT_EQ(get(nvme, "nvme read").count, chunks) << what;
            EXPECT_EQ(get(nvme, "nvme read").bytes, x.nvme_read) << what;
            EXPECT_EQ(get(nvme, "nvme write").count, first ? 2 * chunks : chunks) << what;
            EXPECT_EQ(get(nvme, "nvme write").bytes, x.nvme_write) << what;
            for (const TraceEvent& r : ev) {  // each request is one chunk's slot
              if (r.lane != TraceLane::kNvme) continue;
              ASSERT_GE(r.unit, 0) << what;
              ASSERT_LT(static_cast<std::size_t>(r.unit), chunks) << what;
              EXPECT_EQ(r.bytes, static_cast<std::int64_t>(slots[static_cast<std::size_t>(r.unit)]))
                  << what << " chunk " << r.unit;
            }
            const auto opt = lane_totals(ev, TraceLane::kOptimizer);
            EXPECT_EQ(get(opt, "optimizer chunk").count, chunks) << what;
            EXPECT_EQ(get(opt, "optimizer chunk").bytes,
                      sh.total() * (4 + kNumStates * kStateBytes))
                << what;
            const auto copies = lane_totals(ev, TraceLane::kOffload);
            EXPECT_EQ(get(copies, "params to device").count, chunks) << what;
            EXPECT_EQ(get(copies, "params to device").bytes, x.host_to_device) << what;
            EXPECT_EQ(get(copies, "params to host").count, first ? chunks : 0) << what;
            EXPECT_EQ(get(copies, "params to host").bytes, params_to_host) << what;
            EXPECT_EQ(get(copies, "grads to host").count, 0u) << what;
            EXPECT_GE(get(copies, "reduced grads to host").count, 1u) << what;  // per reduction
            EXPECT_EQ(get(copies, "reduced grads to host").bytes, grads_to_host) << what;
          }
        });
      }
    }
  }
}

// offload_optimizer = cpu: no file I/O; the gradient shard goes to the host once (device -> host,
// in the reduce dtype, f32 here): stage 1's optimizer copies it in chunk by chunk, stage 2's
// reducer moves each reduced shard to the host partition; stages 1-2 copy the updated shard out
// (host -> device, in W). The CPU device's copies are memcpy, counted as the traffic they stand
// for.
TEST(OffloadObserve, HostOptimizerCopiesEachShardOncePerStepEachWay) {
  constexpr long kChunk = 37;
  for (int stage : {1, 2}) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      for (bool traced : {true, false}) {
        RunSpec spec{.stage = stage, .ranks = kRanks, .dtype = dt, .clip = true};
        spec.offload_buffers = 2;
        spec.offload_chunk = kChunk;
        const std::size_t ws = dtype_size(dt), rs = 4;
        run_engine(spec, traced, [&](Engine& e, const std::vector<StepSeen>& seen) {
          const Shards sh = shards_of(e, kChunk);
          const std::size_t chunks = sh.chunks.size();
          for (int step = 0; step < kSteps; ++step) {
            const std::string what = name_of(spec, step) + (traced ? " traced" : "");
            Expect x;
            x.host_to_device = sh.total() * ws;
            x.device_to_host = sh.total() * rs;
            expect_counters(seen[step].metrics, x, what);
            if (!traced) {
              EXPECT_TRUE(seen[step].events.empty()) << what;
              continue;
            }
            const std::vector<TraceEvent>& ev = seen[step].events;
            EXPECT_TRUE(lane_totals(ev, TraceLane::kNvme).empty()) << what;
            const auto copies = lane_totals(ev, TraceLane::kOffload);
            // Stage 1: the optimizer's chunks; stage 2: the reducer's shards.
            const char* moved = stage == 1 ? "grads to host" : "reduced grads to host";
            const char* none = stage == 1 ? "reduced grads to host" : "grads to host";
            if (stage == 1) {
              EXPECT_EQ(get(copies, moved).count, chunks) << what;
            }
            EXPECT_GE(get(copies, moved).count, 1u) << what;
            EXPECT_EQ(get(copies, moved).bytes, x.device_to_host) << what;
            EXPECT_EQ(get(copies, none).count, 0u) << what;
            EXPECT_EQ(get(copies, "params to device").count, chunks) << what;
            EXPECT_EQ(get(copies, "params to device").bytes, x.host_to_device) << what;
            EXPECT_EQ(get(copies, "params to host").count, 0u) << what;
            const auto opt = lane_totals(ev, TraceLane::kOptimizer);
            EXPECT_EQ(get(opt, "optimizer chunk").count, chunks) << what;
            EXPECT_EQ(get(opt, "optimizer chunk").bytes,
                      sh.total() * (4 + kNumStates * kStateBytes))
                << what;
            // Each chunk's regions name it, with its own bytes.
            for (const TraceEvent& r : ev) {
              if (r.lane != TraceLane::kOffload && r.lane != TraceLane::kOptimizer) continue;
              if (std::string(r.name) == "reduced grads to host") continue;  // per unit, above
              ASSERT_GE(r.unit, 0) << what << " " << r.name;
              ASSERT_LT(static_cast<std::size_t>(r.unit), chunks) << what;
              const std::size_t n = sh.chunks[static_cast<std::size_t>(r.unit)];
              const std::size_t per = r.lane == TraceLane::kOptimizer
                                          ? 4 + kNumStates * kStateBytes
                                          : (std::string(r.name) == "grads to host" ? rs : ws);
              EXPECT_EQ(r.bytes, static_cast<std::int64_t>(n * per)) << what << " " << r.name;
            }
          }
        });
      }
    }
  }
}

// offload_param = nvme (stage 3, every unit sharded): the MLP gathers each unit twice per
// micro-step (forward, backward), each gather reads the unit's slot once (the first micro-step
// synchronously, later ones through the prefetch, which wastes no read here), and the optimizer
// writes each slot back once: P = the parameter file's size, 2P read and P written per step. With
// the optimizer on NVMe too, its file adds F each way, and the first step 2F written plus P read
// (the master made from the shards, loaded unit by unit into the window).
TEST(OffloadObserve, NvmeParametersAreReadOncePerGatherAndWrittenOncePerStep) {
  TempDir dir;
  constexpr long kChunk = 64;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (const char* opt : {"cpu", "nvme"}) {
      RunSpec spec{.stage = 3, .ranks = kRanks, .dtype = dt, .clip = true, .overlap = true};
      spec.offload_buffers = 2;
      spec.offload_chunk = kChunk;
      spec.offload_device = opt;
      spec.offload_param = "nvme";
      spec.nvme_path = dir.path();
      const bool nvme_opt = std::string(opt) == "nvme";
      run_engine(spec, /*traced=*/true, [&](Engine& e, const std::vector<StepSeen>& seen) {
        const Shards sh = shards_of(e, kChunk);
        const std::uint64_t params = sh.param_file(dtype_size(dt));
        const std::uint64_t file = nvme_opt ? sum(sh.optim_slots()) : 0;
        for (int step = 0; step < kSteps; ++step) {
          const std::string what = name_of(spec, step);
          const bool first = step == 0;
          const StepMetrics& m = seen[step].metrics;
          EXPECT_EQ(m.nvme_read_bytes, 2 * params + file + (first && nvme_opt ? params : 0))
              << what;
          EXPECT_EQ(m.nvme_write_bytes, params + (first ? 2 : 1) * file) << what;
          // The updated shards go to the window (host memory), not the device; each gather
          // copies the shard it read from the window into the gathered buffer on the device.
          EXPECT_EQ(m.host_to_device_bytes, 2 * sh.total() * dtype_size(dt)) << what;
          const auto nvme = lane_totals(seen[step].events, TraceLane::kNvme);
          EXPECT_EQ(get(nvme, "nvme read").bytes, m.nvme_read_bytes) << what;
          EXPECT_EQ(get(nvme, "nvme write").bytes, m.nvme_write_bytes) << what;
          // The reduced gradient shard to the host partition (f32), once per micro-step.
          const auto copies = lane_totals(seen[step].events, TraceLane::kOffload);
          EXPECT_EQ(get(copies, "reduced grads to host").bytes, sh.total() * 4) << what;
          EXPECT_EQ(m.device_to_host_bytes, sh.total() * 4 + get(copies, "params to host").bytes)
              << what;
        }
      });
    }
  }
}

// offload_param = cpu on a discrete device: each gather copies this rank's pinned shard into the
// gathered buffer (host -> device, the shard in W; twice per unit per micro-step, as above), and
// the optimizer copies the updated shard out once: 3 x the shard in W per step.
TEST(OffloadObserve, HostParameterShardsAreCopiedToTheDeviceAtEachGather) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    RunSpec spec{.stage = 3, .ranks = kRanks, .dtype = dt, .clip = true, .overlap = true};
    spec.offload_buffers = 2;
    spec.offload_chunk = 100;
    spec.offload_param = "cpu";
    spec.discrete = true;
    run_engine(spec, /*traced=*/true, [&](Engine& e, const std::vector<StepSeen>& seen) {
      const Shards sh = shards_of(e, 100);
      for (int step = 0; step < kSteps; ++step) {
        const std::string what = name_of(spec, step);
        const StepMetrics& m = seen[step].metrics;
        EXPECT_EQ(m.host_to_device_bytes, 3 * sh.total() * dtype_size(dt)) << what;
        EXPECT_EQ(m.nvme_read_bytes, 0u) << what;
        EXPECT_EQ(m.nvme_write_bytes, 0u) << what;
        const auto copies = lane_totals(seen[step].events, TraceLane::kOffload);
        EXPECT_EQ(get(copies, "params to device").bytes, sh.total() * dtype_size(dt)) << what;
        // The reduced gradient shard lands on the host through the copy lane (f32).
        EXPECT_EQ(m.device_to_host_bytes, sh.total() * 4) << what;
        EXPECT_EQ(get(copies, "reduced grads to host").bytes, sh.total() * 4) << what;
      }
    });
  }
}

}  // namespace
}  // namespace zero
