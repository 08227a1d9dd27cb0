// The timeline of the default zero-bench stage-3 run, as a viewer reads it: the document follows
// the Chrome trace event format (every event ph / ts / pid / tid, B/E pairs matched per track),
// holds one process per rank with the lanes a stage-3 step touches, and shows the prefetch of unit
// u+1 running while the trainer computes unit u — measured from the trace: the intersection of
// the all-gather's execution with the forward region of the unit before it. The same run without
// prefetch (stage3_prefetch_bucket_size 0) must show none: the check can fail. zero-train's
// --trace and --metrics as a user runs them.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

#include "common/run_command.hpp"
#include "common/temp_dir.hpp"
#include "common/trace_json.hpp"

#ifndef ZERO_BENCH_BIN
#error "ZERO_BENCH_BIN must name the zero-bench binary"
#endif

namespace zero {
namespace {

using json = nlohmann::json;
using testing::Region;

json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return json::parse(in);
}

struct Overlap {
  int prefetches = 0;           // all-gathers of unit u+1 in flight when unit u's forward began
  int overlapping = 0;          // ... of them executing during that forward
  double overlap_us = 0;        // sum of the intersections
  double prefetch_exec_us = 0;  // sum of those all-gathers' execution
};

// Per rank: for each forward region of unit u, the all-gather of unit u+1 issued by the
// engine's gather(u) just before it (the in-flight region begins inside that gather region),
// and the part of that all-gather's execution that falls inside the forward.
std::map<int, Overlap> prefetch_overlap(const std::vector<Region>& regions) {
  std::map<int, Overlap> out;
  std::map<int, std::vector<const Region*>> forward, in_flight, gathers;
  std::map<std::pair<int, std::int64_t>, const Region*> exec;  // (pid, seq)
  for (const Region& r : regions) {
    if (r.cat == "trainer" && r.name == "forward") forward[r.pid].push_back(&r);
    if (r.cat == "engine" && r.name == "gather") gathers[r.pid].push_back(&r);
    if (r.name != "all_gather") continue;
    if (r.cat == "comm in flight") in_flight[r.pid].push_back(&r);
    if (r.cat == "comm") exec[{r.pid, r.arg("seq")}] = &r;
  }
  for (const auto& [pid, fwd] : forward) {
    Overlap& o = out[pid];
    for (const Region* f : fwd) {
      const std::int64_t next = f->arg("unit") + 1;
      const Region* g = nullptr;  // the last gather(u) that began before the forward
      for (const Region* c : gathers[pid]) {
        if (c->arg("unit") == f->arg("unit") && c->begin <= f->begin) g = c;
      }
      if (g == nullptr) continue;
      for (const Region* fl : in_flight[pid]) {
        if (fl->arg("unit") != next || fl->begin < g->begin || fl->begin > g->end) continue;
        const Region* x = exec[{pid, fl->arg("seq")}];
        if (x == nullptr) {
          ADD_FAILURE() << "in-flight all_gather seq " << fl->arg("seq") << " of rank " << pid
                        << " has no execution region";
          continue;
        }
        ++o.prefetches;
        o.prefetch_exec_us += x->end - x->begin;
        const double ov = std::min(x->end, f->end) - std::max(x->begin, f->begin);
        if (ov > 0) {
          ++o.overlapping;
          o.overlap_us += ov;
        }
      }
    }
  }
  return out;
}

std::vector<Region> traced_stage3_run(const std::string& tag, const std::string& extra) {
  const testing::TempDir tmp(tag);
  const std::string path = tmp.file("trace.json");
  const std::string written = tmp.file("trace.stage3.json");
  // zero-bench's default model and ranks (6 layers, dim 192, 4 in-process ranks), stage 3.
  const testing::CmdResult r = testing::run_command(
      std::string(ZERO_BENCH_BIN) +
      " --stages 3 --checkpoint none --offload none --steps 3 --trace " + path + " " + extra);
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("traced/off"), std::string::npos) << r.out;  // the overhead column
  return testing::regions_of(read_json(written));
}

TEST(Trace, DefaultStageThreeRunIsAValidTraceWithPrefetchOverlappingCompute) {
  const std::vector<Region> regions = traced_stage3_run("prefetch", "");
  ASSERT_FALSE(regions.empty());
  std::map<int, std::set<std::string>> lanes;
  for (const Region& r : regions) lanes[r.pid].insert(r.cat);
  ASSERT_EQ(lanes.size(), 4u);  // one process per rank
  for (const auto& [pid, cats] : lanes) {
    for (const char* lane :
         {"trainer", "engine", "comm", "comm in flight", "comm wait", "optimizer"}) {
      EXPECT_EQ(cats.count(lane), 1u) << "rank " << pid << " has no '" << lane << "' track";
    }
  }
  const std::map<int, Overlap> ov = prefetch_overlap(regions);
  double total = 0, exec = 0;
  int prefetches = 0, overlapping = 0;
  for (const auto& [pid, o] : ov) {
    // Steps 2 and 3 follow the plan recorded in step 1: 6 blocks + the final norm are prefetched
    // during the forward of the unit before each, per step.
    EXPECT_GE(o.prefetches, 2 * 7) << "rank " << pid;
    std::printf(
        "rank %d: %d prefetches, %d overlapping the previous unit's forward, %.2f ms of "
        "%.2f ms executing (%.0f%%)\n",
        pid, o.prefetches, o.overlapping, o.overlap_us / 1e3, o.prefetch_exec_us / 1e3,
        o.prefetch_exec_us > 0 ? 100 * o.overlap_us / o.prefetch_exec_us : 0.0);
    total += o.overlap_us;
    exec += o.prefetch_exec_us;
    prefetches += o.prefetches;
    overlapping += o.overlapping;
  }
  std::printf("all ranks: %d of %d prefetches overlap compute; %.2f ms of %.2f ms (%.0f%%)\n",
              overlapping, prefetches, total / 1e3, exec / 1e3,
              exec > 0 ? 100 * total / exec : 0.0);
  EXPECT_GT(overlapping, 0);
  EXPECT_GT(total, 0.0);
}

TEST(Trace, WithoutPrefetchNothingOverlapsTheForward) {
  const std::vector<Region> regions =
      traced_stage3_run("noprefetch", "--set zero_optimization.stage3_prefetch_bucket_size=0");
  const std::map<int, Overlap> ov = prefetch_overlap(regions);
  ASSERT_EQ(ov.size(), 4u);
  for (const auto& [pid, o] : ov) {
    EXPECT_EQ(o.prefetches, 0) << "rank " << pid;
    EXPECT_EQ(o.overlap_us, 0.0) << "rank " << pid;
  }
  // Every all-gather then runs inside the engine's gather(), which the forward follows.
  int gathers = 0;
  for (const Region& r : regions) gathers += r.cat == "comm" && r.name == "all_gather";
  EXPECT_GT(gathers, 0);
}

TEST(Trace, ZeroTrainWritesItsTimelineAndOneMetricsLinePerRankAndStep) {
  const testing::TempDir tmp;
  const std::string trace = tmp.file("trace.json");
  const std::string metrics = tmp.file("metrics.jsonl");
  const testing::CmdResult r = testing::run_command(
      std::string(ZERO_TRAIN_BIN) +
      " --ranks 2 --steps 3 --layers 2 --dim 64 --seq 32 --batch 2 --eval-every 0"
      " --zero-stage 3 --set zero_optimization.stage3_param_persistence_threshold=0"
      " --peak-flops 1e12 --trace " +
      trace + " --metrics " + metrics);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("MFU"), std::string::npos) << r.out;
  std::set<int> pids;
  for (const Region& reg : testing::regions_of(read_json(trace))) pids.insert(reg.pid);
  EXPECT_EQ(pids, (std::set<int>{0, 1}));
  std::ifstream in(metrics);
  ASSERT_TRUE(in.good());
  std::string line;
  std::set<std::pair<int, int>> seen;
  while (std::getline(in, line)) {
    const json j = json::parse(line);
    seen.insert({j["step"].get<int>(), j["rank"].get<int>()});
    const json& e = j["engine"];
    EXPECT_GT(j["tokens_per_s"].get<double>(), 0.0);
    EXPECT_GT(j["model_flops_per_s_per_rank"].get<double>(), 0.0);
    EXPECT_NEAR(j["mfu"].get<double>(), j["model_flops_per_s_per_rank"].get<double>() / 1e12, 1e-9);
    EXPECT_GT(j["peak_bytes"]["host"].get<double>(), 0.0);
    EXPECT_GT(e["comm_sent_bytes"].get<double>(), 0.0);
    EXPECT_LE(e["comm_wait_s"].get<double>(), e["window_s"].get<double>());
    EXPECT_LE(e["gather_s"].get<double>() + e["step_s"].get<double>(), e["window_s"].get<double>());
  }
  EXPECT_EQ(seen.size(), 6u);  // 3 steps x 2 ranks
}

#ifdef ZERO_MPIEXEC
TEST(Trace, UnderMpirunRankZeroWritesEveryProcesssTimeline) {
  const testing::TempDir tmp;
  const std::string trace = tmp.file("trace.json");
  const std::string metrics = tmp.file("metrics.jsonl");
  const testing::CmdResult r = testing::run_command(
      std::string(ZERO_MPIEXEC) + " --allow-run-as-root --oversubscribe -np 2 " + ZERO_TRAIN_BIN +
      " --steps 2 --layers 2 --dim 64 --seq 32 --batch 2 --eval-every 0 --zero-stage 3"
      " --trace " +
      trace + " --metrics " + metrics);
  ASSERT_EQ(r.status, 0) << r.out;
  std::map<int, int> forward;
  for (const Region& reg : testing::regions_of(read_json(trace))) {
    if (reg.cat == "trainer" && reg.name == "forward") ++forward[reg.pid];
  }
  // 2 steps x (embedding, 2 blocks, final) on each process.
  EXPECT_EQ(forward, (std::map<int, int>{{0, 8}, {1, 8}}));
  for (int rank = 0; rank < 2; ++rank) {  // each process its own metrics file
    std::ifstream in(metrics + ".rank" + std::to_string(rank));
    ASSERT_TRUE(in.good()) << rank;
    std::string line;
    int lines = 0;
    while (std::getline(in, line)) {
      EXPECT_EQ(json::parse(line)["rank"].get<int>(), rank);
      ++lines;
    }
    EXPECT_EQ(lines, 2);
  }
}
#endif

}  // namespace
}  // namespace zero
