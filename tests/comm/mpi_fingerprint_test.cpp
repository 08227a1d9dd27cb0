// comm_debug detail over MPI (ctest runs it at 2, 3 and 4 ranks): collectives still match the
// reference with the fingerprint check on, and ranks that disagree — one skips a unit's gather,
// one reduces another count, one has another model — fail at the collective where they diverged,
// every rank with the error naming both calls and their units, long before the timeout (the time
// is printed, not asserted).
#include <gtest/gtest.h>

#include <cstdio>

#include "comm/collective_checks.hpp"
#include "comm/divergence_checks.hpp"
#include "common/mpi_world.hpp"
#include "zero/comm/comm.hpp"

namespace zero::test {
namespace {

constexpr double kTimeoutS = 120;

// A communicator of its own for each case: a disagreement leaves it failed.
std::unique_ptr<Communicator> detail_comm() {
  Communicator& w = testing::mpi_world();
  auto c = w.split(0, w.rank());
  c->set_debug(CommDebug::kDetail);
  c->set_timeout_s(kTimeoutS);
  return c;
}

TEST(MpiFingerprint, CollectivesMatchTheReferenceWithTheCheckOn) {
  auto c = detail_comm();
  run_matrix(*c, DType::kBF16, Exactness::kTolerance, 9100);
  run_async_in_order(*c, Exactness::kTolerance);
}

TEST(MpiFingerprint, SplitKeepsTheDebugLevel) {
  auto c = detail_comm();
  auto child = c->split(0, 0);
  EXPECT_EQ(CommDebug::kDetail, child->debug());
}

class MpiDivergence : public ::testing::TestWithParam<Divergence> {};

TEST_P(MpiDivergence, EveryRankFailsAtTheCollectiveNamingBothCallsAndUnits) {
  const Divergence d = GetParam();
  auto c = detail_comm();
  const DivergenceSeen seen = run_divergence(*c, d);
  ASSERT_TRUE(seen.failed) << "rank " << c->rank() << ": no error";
  EXPECT_EQ(ErrorCode::kInvalidArgument, seen.code) << seen.message;
  for (const std::string& name : divergence_names(d, c->size())) {
    EXPECT_NE(std::string::npos, seen.message.find(name)) << seen.message;
  }
  std::printf("%s at %d MPI ranks: rank %d failed %.3f s after the start (timeout %.0f s): %s\n",
              to_string(d), c->size(), c->rank(), seen.seconds, kTimeoutS, seen.message.c_str());
}

INSTANTIATE_TEST_SUITE_P(Cases, MpiDivergence,
                         ::testing::Values(Divergence::kSkipsAGather, Divergence::kOtherCount,
                                           Divergence::kOtherModel, Divergence::kPaddedModel,
                                           Divergence::kOtherShapes, Divergence::kOtherFrozen),
                         [](const auto& info) { return std::string(to_string(info.param)); });

}  // namespace
}  // namespace zero::test
