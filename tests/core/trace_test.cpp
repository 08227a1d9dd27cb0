// The timeline and the step metrics: the tracer's ring, the Chrome trace writer (parsed back as
// JSON: every event has ph/ts/pid/tid, B/E pairs nest per track), the communicator's regions and
// time counters, the engine's StepMetrics against bytes computed from the layout, write_trace
// across in-process ranks, and the config key.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/expect_error.hpp"
#include "common/temp_dir.hpp"
#include "common/trace_json.hpp"
#include "zero/comm/comm.hpp"
#include "zero/config/config.hpp"
#include "zero/core/trace.hpp"
#include "zero/engine/engine.hpp"

namespace zero {
namespace {

using json = nlohmann::json;
using zero::testing::expect_error;
using zero::testing::Region;
using zero::testing::regions_of;

TraceClock::time_point at_ns(std::int64_t ns) {
  return TraceClock::time_point(std::chrono::nanoseconds(ns));
}

// ---- the ring and the writer

TEST(Tracer, KeepsTheNewestEventsAndCountsTheDropped) {
  Tracer t(3, 3);
  EXPECT_EQ(t.rank(), 3);
  for (int i = 0; i < 5; ++i) t.record(TraceLane::kEngine, "r", at_ns(i), at_ns(i + 1), i);
  const std::vector<TraceEvent> ev = t.events();
  ASSERT_EQ(ev.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(ev[static_cast<std::size_t>(i)].unit, i + 2);
  EXPECT_EQ(t.dropped(), 2u);
  t.clear();
  EXPECT_TRUE(t.events().empty());
  EXPECT_EQ(t.dropped(), 0u);
  expect_error([] { Tracer bad(0, 0); }, ErrorCode::kInvalidArgument, "capacity");
}

TEST(Tracer, ScopeWithoutTracerRecordsNothingAndWithOneRecordsItsRegion) {
  { TraceScope off(nullptr, TraceLane::kTrainer, "nothing"); }
  Tracer t(0);
  const std::int64_t before = trace_ns(TraceClock::now());
  {
    TraceScope on(&t, TraceLane::kTrainer, "forward", 4, 128);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const std::int64_t after = trace_ns(TraceClock::now());
  const std::vector<TraceEvent> ev = t.events();
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_STREQ(ev[0].name, "forward");
  EXPECT_EQ(ev[0].lane, TraceLane::kTrainer);
  EXPECT_EQ(ev[0].unit, 4);
  EXPECT_EQ(ev[0].bytes, 128);
  EXPECT_GE(ev[0].begin_ns, before);
  EXPECT_LE(ev[0].end_ns, after);
  EXPECT_GE(ev[0].end_ns - ev[0].begin_ns, 2'000'000);
}

TEST(ChromeTrace, OverlappingRegionsGoToSubTracksAndNestedOnesStay) {
  Tracer t(2);
  // On the comm-in-flight lane: A [1000, 10000] ns, B [5000, 15000] overlaps A without nesting,
  // C [2000, 3000] nests in A, D [10000, 12000] follows A.
  t.record(TraceLane::kCommInFlight, "A", at_ns(1000), at_ns(10000), 1, 64, 0);
  t.record(TraceLane::kCommInFlight, "B", at_ns(5000), at_ns(15000), 2);
  t.record(TraceLane::kCommInFlight, "C", at_ns(2000), at_ns(3000));
  t.record(TraceLane::kCommInFlight, "D", at_ns(10000), at_ns(12000));
  t.record(TraceLane::kTrainer, "quote\"back\\slash", at_ns(1500), at_ns(1600));
  std::ostringstream os;
  write_chrome_trace(os, {&t});
  const json doc = json::parse(os.str());
  const std::vector<Region> rs = regions_of(doc);
  ASSERT_EQ(rs.size(), 5u);
  std::map<std::string, Region> by;
  for (const Region& r : rs) by[r.name] = r;
  const int lane = static_cast<int>(TraceLane::kCommInFlight) * 100;
  EXPECT_EQ(by["A"].tid, lane);
  EXPECT_EQ(by["C"].tid, lane);  // nests in A
  EXPECT_EQ(by["D"].tid, lane);  // follows A
  EXPECT_EQ(by["B"].tid, lane + 1);
  EXPECT_EQ(by["A"].pid, 2);
  // ts in microseconds from the earliest event, nanoseconds kept.
  EXPECT_DOUBLE_EQ(by["A"].begin, 0.0);
  EXPECT_DOUBLE_EQ(by["A"].end, 9.0);
  EXPECT_DOUBLE_EQ(by["B"].end, 14.0);
  EXPECT_DOUBLE_EQ(by["quote\"back\\slash"].begin, 0.5);
  EXPECT_EQ(by["A"].args["unit"], 1);
  EXPECT_EQ(by["A"].args["bytes"], 64);
  EXPECT_EQ(by["A"].args["seq"], 0);
  EXPECT_FALSE(by["C"].args.contains("unit"));
  // Metadata: the rank's process and each track named.
  std::set<std::string> names;
  for (const json& e : doc["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") names.insert(e["args"]["name"]);
    if (e["ph"] == "M" && e["name"] == "process_name") {
      EXPECT_EQ(e["args"]["name"], "rank 2");
    }
  }
  EXPECT_EQ(names, (std::set<std::string>{"trainer", "comm in flight", "comm in flight #2"}));
}

// ---- the communicator

TEST(CommTrace, CollectivesWaitsAndTagsAreRecordedAndTimed) {
  std::atomic<std::int64_t> late_issue_ns{0};  // when rank 1 issued (one clock for all threads)
  ThreadGroup::run(2, [&](Communicator& comm) {
    Tracer t(comm.rank());
    comm.set_tracer(&t);
    std::vector<float> send(1000, 1.0f), recv(2000);
    comm.tag_next(7);
    EXPECT_EQ(comm.issued(), 0u);
    // Rank 1 issues 20 ms late: rank 0's wait is exposed.
    if (comm.rank() == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      late_issue_ns = trace_ns(TraceClock::now());
    }
    CommHandle h = comm.all_gather_async(send.data(), recv.data(), 1000, DType::kF32);
    h.wait();
    comm.all_reduce(send.data(), send.data(), 1000, DType::kF32, ReduceOp::kSum);  // blocking
    comm.set_tracer(nullptr);
    comm.barrier();  // not recorded
    std::map<TraceLane, std::vector<TraceEvent>> by;
    for (const TraceEvent& e : t.events()) by[e.lane].push_back(e);
    ASSERT_EQ(by[TraceLane::kComm].size(), 2u);
    ASSERT_EQ(by[TraceLane::kCommInFlight].size(), 2u);
    ASSERT_EQ(by[TraceLane::kCommWait].size(), 2u);
    const TraceEvent& ag = by[TraceLane::kComm][0];
    EXPECT_STREQ(ag.name, "all_gather");
    EXPECT_EQ(ag.unit, 7);
    EXPECT_EQ(ag.seq, 0);
    EXPECT_EQ(ag.bytes, 4000);
    const TraceEvent& ar = by[TraceLane::kComm][1];
    EXPECT_STREQ(ar.name, "all_reduce");
    EXPECT_EQ(ar.unit, -1);  // the tag is for one collective only
    EXPECT_EQ(ar.seq, 1);
    // In flight from issue to completion: contains the execution.
    const TraceEvent& fl = by[TraceLane::kCommInFlight][0];
    EXPECT_LE(fl.begin_ns, ag.begin_ns);
    EXPECT_EQ(fl.end_ns, ag.end_ns);
    EXPECT_EQ(by[TraceLane::kCommWait][0].seq, 0);
    EXPECT_EQ(by[TraceLane::kCommWait][1].seq, 1);
    const CommStats s = comm.stats();
    if (comm.rank() == 0) {
      // Its wait lasted until rank 1 issued (the all-gather cannot complete before): an order of
      // events, where a duration would depend on when the scheduler ran rank 0 (a 15 ms bound
      // failed once on a loaded machine).
      const TraceEvent& w = by[TraceLane::kCommWait][0];
      EXPECT_GE(w.end_ns, late_issue_ns.load());
      EXPECT_GT(w.end_ns, w.begin_ns);
      EXPECT_GE(s.wait_ns, static_cast<std::uint64_t>(w.end_ns - w.begin_ns));
    }
    std::uint64_t waited = 0;
    for (const TraceEvent& w : by[TraceLane::kCommWait]) {
      waited += static_cast<std::uint64_t>(w.end_ns - w.begin_ns);
    }
    EXPECT_GE(s.wait_ns, waited);  // the barrier after set_tracer(nullptr) still counts
    EXPECT_GT(s.busy_ns, 0u);
    EXPECT_EQ(s.resets, 0u);
    comm.reset_stats();
    EXPECT_EQ(comm.stats().busy_ns, 0u);
    EXPECT_EQ(comm.stats().wait_ns, 0u);
    EXPECT_EQ(comm.stats().resets, 1u);
  });
}

// ---- the engine

constexpr int kUnits = 3;
constexpr std::int64_t kElems[kUnits] = {1000, 333, 4097};

void declare(Engine& e) {
  for (int u = 0; u < kUnits; ++u) {
    e.add_unit({"u" + std::to_string(u), {{"w", {kElems[u]}}}});
  }
}

// One micro-step of a trainer whose "compute" is a sleep; gradients are constants.
StepResult micro_step(Engine& e, std::chrono::milliseconds compute) {
  for (int u = 0; u < kUnits; ++u) {
    GatherGuard g = e.gather(u);
    TraceScope region(e.tracer(), TraceLane::kTrainer, "forward", u);
  }
  std::this_thread::sleep_for(compute);
  for (int u = kUnits - 1; u >= 0; --u) {
    GatherGuard g = e.gather(u);
    const View v = e.grad(u, 0);
    for (std::size_t i = 0; i < v.count; ++i) static_cast<float*>(v.data)[i] = 0.01f;
    g.release();
    e.grads_ready(u);
  }
  return e.step();
}

TEST(EngineMetrics, BytesPhasesAndWaitsOfAStageTwoWindow) {
  const int n = 2;
  ThreadGroup::run(n, [&](Communicator& comm) {
    const Config cfg = parse_config(
        R"({"zero_optimization": {"stage": 2}, "gradient_accumulation_steps": 2,
            "trace": {"enabled": true, "capacity": 100000}})");
    Engine e(comm, cfg);
    ASSERT_NE(e.tracer(), nullptr);
    declare(e);
    micro_step(e, std::chrono::milliseconds(1));
    const StepResult r1 = micro_step(e, std::chrono::milliseconds(1));
    ASSERT_TRUE(r1.boundary);
    e.tracer()->clear();
    const StepResult a = micro_step(e, std::chrono::milliseconds(15));
    EXPECT_FALSE(a.boundary);
    EXPECT_EQ(a.metrics.micro_steps, 1);
    const StepResult b = micro_step(e, std::chrono::milliseconds(15));
    ASSERT_TRUE(b.boundary);
    const StepMetrics& m = b.metrics;
    EXPECT_EQ(m.micro_steps, 2);
    // Bytes one rank sends in a stage-2 window of two micro-steps (CommStats' ring accounting:
    // (N-1) x the per-rank piece): every unit's f32 gradient reduce-scattered each micro-step,
    // the updated f32 shard all-gathered once, and the 16-byte gradient statistics exchange.
    std::uint64_t expect = 0;
    for (int u = 0; u < kUnits; ++u) {
      const std::uint64_t shard = e.unit_shard_numel(u) * 4;
      expect += (n - 1) * shard * 2 + (n - 1) * shard;
    }
    expect += (n - 1) * 16;
    EXPECT_EQ(m.comm_bytes_sent, expect);
    EXPECT_EQ(m.comm_bytes_received, expect);
    EXPECT_EQ(
        m.nvme_read_bytes + m.nvme_write_bytes + m.host_to_device_bytes + m.device_to_host_bytes,
        0u);
    // Phases: the window holds them, the step holds its parts, the trainer slept 2 x 15 ms.
    EXPECT_GE(m.window_s, m.gather_s + m.grads_ready_s + m.step_s);
    EXPECT_GE(m.step_s, m.reduce_s + m.optimizer_s + m.param_gather_s);
    EXPECT_GE(m.trainer_s(), 0.030);
    EXPECT_GT(m.optimizer_s, 0.0);
    EXPECT_GT(m.comm_busy_s, 0.0);
    // The exposed time is the sum of the comm-wait regions of the window, to the nanosecond
    // (same clock reads), and each region lies inside the engine's hooks.
    std::int64_t waited_ns = 0;
    int engine_regions = 0;
    for (const TraceEvent& ev : e.tracer()->events()) {
      if (ev.lane == TraceLane::kCommWait) waited_ns += ev.end_ns - ev.begin_ns;
      if (ev.lane == TraceLane::kEngine) ++engine_regions;
    }
    EXPECT_NEAR(m.comm_wait_s, static_cast<double>(waited_ns) * 1e-9, 1e-9 * 4);
    // gather x 2 x 3 units, grads_ready x 3, step, per micro-step; reduce, optimizer and gather
    // updated at the boundary.
    EXPECT_EQ(engine_regions, 2 * (kUnits * 2 + kUnits + 1) + 3);
    // JSON line of the metrics: parses, with the same numbers.
    const json j = json::parse(to_json(m));
    EXPECT_EQ(j["comm_sent_bytes"].get<std::uint64_t>(), expect);
    EXPECT_EQ(j["micro_steps"], 2);
    EXPECT_NEAR(j["trainer_s"].get<double>(), m.trainer_s(), 1e-9);
  });
}

TEST(EngineMetrics, AStatsResetInsideTheWindowCountsFromTheReset) {
  ThreadGroup::run(2, [&](Communicator& comm) {
    Engine e(comm, parse_config(R"({"zero_optimization": {"stage": 2}})"));
    declare(e);
    micro_step(e, std::chrono::milliseconds(1));
    GatherGuard g = e.gather(0);  // opens the next window
    g.release();
    comm.reset_stats();  // the trainer's reset, inside it
    for (int u = kUnits - 1; u >= 0; --u) {
      GatherGuard h = e.gather(u);
      h.release();
      e.grad(u, 0);
      e.grads_ready(u);
    }
    const StepResult r = e.step();
    const CommStats s = comm.stats();
    EXPECT_EQ(r.metrics.comm_bytes_sent, s.bytes_sent());  // all of it after the reset
    EXPECT_EQ(r.metrics.comm_wait_s, static_cast<double>(s.wait_ns) * 1e-9);
    EXPECT_LT(r.metrics.comm_bytes_sent, std::uint64_t{1} << 40);
  });
}

TEST(EngineMetrics, StageThreeTagsEveryGatherAndReduceWithItsUnit) {
  ThreadGroup::run(2, [&](Communicator& comm) {
    Tracer t(comm.rank());
    EngineOptions eo;
    eo.tracer = &t;
    const Config cfg = parse_config(
        R"({"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}})");
    {
      Engine e(comm, cfg, eo);
      EXPECT_EQ(e.tracer(), &t);
      EXPECT_EQ(comm.tracer(), &t);
      declare(e);
      micro_step(e, std::chrono::milliseconds(1));
    }
    EXPECT_EQ(comm.tracer(), nullptr);  // the engine detached it
    std::map<std::string, std::set<std::int64_t>> units;
    for (const TraceEvent& ev : t.events()) {
      if (ev.lane == TraceLane::kComm) units[ev.name].insert(ev.unit);
    }
    EXPECT_EQ(units["reduce_scatter"], (std::set<std::int64_t>{0, 1, 2}));
    EXPECT_EQ(units["all_gather"].count(0), 1u);
    EXPECT_EQ(units["all_gather"].count(2), 1u);
  });
}

TEST(EngineTrace, WriteTraceGathersEveryRankIntoOneDocument) {
  const testing::TempDir tmp;
  const std::string path = tmp.file("trace.json");
  ThreadGroup::run(3, [&](Communicator& comm) {
    const Config cfg = parse_config(R"({"zero_optimization": {"stage": 3}, "trace": {"enabled":
        true}})");
    Engine e(comm, cfg);
    declare(e);
    micro_step(e, std::chrono::milliseconds(1));
    e.write_trace(path);
  });
  std::ifstream in(path);
  ASSERT_TRUE(in.good());
  const json doc = json::parse(in);
  const std::vector<Region> rs = regions_of(doc);
  std::set<int> pids;
  std::map<int, int> forward;
  for (const Region& r : rs) {
    pids.insert(r.pid);
    if (r.cat == "trainer" && r.name == "forward") ++forward[r.pid];
    EXPECT_GE(r.end, r.begin);
    EXPECT_GE(r.begin, 0.0);
  }
  EXPECT_EQ(pids, (std::set<int>{0, 1, 2}));
  for (int p = 0; p < 3; ++p) EXPECT_EQ(forward[p], kUnits) << "rank " << p;
}

TEST(EngineTrace, ErrorsNameWhatWasWrong) {
  const testing::TempDir tmp;  // where a trace would go, were tracing on
  ThreadGroup::run(1, [&](Communicator& comm) {
    Engine off(comm, parse_config(R"({"zero_optimization": {"stage": 1}})"));
    EXPECT_EQ(off.tracer(), nullptr);
    declare(off);
    expect_error([&] { off.write_trace(tmp.file("x.json")); }, ErrorCode::kInvalidArgument,
                 "tracing is off");
  });
  // An engine that fails to construct leaves no tracer (its own, destroyed) on the communicator.
  ThreadGroup::run(1, [&](Communicator& comm) {
    EngineOptions eo;
    eo.device = Device::cuda(0);  // with the in-process communicator: refused at construction
    EXPECT_THROW(Engine(comm, parse_config(R"({"trace": {"enabled": true}})"), eo), Error);
    EXPECT_EQ(comm.tracer(), nullptr);
    comm.barrier();
  });
  // Rank 0 cannot write the file: every rank fails alike (none waits for a fragment forever).
  ThreadGroup::run(3, [&](Communicator& comm) {
    Engine on(comm, parse_config(R"({"trace": {"enabled": true}})"));
    declare(on);
    expect_error([&] { on.write_trace("/nonexistent-dir/t.json"); }, ErrorCode::kIO,
                 "/nonexistent-dir/t.json");
  });
  expect_error([] { parse_config(R"({"trace": {"capacity": 0}})"); }, ErrorCode::kConfig,
               "trace.capacity");
  expect_error([] { parse_config(R"({"trace": {"path": ""}})"); }, ErrorCode::kConfig,
               "trace.path");
  expect_error([] { parse_config(R"({"trace": {"enable": true}})"); }, ErrorCode::kConfig,
               "trace.enable");
  const Config c = parse_config(R"({"trace": {"enabled": true, "path": "t.json"}})");
  const Config back = parse_config(c.to_json());
  EXPECT_TRUE(back.trace.enabled);
  EXPECT_EQ(back.trace.path, "t.json");
  EXPECT_EQ(back.trace.capacity, 1'048'576);
}

}  // namespace
}  // namespace zero
