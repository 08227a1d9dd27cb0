// Ranks that disagree and the flight recorder, between in-process ranks: a rank that skips a
// unit's gather, reduces another count or has another model fails with every other rank at the
// collective where they diverged, each naming both calls and the unit (divergence_checks.hpp, the
// scenarios mpi_fingerprint_test.cpp runs across processes); a rank that times out writes its
// flight record, and zero::flight_report names the rank that never joined.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>
#include <tuple>

#include "comm/divergence_checks.hpp"
#include "common/expect_error.hpp"
#include "common/temp_dir.hpp"
#include "zero/comm/comm.hpp"

// ---- ranks that disagree (the fingerprint rule, comm/fingerprint.hpp)

namespace zero::test {
namespace {

class ThreadDivergence : public ::testing::TestWithParam<std::tuple<Divergence, int>> {};

TEST_P(ThreadDivergence, EveryRankFailsAtTheCollectiveNamingBothCallsAndUnits) {
  const auto [d, n] = GetParam();
  constexpr double kTimeoutS = 120;  // far above the time to the error: it must not be the cause
  std::mutex mu;
  std::vector<DivergenceSeen> seen(n);
  try {
    ThreadGroup::run(
        n,
        [&](Communicator& c) {
          DivergenceSeen s = run_divergence(c, d);
          std::lock_guard lock(mu);
          seen[c.rank()] = s;
        },
        kTimeoutS);
  } catch (const Error&) {
  }
  for (int r = 0; r < n; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_TRUE(seen[r].failed);
    EXPECT_EQ(ErrorCode::kInvalidArgument, seen[r].code) << seen[r].message;
    for (const std::string& name : divergence_names(d, n)) {
      EXPECT_NE(std::string::npos, seen[r].message.find(name)) << seen[r].message;
    }
  }
  std::printf(
      "%s at %d in-process ranks: rank 0 failed %.3f s after the start (timeout %.0f s): %s\n",
      to_string(d), n, seen[0].seconds, kTimeoutS, seen[0].message.c_str());
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ThreadDivergence,
    ::testing::Combine(::testing::Values(Divergence::kSkipsAGather, Divergence::kOtherCount,
                                         Divergence::kOtherModel, Divergence::kPaddedModel,
                                         Divergence::kOtherShapes, Divergence::kOtherFrozen),
                       ::testing::Values(2, 3, 4)),
    [](const auto& info) {
      return std::string(to_string(std::get<0>(info.param))) + "_np" +
             std::to_string(std::get<1>(info.param));
    });

}  // namespace
}  // namespace zero::test

// ---- the flight recorder between in-process ranks

namespace zero::test {
namespace {

TEST(ThreadFlight, TimedOutRankWritesItsRecordAndTheReportNamesTheAbsentRank) {
  namespace fs = std::filesystem;
  const testing::TempDir tmp;
  const fs::path dir = tmp.file("flight");  // made by the recorder
  ThreadGroup group(2, 120);  // the collective both ranks join cannot time out on a busy machine
  auto c0 = group.communicator(0);
  auto c1 = group.communicator(1);
  c0->set_flight_recorder(8, dir.string());
  c0->set_phase("backward", 3);
  std::vector<float> a(4, 1.0f), b(8);
  std::thread peer([&] {
    c1->tag_next(0);
    c1->all_gather(a.data(), b.data(), 4, DType::kF32);
  });
  c0->tag_next(0);
  c0->all_gather(a.data(), b.data(), 4, DType::kF32);
  peer.join();
  // Rank 1 never joins seq 1: rank 0 times out, and its record says where it waits.
  c0->set_timeout_s(0.5);  // the timeout is the event this test waits for
  c0->tag_next(3);
  EXPECT_THROW(c0->reduce_scatter(b.data(), a.data(), 4, DType::kF32, ReduceOp::kSum), Error);
  ASSERT_TRUE(fs::exists(dir / "flight_rank0.json"));
  const std::string report = flight_report(dir.string());
  EXPECT_NE(std::string::npos,
            report.find("rank 0: at seq 1 reduce_scatter(4 x f32, sum) unit 3 (issued"))
      << report;
  EXPECT_NE(std::string::npos, report.find("phase backward unit 3")) << report;
  EXPECT_NE(std::string::npos, report.find("rank 1: no record")) << report;
  EXPECT_NE(std::string::npos,
            report.find("=> rank 1 has no record (stopped or killed: it has not joined what the "
                        "others wait for); rank 0 waits at seq 1 reduce_scatter(4 x f32, sum) "
                        "unit 3"))
      << report;
}

TEST(ThreadFlight, ReportRefusesAnEmptyDirectoryAndAForeignFile) {
  namespace fs = std::filesystem;
  const testing::TempDir tmp;
  const fs::path dir = tmp.path();
  testing::expect_error([&] { flight_report(dir.string()); }, ErrorCode::kIO, "no flight_rank");
  std::ofstream(dir / "flight_rank3.json") << "{\"rank\": 3}";
  testing::expect_error([&] { flight_report(dir.string()); }, ErrorCode::kCorruption,
                        "flight_rank3.json");
}

}  // namespace
}  // namespace zero::test
