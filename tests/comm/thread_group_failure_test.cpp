// How ThreadGroup::run reports a group that fails: its line about ranks that did not return
// leads with the cause (the first failure) and then its consequences, named for the first
// kRanksNamed ranks and counted for the rest, so it stays short at any size; a size the machine
// cannot run is refused in one line before any thread starts.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>

#include "common/expect_error.hpp"
#include "zero/comm/comm.hpp"

namespace zero::test {
namespace {

constexpr int kRanks = 24;
constexpr int kCause = 3;         // throws first
constexpr int kConsequences = 8;  // ranks 0..7 but the cause wait in a barrier and fail with it
// The others are stuck in their own code: they never see the failure and do not return.
constexpr int kStuck = kRanks - kConsequences;

void fail_one_rank_and_leave_the_others_stuck() {
  // run() starts no rank once the group has failed: the cause waits until every rank runs.
  std::atomic<int> started{0};
  ThreadGroup::run(
      kRanks,
      [&](Communicator& c) {
        ++started;
        if (c.rank() == kCause) {
          while (started.load() < kRanks) std::this_thread::sleep_for(std::chrono::milliseconds(1));
          throw std::runtime_error("the cause: rank 3 broke");
        }
        if (c.rank() < kConsequences) {
          c.barrier();  // woken by rank 3's failure: kRemoteFailure, a consequence
          return;
        }
        for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
      },
      600.0);
}

// The launcher's line in the child's stderr: the cause first, then the ranks that did not
// return, the first kRanksNamed by name, the rest counted; short.
class StuckLine : public ::testing::MatcherInterface<const std::string&> {
 public:
  bool MatchAndExplain(const std::string& err, ::testing::MatchResultListener* why) const override {
    const std::string lead =
        "zero: ThreadGroup::run: the group failed: rank 3 failed: the cause: "
        "rank 3 broke; then " +
        std::to_string(kStuck) + " of " + std::to_string(kRanks) + " ranks did not return within ";
    const std::size_t at = err.find(lead);
    if (at == std::string::npos) {
      *why << "no line leading with the cause: '" << lead << "'";
      return false;
    }
    const std::string line = err.substr(at, err.find('\n', at) - at);
    const int first_stuck = kConsequences, last_named = kConsequences + kRanksNamed - 1;
    for (const std::string& want :
         {"rank " + std::to_string(first_stuck) + " did not return (it has issued no collective)",
          "rank " + std::to_string(last_named) + " did not return (",
          "; and " + std::to_string(kStuck - kRanksNamed) + " more; ",
          std::string("the process ends with status ") + std::to_string(kStuckRankExitCode)}) {
      if (line.find(want) == std::string::npos) {
        *why << "the line lacks '" << want << "'";
        return false;
      }
    }
    if (line.find("rank " + std::to_string(last_named + 1) + " did") != std::string::npos) {
      *why << "the line names more than " << kRanksNamed << " ranks";
      return false;
    }
    if (line.size() > 1024) {
      *why << "the line is " << line.size() << " bytes";
      return false;
    }
    *why << "the line is " << line.size() << " bytes";
    return true;
  }
  void DescribeTo(std::ostream* os) const override {
    *os << "a line that leads with rank 3's failure, then names " << kRanksNamed << " of the "
        << kStuck << " ranks that did not return and counts the rest";
  }
};

TEST(ThreadGroupFailure, TheLineLeadsWithTheCauseThenItsConsequencesBounded) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(fail_one_rank_and_leave_the_others_stuck(),
              ::testing::ExitedWithCode(kStuckRankExitCode), ::testing::MakeMatcher(new StuckLine));
}

// When every rank returns, run() rethrows the cause, not a consequence.
TEST(ThreadGroupFailure, RunRethrowsTheCauseNotAConsequence) {
  testing::expect_error(
      [] {
        ThreadGroup::run(
            6,
            [](Communicator& c) {
              if (c.rank() == 4) ZERO_THROW(kIO, "the cause: rank 4's disk");
              c.barrier();
            },
            600.0);
      },
      ErrorCode::kIO, "the cause: rank 4's disk");
}

std::size_t threads_of_this_process() {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

TEST(ThreadGroupFailure, ASizeTheMachineCannotRunIsRefusedBeforeAnyThreadStarts) {
  std::string why;
  const int most = ThreadGroup::max_size(&why);
  std::printf("this process can start at most %d in-process ranks (%s)\n", most, why.c_str());
  ASSERT_GE(most, 8) << why;
  // No more than threads-max allows (an independent bound on the figure).
  std::size_t threads_max = 0;
  std::ifstream("/proc/sys/kernel/threads-max") >> threads_max;
  if (threads_max > 0) {
    EXPECT_LE(static_cast<std::size_t>(most), threads_max / kThreadsPerRank);
  }
  std::atomic<int> ran{0};
  const std::size_t before = threads_of_this_process();
  testing::expect_error([&] { ThreadGroup::run(1 << 30, [&](Communicator&) { ++ran; }); },
                        ErrorCode::kInvalidArgument,
                        "ThreadGroup::run: size 1073741824: this process can start at most ");
  EXPECT_EQ(ran.load(), 0) << "a rank ran";
  EXPECT_EQ(threads_of_this_process(), before) << "a thread was started";
  // As a program names its flag; far past the limit, which moves as other processes run.
  const int impossible = 2 * most + 1000;
  testing::expect_error([&] { ThreadGroup::check_size(impossible, "--ranks"); },
                        ErrorCode::kInvalidArgument,
                        "--ranks " + std::to_string(impossible) + ": this process can start");
  EXPECT_NO_THROW(ThreadGroup::check_size(2, "--ranks"));
}

}  // namespace
}  // namespace zero::test
