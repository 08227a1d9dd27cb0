// A rank of a 2-rank mpirun job killed (raise(SIGKILL) in its own program) at 4 points of the
// engine's step (tests/fault/fault_rank.cpp): before forward, in backward with a reduce-scatter
// in flight, and in the optimizer step at the gradient-statistics all-gather and at the
// parameter all-gather. Two launchers:
//   teardown     plain mpirun, which kills the job when a rank dies: the job must end in a
//                non-zero status at once.
//   no teardown  mpirun --enable-recovery (Open MPI 4.1: the job goes on without the dead rank;
//                --mca orte_abort_on_non_zero_status 0 was tried: mpirun then never exits after
//                a rank's death), each rank wrapped in sh to record its exit status and time
//                (mpirun --enable-recovery itself exits 0). The survivor must fail by itself:
//                kTimeout naming the collective it waited in, and exit within comm_timeout_s +
//                the MPI backend's grace after the dead rank.
// Each case prints the measured time to exit.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "common/load_slack.hpp"
#include "fault/subprocess.hpp"

namespace zero {
namespace {

using testing::line_with;
using testing::load_slack_s;
using testing::run_subprocess;
using testing::time_on_line;

constexpr double kCommTimeoutS = 3.0;
// kBrokenGrace in comm/mpi_communicator.cpp: what a broken communicator's destructor waits
// for the timed-out collective after comm_timeout_s.
constexpr double kMpiGraceS = 3.0;

struct KillCase {
  const char* point;
  const char* waited_in;  // what the survivor's error names
};

class MpiRankKilled : public ::testing::TestWithParam<KillCase> {};

std::vector<std::string> mpirun(bool recovery) {
  std::vector<std::string> argv = {ZERO_MPIEXEC, "--allow-run-as-root", "--oversubscribe", "-np",
                                   "2"};
  if (recovery) argv.push_back("--enable-recovery");
  return argv;
}

TEST_P(MpiRankKilled, TeardownEndsTheJobAtOnceWithAnError) {
  const KillCase c = GetParam();
  auto argv = mpirun(false);
  for (const std::string a : {ZERO_FAULT_RANK, "mpi", c.point, "kill"}) argv.push_back(a);
  argv.push_back(std::to_string(kCommTimeoutS));
  const auto r = run_subprocess(argv, 120);
  ASSERT_FALSE(r.watchdog_fired) << r.output;
  EXPECT_TRUE(!r.exited || r.status != 0) << "the job ended in status 0\n" << r.output;
  const double killed = time_on_line(r.output, "FAULT-INJECT rank 1 kill");
  ASSERT_GT(killed, 0) << "rank 1 did not reach the fault\n" << r.output;
  EXPECT_EQ("", line_with(r.output, "FAULT-DONE")) << r.output;
  const double to_exit = r.end_realtime_s - killed;
  const std::string survivor = line_with(r.output, "FAULT-ERROR rank 0");
  std::printf(
      "mpirun (teardown), rank 1 killed at %s: job ended %.3f s later, %s %d; "
      "survivor's error: %s\n",
      c.point, to_exit, r.exited ? "status" : "signal", r.status,
      survivor.empty() ? "none (killed by mpirun)" : survivor.c_str());
  EXPECT_LT(to_exit, kCommTimeoutS + kMpiGraceS + load_slack_s()) << r.output;
}

TEST_P(MpiRankKilled, WithoutTeardownTheSurvivorTimesOutNamingTheCollective) {
  const KillCase c = GetParam();
  auto argv = mpirun(true);
  argv.push_back("sh");
  argv.push_back("-c");
  argv.push_back(std::string("\"$0\" mpi ") + c.point + " kill " + std::to_string(kCommTimeoutS) +
                 "; echo \"FAULT-EXIT rank $OMPI_COMM_WORLD_RANK status $? t=$(date +%s.%N)\"");
  argv.push_back(ZERO_FAULT_RANK);
  const auto r = run_subprocess(argv, 120);
  ASSERT_FALSE(r.watchdog_fired) << "the survivor did not exit\n" << r.output;
  const std::string dead = line_with(r.output, "FAULT-EXIT rank 1");
  const std::string alive = line_with(r.output, "FAULT-EXIT rank 0");
  EXPECT_NE(std::string::npos, dead.find("status 137")) << r.output;  // 128 + SIGKILL
  EXPECT_NE(std::string::npos, alive.find("status 1 ")) << r.output;
  const std::string survivor = line_with(r.output, "FAULT-ERROR rank 0");
  EXPECT_NE(std::string::npos, survivor.find("code=timeout")) << r.output;
  EXPECT_NE(std::string::npos, survivor.find(c.waited_in)) << r.output;
  EXPECT_NE(std::string::npos, survivor.find("timed out after 3 s")) << r.output;
  const double died = time_on_line(r.output, "FAULT-EXIT rank 1");
  const double exited = time_on_line(r.output, "FAULT-EXIT rank 0");
  const double failed = time_on_line(r.output, "FAULT-ERROR rank 0");
  ASSERT_GT(died, 0) << r.output;
  ASSERT_GT(exited, 0) << r.output;
  const double bound = kCommTimeoutS + kMpiGraceS + load_slack_s();
  std::printf(
      "mpirun --enable-recovery, rank 1 killed at %s: survivor's error %.3f s later, "
      "its exit %.3f s later (timeout %.1f s + grace %.1f s; bound %.1f s), mpirun's "
      "%.3f s later (status %d); error: %s\n",
      c.point, failed - died, exited - died, kCommTimeoutS, kMpiGraceS, bound,
      r.end_realtime_s - died, r.status, survivor.c_str());
  EXPECT_LT(exited - died, bound) << r.output;
}

INSTANTIATE_TEST_SUITE_P(Points, MpiRankKilled,
                         ::testing::Values(KillCase{"forward", "all_gather("},
                                           KillCase{"backward", "reduce_scatter("},
                                           KillCase{"step-norm", "all_gather(4 x f32)"},
                                           KillCase{"step-params", "all_gather("}),
                         [](const auto& info) {
                           std::string n = info.param.point;
                           for (char& ch : n) ch = ch == '-' ? '_' : ch;
                           return n;
                         });

}  // namespace
}  // namespace zero
