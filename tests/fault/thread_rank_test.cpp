// In-process ranks (ThreadGroup::run) meeting a fault in the engine's step: a rank that throws
// makes the run fail at once with its error, the other rank's naming the collective it waited
// in; a rank stuck outside collectives (sleeping, or a computation that never ends) makes the
// process end within comm_timeout_s + kRankExitGraceS with one line naming it and what it did
// last. Each case runs tests/fault/fault_rank as a subprocess (the stuck case ends its process)
// and prints the measured time. The bounds add tests/common/load_slack.hpp's slack for the
// process's start and teardown on a loaded machine; the thrown case's timeout is above that slack,
// so "did not wait for the timeout" still holds apart from waiting for it.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "common/load_slack.hpp"
#include "fault/subprocess.hpp"
#include "zero/comm/comm.hpp"

namespace zero {
namespace {

using testing::line_with;
using testing::load_slack_s;
using testing::run_subprocess;
using testing::time_on_line;

// The stuck cases wait for this timeout to fire.
constexpr double kCommTimeoutS = 2.0;

struct ThrowCase {
  const char* point;
  const char* waited_in;  // what the other rank's error names
};

class ThreadRankThrows : public ::testing::TestWithParam<ThrowCase> {};

TEST_P(ThreadRankThrows, RunFailsAtOnceNamingTheRankAndTheCollective) {
  const ThrowCase c = GetParam();
  // A timeout the failure must beat by far: an error that waited for it would come after it.
  const double timeout_s = testing::timeout_above_slack_s();
  const auto r = run_subprocess(
      {ZERO_FAULT_RANK, "thread", c.point, "throw", std::to_string(timeout_s)}, 2 * timeout_s + 60);
  ASSERT_FALSE(r.watchdog_fired) << r.output;
  EXPECT_TRUE(r.exited && r.status == 1) << "status " << r.status << "\n" << r.output;
  // run() rethrows the root cause: rank 1's exception.
  const std::string run_error = line_with(r.output, "FAULT-RUN-ERROR");
  EXPECT_NE(std::string::npos, run_error.find(std::string("injected fault at ") + c.point))
      << r.output;
  // Rank 0 fails promptly with kRemoteFailure, naming rank 1, its error and the collective.
  const std::string rank0 = line_with(r.output, "FAULT-ERROR rank 0");
  EXPECT_NE(std::string::npos, rank0.find("code=remote failure")) << r.output;
  EXPECT_NE(std::string::npos, rank0.find("rank 1 failed: injected fault")) << r.output;
  EXPECT_NE(std::string::npos, rank0.find(c.waited_in)) << r.output;
  const double injected = time_on_line(r.output, "FAULT-INJECT");
  ASSERT_GT(injected, 0) << r.output;
  const double to_exit = r.end_realtime_s - injected;
  std::printf(
      "in-process rank 1 throws at %s: rank 0 failed %.3f s later, process exited "
      "%.3f s later (bound %.1f s, timeout %.1f s)\n",
      c.point, time_on_line(r.output, "FAULT-ERROR rank 0") - injected, to_exit, load_slack_s(),
      timeout_s);
  EXPECT_LT(to_exit, load_slack_s()) << "a thrown error must not wait for the timeout\n"
                                     << r.output;
}

INSTANTIATE_TEST_SUITE_P(Points, ThreadRankThrows,
                         ::testing::Values(ThrowCase{"forward", "all_gather("},
                                           ThrowCase{"backward", "reduce_scatter("},
                                           ThrowCase{"step-norm", "all_gather(4 x f32)"},
                                           ThrowCase{"step-params", "all_gather("}),
                         [](const auto& info) {
                           std::string n = info.param.point;
                           for (char& ch : n) ch = ch == '-' ? '_' : ch;
                           return n;
                         });

class ThreadRankStuck : public ::testing::TestWithParam<const char*> {};

TEST_P(ThreadRankStuck, ProcessEndsWithinTheTimeoutPlusGraceNamingTheRank) {
  const std::string action = GetParam();
  const auto r = run_subprocess(
      {ZERO_FAULT_RANK, "thread", "forward", action, std::to_string(kCommTimeoutS)}, 60);
  ASSERT_FALSE(r.watchdog_fired) << "the stuck rank kept the process alive\n" << r.output;
  EXPECT_TRUE(r.exited && r.status == kStuckRankExitCode) << "status " << r.status << "\n"
                                                          << r.output;
  // Rank 0 timed out in the forward all_gather, waiting for rank 1.
  const std::string rank0 = line_with(r.output, "FAULT-ERROR rank 0");
  EXPECT_NE(std::string::npos, rank0.find("code=timeout")) << r.output;
  EXPECT_NE(std::string::npos, rank0.find("all_gather(")) << r.output;
  EXPECT_NE(std::string::npos, rank0.find("ranks not at the collective: {1}")) << r.output;
  // The launcher's one line: the stuck rank, what it did last, why the group failed.
  const std::string line = line_with(r.output, "zero: ThreadGroup::run:");
  EXPECT_NE(std::string::npos, line.find("rank 1 did not return")) << r.output;
  EXPECT_NE(std::string::npos, line.find("its last collective, ")) << r.output;
  EXPECT_NE(std::string::npos, line.find("completed: it is in its own code")) << r.output;
  EXPECT_NE(std::string::npos, line.find("rank 0 timed out after")) << r.output;
  EXPECT_EQ(std::string::npos, line.find("rank 0 did not return")) << r.output;
  const double stuck = time_on_line(r.output, "FAULT-INJECT");
  ASSERT_GT(stuck, 0) << r.output;
  const double to_exit = r.end_realtime_s - stuck;
  const double bound = kCommTimeoutS + kRankExitGraceS + load_slack_s();
  std::printf(
      "in-process rank 1 stuck (%s): process ended %.3f s after (timeout %.1f s + grace "
      "%.1f s; bound %.1f s)\n",
      action.c_str(), to_exit, kCommTimeoutS, kRankExitGraceS, bound);
  EXPECT_GE(to_exit, kCommTimeoutS + kRankExitGraceS - 0.1) << "ended before the grace passed";
  EXPECT_LT(to_exit, bound) << r.output;
}

INSTANTIATE_TEST_SUITE_P(Actions, ThreadRankStuck, ::testing::Values("sleep", "spin"));

}  // namespace
}  // namespace zero
