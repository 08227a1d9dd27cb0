// The MPI backend under mpirun (ctest runs it at 2, 3 and 4 ranks): every collective x dtype x
// op against the float64 reference, 64 MiB buffers, async ordering, a late rank timing out,
// split, counters, launch detection.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "comm/collective_checks.hpp"
#include "comm/quantized_checks.hpp"
#include "common/load_slack.hpp"
#include "common/mpi_world.hpp"
#include "zero/comm/comm.hpp"

namespace zero::test {
namespace {

Communicator& world() { return testing::mpi_world(); }

TEST(Mpi, LaunchIsDetected) {
  Communicator& c = world();
  EXPECT_EQ("mpi", c.backend());
  const LaunchInfo info = detect_launch();
  if (info.source != "none") {
    EXPECT_TRUE(info.mpi_launcher);
    EXPECT_EQ(c.rank(), info.rank);
    EXPECT_EQ(c.size(), info.size);
    // auto picks MPI under mpirun.
    EXPECT_EQ("mpi", make_communicator()->backend());
  }
}

class MpiMatrix : public ::testing::TestWithParam<DType> {};

TEST_P(MpiMatrix, EveryCollectiveMatchesReference) {
  run_matrix(world(), GetParam(), Exactness::kTolerance, 7000 + static_cast<int>(GetParam()));
}

TEST(Mpi, QuantizedCollectivesStayWithinTheBound) {
  CpuDeviceOps dev;
  run_quantized_matrix(world(), dev, 4400);
}

INSTANTIATE_TEST_SUITE_P(DTypes, MpiMatrix,
                         ::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                         [](const auto& info) { return std::string(to_string(info.param)); });

TEST(Mpi, SixtyFourMebibyteBuffers) {
  Communicator& c = world();
  constexpr std::size_t kBytes = std::size_t{64} << 20;
  const std::size_t n = static_cast<std::size_t>(c.size());
  EXPECT_EQ("", check_all_reduce(c, kBytes / 4 + 1, DType::kF32, ReduceOp::kSum, true, 81,
                                 Exactness::kTolerance));
  EXPECT_EQ("", check_reduce_scatter(c, kBytes / 2 / n + 1, DType::kBF16, ReduceOp::kSum, false, 82,
                                     Exactness::kTolerance));
  EXPECT_EQ("", check_all_gather(c, kBytes / 4 / n + 1, DType::kF32, true, 83));
}

TEST(Mpi, ManyAsyncCollectivesCompleteInIssueOrder) {
  run_async_in_order(world(), Exactness::kTolerance);
}

// Small blocking collectives run inline (nonblocking MPI polled to the deadline), large ones on
// the progress thread (blocking MPI): both must time out.
class MpiLateRank : public ::testing::TestWithParam<std::size_t> {};

TEST_P(MpiLateRank, MakesTheOthersTimeOutWithoutHanging) {
  Communicator& w = world();
  if (w.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  // A communicator of its own: the timeout breaks it.
  auto c = w.split(0, w.rank());
  ASSERT_NE(nullptr, c);
  c->set_timeout_s(1.0);
  const std::size_t count = GetParam();
  std::vector<float> buf(count, 1.0f);
  const std::string name = detail::cat("all_reduce(", count, " x f32, sum)");
  if (c->rank() == 0) {
    const auto start = std::chrono::steady_clock::now();
    try {
      c->all_reduce(buf.data(), buf.data(), buf.size(), DType::kF32, ReduceOp::kSum);
      ADD_FAILURE() << "no timeout";
    } catch (const Error& e) {
      EXPECT_EQ(ErrorCode::kTimeout, e.code()) << e.what();
      EXPECT_NE(std::string::npos, e.message().find(name)) << e.what();
      EXPECT_NE(std::string::npos, e.message().find("on ranks {0,1")) << e.what();
    }
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_GT(waited, 0.9);
    EXPECT_LT(waited, 1.0 + testing::load_slack_s());
    // The communicator is broken now: later collectives fail at once.
    try {
      c->barrier();
      ADD_FAILURE() << "barrier on a broken communicator succeeded";
    } catch (const Error& e) {
      EXPECT_EQ(ErrorCode::kRemoteFailure, e.code()) << e.what();
    }
    w.barrier();  // the others come now, after the timeout (an event, not a sleep)
  } else {
    // Late, but it comes: rank 0's progress thread, still inside MPI, completes with us.
    w.barrier();
    c->all_reduce(buf.data(), buf.data(), buf.size(), DType::kF32, ReduceOp::kSum);
  }
  c.reset();
  w.barrier();
}

INSTANTIATE_TEST_SUITE_P(InlineAndProgressThread, MpiLateRank,
                         ::testing::Values(std::size_t{1031}, std::size_t{100003}));

TEST(Mpi, SplitFormsOrderedSubGroups) {
  Communicator& w = world();
  const int color = w.rank() % 2;
  auto sub = w.split(color, -w.rank());
  ASSERT_NE(nullptr, sub);
  std::vector<int> expect;
  for (int r = w.size() - 1; r >= 0; --r) {
    if (r % 2 == color) expect.push_back(r);
  }
  EXPECT_EQ(expect, sub->world_ranks());
  EXPECT_EQ(w.rank(), expect[sub->rank()]);
  float v = static_cast<float>(w.rank());
  sub->all_reduce(&v, &v, 1, DType::kF32, ReduceOp::kSum);
  float want = 0;
  for (int r : expect) want += static_cast<float>(r);
  EXPECT_EQ(want, v);
  EXPECT_EQ("", check_reduce_scatter(*sub, 251, DType::kF16, ReduceOp::kAvg, true, 9,
                                     Exactness::kTolerance));
  auto none = w.split(Communicator::kNoColor, 0);
  EXPECT_EQ(nullptr, none);
}

TEST(Mpi, ByteCountersFollowTheRingVolumes) {
  Communicator& w = world();
  auto c = w.split(0, 0);
  std::vector<float> buf(1000, 1.0f);
  c->all_reduce(buf.data(), buf.data(), 1000, DType::kF32, ReduceOp::kSum);
  const std::uint64_t n = static_cast<std::uint64_t>(c->size());
  EXPECT_EQ(2 * (n - 1) * 4000 / n, c->stats()[Collective::kAllReduce].bytes_sent);
  EXPECT_EQ(1u, c->stats()[Collective::kAllReduce].calls);
}

}  // namespace
}  // namespace zero::test

namespace zero::test {
namespace {

// Regression: a small blocking collective ran as nonblocking MPI inline on a rank whose progress
// thread was idle, but as blocking MPI on the progress thread of a rank still busy with an
// earlier async collective; MPI does not match the two and both ranks hung (the engine hit it
// in stage 3). Now the size alone picks the MPI call.
TEST(Mpi, SmallBlockingCollectiveMatchesWhetherRunInlineOrQueued) {
  Communicator& c = world();
  const double saved = c.timeout_s();
  c.set_timeout_s(20);
  std::vector<float> big(std::size_t{1} << 20, 1.0f), big_out(big.size());
  for (int rep = 0; rep < 20; ++rep) {
    CommHandle h =
        c.all_reduce_async(big.data(), big_out.data(), big.size(), DType::kF32, ReduceOp::kSum);
    if (c.rank() % 2 == 1) h.wait();  // odd ranks: progress thread idle -> the inline path
    float one = 1.0f, sum = 0.0f;
    c.all_reduce(&one, &sum, 1, DType::kF32, ReduceOp::kSum);  // even ranks: queued behind
    h.wait();
    ASSERT_EQ(sum, static_cast<float>(c.size())) << "rep " << rep;
    ASSERT_EQ(big_out[12345], static_cast<float>(c.size()));
  }
  c.set_timeout_s(saved);
}

// Collective timestamps on the MPI backend: inline (small blocking), progress thread (large
// async, small async), in issue order. Rank 0 then issues a large all_reduce that rank 1 joins
// late: the event must have finished well after issue (not stamped at issue) and be recorded
// before rank 0 waits (not stamped at wait).
TEST(Mpi, EventsAreTimedWhereTheCollectiveRuns) {
  auto c = world().split(0, world().rank());  // a fresh communicator: seq starts at 0
  ASSERT_NE(nullptr, c);
  c->set_event_capacity(8);
  float one = 1.0f, sum = 0.0f;
  std::vector<float> big(std::size_t{1} << 20, 1.0f);
  c->all_reduce(&one, &sum, 1, DType::kF32, ReduceOp::kSum);
  CommHandle h =
      c->all_reduce_async(big.data(), big.data(), big.size(), DType::kF32, ReduceOp::kSum);
  CommHandle b = c->barrier_async();
  h.wait();
  b.wait();
  std::vector<CollectiveEvent> ev = c->events();
  ASSERT_EQ(3u, ev.size());
  const Collective kinds[] = {Collective::kAllReduce, Collective::kAllReduce, Collective::kBarrier};
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(kinds[k], ev[k].kind) << k;
    EXPECT_EQ(static_cast<std::uint64_t>(k), ev[k].seq) << k;
    EXPECT_LE(ev[k].issued, ev[k].started) << k;
    EXPECT_LE(ev[k].started, ev[k].finished) << k;
    if (k > 0) {
      EXPECT_LE(ev[k - 1].finished, ev[k].started) << k;
    }
  }
  EXPECT_EQ(big.size(), ev[1].count);
  if (c->size() < 2) return;
  constexpr auto kPeerLate = std::chrono::milliseconds(200);
  c->set_event_capacity(1);
  if (c->rank() == 0) {
    const std::uint64_t seq = c->issued();
    CommHandle late =
        c->all_reduce_async(big.data(), big.data(), big.size(), DType::kF32, ReduceOp::kSum);
    // The worker records the event when the collective completes, before anyone waits on it:
    // wait for the record (however long a busy machine takes; a generous guard against a hang),
    // then call wait(). An event stamped at wait() would never appear here.
    const auto guard = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    for (;;) {
      const std::vector<CollectiveEvent> now = c->events();
      if (!now.empty() && now.back().seq == seq) break;
      ASSERT_LT(std::chrono::steady_clock::now(), guard)
          << "the all-reduce's event was not recorded before wait(): stamped at wait()?";
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    const auto wait_called = std::chrono::steady_clock::now();
    late.wait();
    ev = c->events();
    ASSERT_EQ(1u, ev.size());
    EXPECT_GE(ev[0].finished - ev[0].issued, kPeerLate / 2) << "stamped at issue?";
    EXPECT_LT(ev[0].finished, wait_called) << "stamped at wait()?";
  } else {
    if (c->rank() == 1) std::this_thread::sleep_for(kPeerLate);
    c->all_reduce(big.data(), big.data(), big.size(), DType::kF32, ReduceOp::kSum);
  }
}

}  // namespace
}  // namespace zero::test
