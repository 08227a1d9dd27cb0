// zero::flight_report (what zero-doctor prints) on flight records written the way the recorder
// writes them (detail::flight_record_json), for the places ranks stop: the verdict names the rank
// behind — waiting at an earlier collective than the others, or at none without having issued
// theirs, or without a record — and where the others wait. The records of real ranks (in-process,
// MPI with SIGSTOP / SIGKILL) are checked in thread_divergence_test.cpp and
// fault/mpi_flight_test.cpp.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "comm/flight_recorder.hpp"
#include "common/temp_dir.hpp"
#include "zero/comm/comm.hpp"

namespace zero::test {
namespace {

namespace fs = std::filesystem;
using detail::FlightRecorder;

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

enum class At { kFinished, kStarted, kIssued };

FlightRecorder::Entry call(std::uint64_t seq, Collective kind, std::size_t count, std::int64_t unit,
                           At at) {
  FlightRecorder::Entry e;
  e.call.seq = seq;
  e.call.count = count;
  e.call.tag = unit;
  e.call.kind = static_cast<std::uint8_t>(kind);
  e.call.dtype = static_cast<std::uint8_t>(DType::kF32);
  e.call.op = static_cast<std::uint8_t>(ReduceOp::kSum);
  e.call.valid = 1;
  const std::int64_t t = now_ns() - 2'000'000'000;  // two seconds ago
  e.issued_ns = t;
  if (at != At::kIssued) e.started_ns = t + 1000;
  if (at == At::kFinished) e.finished_ns = t + 2000;
  return e;
}

class FlightReport : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = tmp_.path(); }

  void write(int rank, const std::string& phase, std::int64_t unit,
             std::vector<FlightRecorder::Entry> calls, int world = 3) {
    FlightRecorder::Snapshot s;
    s.world_rank = rank;
    for (int r = 0; r < world; ++r) s.ranks.push_back(r);
    s.backend = "mpi";
    s.phase = phase;
    s.phase_unit = unit;
    s.calls = std::move(calls);
    std::ofstream(dir_ / ("flight_rank" + std::to_string(rank) + ".json"))
        << detail::flight_record_json(rank, "signal SIGUSR1", {s});
  }
  std::string report() const { return flight_report(dir_.string()); }

  testing::TempDir tmp_;
  fs::path dir_;
};

void expect_has(const std::string& report, const std::string& text) {
  EXPECT_NE(std::string::npos, report.find(text)) << "missing: " << text << "\nin:\n" << report;
}

TEST_F(FlightReport, RankIssuedButNeverStartedAnEarlierCollectiveIsTheOneStopped) {
  for (int r : {0, 1}) {
    write(r, "backward", 6,
          {call(40, Collective::kAllGather, 512, 8, At::kFinished),
           call(41, Collective::kAllGather, 512, 7, At::kFinished),
           call(42, Collective::kReduceScatter, 256, 6, At::kStarted)});
  }
  write(2, "gather", 7,
        {call(40, Collective::kAllGather, 512, 8, At::kFinished),
         call(41, Collective::kAllGather, 512, 7, At::kIssued)});
  const std::string out = report();
  expect_has(out, "flight records of 3 of 3 ranks");
  // The age ("issued 2.0 s before the record") depends on when the files were written: not
  // compared.
  expect_has(out, "rank 2: at seq 41 all_gather(512 x f32) unit 7 (issued ");
  expect_has(out, "=> rank 2 stopped at seq 41 all_gather(512 x f32) unit 7 (issued ");
  expect_has(out,
             " s before the record, never started), phase gather unit 7; ranks 0, 1 wait at "
             "seq 42 reduce_scatter(256 x f32, sum) unit 6\n");
}

TEST_F(FlightReport, RankStoppedBetweenCollectivesIsBehindTheOnesWaiting) {
  // Ranks 0 and 1 wait in seq 5; rank 2 finished seq 4 and never issued seq 5 (it stopped in its
  // compute): it is behind although no collective of its is open.
  for (int r : {0, 1}) {
    write(r, "backward", 1,
          {call(4, Collective::kReduceScatter, 64, 2, At::kFinished),
           call(5, Collective::kReduceScatter, 64, 1, At::kStarted)});
  }
  write(2, "backward", 1, {call(4, Collective::kReduceScatter, 64, 2, At::kFinished)});
  expect_has(report(),
             "=> rank 2 stopped after seq 4 reduce_scatter(64 x f32, sum) unit 2, phase backward "
             "unit 1 (seq 5 never issued); ranks 0, 1 wait at seq 5 reduce_scatter(64 x f32, sum) "
             "unit 1\n");
}

TEST_F(FlightReport, RankWithoutARecordIsNamedBesideWhereTheOthersWait) {
  write(0, "step", -1, {call(7, Collective::kAllReduce, 16, -1, At::kStarted)}, 2);
  const std::string out = report();
  expect_has(out, "rank 1: no record");
  expect_has(out,
             "=> rank 1 has no record (stopped or killed: it has not joined what the others "
             "wait for); rank 0 waits at seq 7 all_reduce(16 x f32, sum) no unit");
}

TEST_F(FlightReport, WhenNoRankWaitsTheRankThatIssuedFewestIsBehind) {
  write(0, "step", -1, {call(5, Collective::kBarrier, 0, -1, At::kFinished)}, 2);
  write(1, "step", -1, {call(4, Collective::kBarrier, 0, -1, At::kFinished)}, 2);
  expect_has(report(), "=> rank 1 stopped after seq 4 barrier no unit, phase step");
}

TEST_F(FlightReport, RanksAtTheSamePlaceWaitOnNoOne) {
  for (int r : {0, 1}) {
    write(r, "", -1, {call(3, Collective::kBroadcast, 8, 2, At::kFinished)}, 2);
  }
  expect_has(report(), "=> every rank is at the same place: none waits on another");
}

}  // namespace
}  // namespace zero::test
