// The flight recorder's one-screen answer (zero::flight_report, what zero-doctor prints) for a
// 3-rank mpirun job (tests/fault/flight_rank.cpp) whose rank 1 meets a fault before seq 14, a
// reduce-scatter of unit 1:
//   stopped  rank 1 stops itself (SIGSTOP). Once ranks 0 and 2 have timed out and written their
//            records, the answer names rank 1 as the rank without a record and ranks 0, 2 as
//            waiting at seq 14; then the test sends rank 1 SIGUSR1 and SIGCONT, and with its
//            record the answer names where rank 1 stopped (after seq 13, phase backward unit 1).
//   killed   rank 1 dies (SIGKILL) under mpirun --enable-recovery (the job goes on without it):
//            ranks 0 and 2 time out and write; the answer names rank 1 and where they wait.
//            Under plain mpirun, which ends the others with SIGTERM, they write on the signal,
//            long before their timeout.
// Event-driven: the test waits for the records' files (up to a watchdog far above the comm
// timeout), never for a time.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/temp_dir.hpp"
#include "fault/subprocess.hpp"
#include "zero/comm/comm.hpp"

namespace zero {
namespace {

namespace fs = std::filesystem;
using testing::run_subprocess;

constexpr double kCommTimeoutS = 5.0;
constexpr double kWatchdogS = 240.0;  // a loaded machine: far above the comm timeout
constexpr const char* kWaitAt = "ranks 0, 2 wait at seq 14 reduce_scatter(64 x f32, sum) unit 1";

// With --enable-recovery the job goes on without a dead rank; without it mpirun ends the others:
// SIGTERM, then SIGKILL, each odls_base_sigkill_timeout seconds (default 1; 3 here: a busy
// machine's ranks get time to write) after the one before.
std::vector<std::string> mpirun(const fs::path& dir, const char* action, bool recovery = true,
                                double comm_timeout_s = kCommTimeoutS) {
  std::vector<std::string> cmd = {ZERO_MPIEXEC, "--allow-run-as-root", "--oversubscribe"};
  if (recovery) {
    cmd.push_back("--enable-recovery");
  } else {
    cmd.insert(cmd.end(), {"--mca", "odls_base_sigkill_timeout", "3"});
  }
  cmd.insert(cmd.end(),
             {"-np", "3", ZERO_FLIGHT_RANK, action, std::to_string(comm_timeout_s), dir.string()});
  return cmd;
}

// Waits until every path exists (or the watchdog): true if they all do.
bool wait_for(const std::vector<fs::path>& paths) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(kWatchdogS);
  for (;;) {
    bool all = true;
    for (const auto& p : paths) all = all && fs::exists(p);
    if (all) return true;
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// After a job whose rank 1 died: the merged report of ranks 0 and 2 (printed), or empty with a
// failure added when the watchdog fired or their records are missing.
std::string survivors_report(const testing::SubprocessResult& job, const fs::path& dir) {
  if (job.watchdog_fired) {
    ADD_FAILURE() << "the job outlived the watchdog (" << kWatchdogS << " s):\n" << job.output;
    return {};
  }
  if (!fs::exists(dir / "flight_rank0.json") || !fs::exists(dir / "flight_rank2.json")) {
    ADD_FAILURE() << "ranks 0 and 2 did not both write a record:\n" << job.output;
    return {};
  }
  std::string report = flight_report(dir.string());
  std::printf("%s", report.c_str());
  return report;
}

void expect_has(const std::string& report, const std::string& text) {
  EXPECT_NE(std::string::npos, report.find(text)) << "missing: " << text << "\nin:\n" << report;
}

TEST(MpiFlight, StoppedRankIsNamedAndWhereEachRankIs) {
  const testing::TempDir tmp;  // the records the ranks write
  const fs::path dir = tmp.path();
  testing::SubprocessResult job;
  std::thread runner([&] { job = run_subprocess(mpirun(dir, "stop"), kWatchdogS); });
  const bool written =
      wait_for({dir / "flight_rank0.json", dir / "flight_rank2.json", dir / "stopped.pid"});
  std::string before, after;
  pid_t stopped = 0;
  if (written) {
    before = flight_report(dir.string());
    std::ifstream(dir / "stopped.pid") >> stopped;
    // Continued, rank 1 stays stuck where it stopped; SIGUSR1 makes it write its record.
    if (stopped > 0) {
      ::kill(stopped, SIGUSR1);
      ::kill(stopped, SIGCONT);
      if (wait_for({dir / "flight_rank1.json"})) after = flight_report(dir.string());
      ::kill(stopped, SIGKILL);
    }
  }
  runner.join();
  ASSERT_TRUE(written) << job.output;
  ASSERT_GT(stopped, 0);
  std::printf("--- ranks 0 and 2 written:\n%s--- and rank 1 after SIGUSR1:\n%s", before.c_str(),
              after.c_str());
  expect_has(before, "rank 1: no record");
  expect_has(before, "=> rank 1 has no record");
  expect_has(before, kWaitAt);
  expect_has(after,
             "=> rank 1 stopped after seq 13 reduce_scatter(64 x f32, sum) unit 2, phase backward "
             "unit 1 (seq 14 never issued)");
  expect_has(after, kWaitAt);
}

TEST(MpiFlight, KilledRankIsNamedAndWhereTheOthersWait) {
  const testing::TempDir tmp;  // the records the ranks write
  const fs::path dir = tmp.path();
  const std::string report = survivors_report(run_subprocess(mpirun(dir, "kill"), kWatchdogS), dir);
  ASSERT_FALSE(report.empty());
  expect_has(report, "rank 1: no record");
  expect_has(report, "=> rank 1 has no record");
  expect_has(report, kWaitAt);
  expect_has(report, "[failure: timeout: rank 0 timed out");
}

TEST(MpiFlight, KilledRankUnderPlainMpirunTheOthersWriteOnSigterm) {
  // A comm timeout past the watchdog: the records can only come from mpirun's SIGTERM.
  const testing::TempDir tmp;  // the records the ranks write
  const fs::path dir = tmp.path();
  const std::string report = survivors_report(
      run_subprocess(mpirun(dir, "kill", false, 10 * kWatchdogS), kWatchdogS), dir);
  ASSERT_FALSE(report.empty());
  expect_has(report, "rank 0: at seq 14 reduce_scatter(64 x f32, sum) unit 1");
  expect_has(report, "[signal SIGTERM]");
  expect_has(report, "=> rank 1 has no record");
  expect_has(report, kWaitAt);
}

}  // namespace
}  // namespace zero
