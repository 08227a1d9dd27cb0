// The in-process backend: every collective x dtype x op against the float64 (here: exact
// fixed-order fp32) reference at world sizes 1, 2, 3, 4, 8; 64 MiB buffers; bitwise
// determinism; async ordering; failure, timeout and departure propagation; split; counters;
// collective timestamps.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "comm/collective_checks.hpp"
#include "common/expect_error.hpp"
#include "common/load_slack.hpp"
#include "zero/comm/comm.hpp"

namespace zero::test {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// ---------------------------------------------------------------------------------------------
// every collective against the reference

class ThreadMatrix : public ::testing::TestWithParam<std::tuple<int, DType>> {};

TEST_P(ThreadMatrix, EveryCollectiveMatchesReference) {
  const auto [n, t] = GetParam();
  ThreadGroup::run(
      n, [&](Communicator& c) { run_matrix(c, t, Exactness::kFixedOrder, 1000 * n); }, 60.0);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ThreadMatrix,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 8),
                                            ::testing::Values(DType::kF32, DType::kF16,
                                                              DType::kBF16)),
                         [](const auto& info) {
                           return detail::cat("n", std::get<0>(info.param), "_",
                                              to_string(std::get<1>(info.param)));
                         });

// Buffers of 64 MiB and more (one element past a power of two, so shards are uneven).
TEST(ThreadGroup, SixtyFourMebibyteBuffers) {
  constexpr std::size_t kBytes = std::size_t{64} << 20;
  ThreadGroup::run(
      3,
      [&](Communicator& c) {
        const std::size_t n = static_cast<std::size_t>(c.size());
        EXPECT_EQ("", check_all_reduce(c, kBytes / 4 + 1, DType::kF32, ReduceOp::kSum, false, 71,
                                       Exactness::kFixedOrder));
        EXPECT_EQ("", check_reduce_scatter(c, kBytes / 2 / n + 1, DType::kBF16, ReduceOp::kAvg,
                                           true, 72, Exactness::kFixedOrder));
        EXPECT_EQ("", check_all_gather(c, kBytes / 2 / n + 1, DType::kF16, false, 73));
        EXPECT_EQ("", check_broadcast(c, kBytes / 4 + 1, DType::kF32, 1, false, 74));
      },
      120.0);
}

// ---------------------------------------------------------------------------------------------
// determinism: all_reduce == reduce_scatter + all_gather, bitwise, and repeatable

TEST(ThreadGroup, AllReduceEqualsReduceScatterThenAllGatherBitwise) {
  for (int n : {2, 3, 4, 8}) {
    for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
        ThreadGroup::run(n, [&](Communicator& c) {
          // Wide-range inputs, so the summation order would show in the last bits.
          const std::size_t shard = 4099;
          const std::size_t total = shard * n;
          const std::size_t es = dtype_size(t);
          std::vector<char> in(total * es);
          for (std::size_t i = 0; i < total; ++i) {
            const float v = input_value(99, c.rank(), i, DType::kF32);
            store(in.data(), i, t, v * std::ldexp(1.0f, static_cast<int>(i % 13) - 6));
          }
          std::vector<char> ar(total * es, 0x7F);
          std::vector<char> ar2(total * es, 0x7E);
          std::vector<char> rs(shard * es, 0x7D);
          std::vector<char> ag(total * es, 0x7C);
          c.all_reduce(in.data(), ar.data(), total, t, op);
          c.all_reduce(in.data(), ar2.data(), total, t, op);
          c.reduce_scatter(in.data(), rs.data(), shard, t, op);
          c.all_gather(rs.data(), ag.data(), shard, t);
          EXPECT_EQ(0, std::memcmp(ar.data(), ag.data(), ar.size()))
              << "n " << n << " " << to_string(t) << " " << to_string(op);
          EXPECT_EQ(0, std::memcmp(ar.data(), ar2.data(), ar.size()));
        });
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// asynchronous collectives: many in flight, completing in issue order

TEST(ThreadGroup, ManyAsyncCollectivesCompleteInIssueOrder) {
  ThreadGroup::run(4, [](Communicator& c) { run_async_in_order(c, Exactness::kFixedOrder); });
}

TEST(ThreadGroup, WaitingOnTheLastHandleCompletesAllEarlierOnes) {
  ThreadGroup::run(3, [](Communicator& c) {
    std::vector<float> a(100000, 1.0f), b(100000, 2.0f);
    std::vector<CommHandle> h;
    for (int k = 0; k < 10; ++k) {
      h.push_back(c.all_reduce_async(a.data(), a.data(), a.size(), DType::kF32, ReduceOp::kAvg));
    }
    h.push_back(c.all_reduce_async(b.data(), b.data(), b.size(), DType::kF32, ReduceOp::kSum));
    h.back().wait();
    for (int k = 0; k < 10; ++k) EXPECT_TRUE(h[k].test()) << k;
    EXPECT_EQ(a[777], 1.0f);
    EXPECT_EQ(b[777], 6.0f);
  });
}

TEST(ThreadGroup, DroppedHandleStillCompletes) {
  ThreadGroup::run(2, [](Communicator& c) {
    std::vector<float> a(1000, 1.5f);
    {
      CommHandle h = c.all_reduce_async(a.data(), a.data(), a.size(), DType::kF32, ReduceOp::kSum);
    }
    EXPECT_EQ(a[999], 3.0f);
    CommHandle h = c.barrier_async();
    h = c.barrier_async();  // the first barrier is waited for by the assignment
    h.wait();
    EXPECT_FALSE(h.valid());
  });
}

// ---------------------------------------------------------------------------------------------
// failures: a throwing rank, a timeout, a rank that leaves, a mismatch

TEST(ThreadGroup, RankThatThrowsMakesOthersFailPromptly) {
  std::mutex mu;
  std::vector<std::string> messages;
  std::vector<ErrorCode> codes;
  std::vector<double> elapsed;
  const auto start = Clock::now();
  try {
    ThreadGroup::run(
        4,
        [&](Communicator& c) {
          std::vector<float> buf(4099, 1.0f);
          c.all_reduce(buf.data(), buf.data(), buf.size(), DType::kF32, ReduceOp::kSum);
          if (c.rank() == 2) throw std::runtime_error("boom on rank 2");
          // Others go on: one pending async collective plus a blocking one.
          // Either may be the one that throws: issuing on a failed group fails at once.
          std::vector<float> gathered(4 * 1024);
          try {
            CommHandle pending = c.all_gather_async(buf.data(), gathered.data(), 1024, DType::kF32);
            c.all_reduce(buf.data(), buf.data(), 4099, DType::kBF16, ReduceOp::kSum);
            pending.wait();
          } catch (const Error& e) {
            std::lock_guard lock(mu);
            messages.push_back(e.message());
            codes.push_back(e.code());
            elapsed.push_back(seconds_since(start));
            throw;
          }
        },
        testing::timeout_above_slack_s());  // a failure that waited for it would not be prompt
    ADD_FAILURE() << "run() did not rethrow";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ("boom on rank 2", e.what()) << "run() must rethrow the root cause";
  }
  ASSERT_EQ(3u, messages.size());
  for (std::size_t k = 0; k < messages.size(); ++k) {
    EXPECT_EQ(ErrorCode::kRemoteFailure, codes[k]) << messages[k];
    EXPECT_NE(std::string::npos, messages[k].find("boom on rank 2")) << messages[k];
    EXPECT_NE(std::string::npos, messages[k].find("rank 2 failed")) << messages[k];
    EXPECT_NE(std::string::npos, messages[k].find("ranks {0,1,2,3}")) << messages[k];
    EXPECT_LT(elapsed[k], testing::load_slack_s()) << "failure was not prompt: " << messages[k];
  }
}

// Rank 1 comes to the collective only after the others have timed out (an event, not a sleep
// that a loaded machine could outlast), and fails at once.
TEST(ThreadGroup, LateRankMakesOthersTimeOutNamingIt) {
  std::mutex mu;
  std::condition_variable others_failed;
  std::vector<std::pair<ErrorCode, std::string>> errors;
  const double timeout_s = 1.0;
  const auto start = Clock::now();
  try {
    ThreadGroup::run(
        3,
        [&](Communicator& c) {
          if (c.rank() == 1) {
            std::unique_lock lock(mu);
            others_failed.wait_for(lock, std::chrono::seconds(120),
                                   [&] { return errors.size() == 2; });
          }
          try {
            std::vector<std::uint16_t> buf(31, 0x3c00);
            c.all_reduce(buf.data(), buf.data(), 31, DType::kF16, ReduceOp::kMax);
          } catch (const Error& e) {
            std::lock_guard lock(mu);
            errors.emplace_back(e.code(), e.message());
            others_failed.notify_all();
            throw;
          }
        },
        timeout_s);
    ADD_FAILURE() << "run() did not rethrow";
  } catch (const Error& e) {
    EXPECT_EQ(ErrorCode::kTimeout, e.code()) << e.what();
    EXPECT_NE(std::string::npos, e.message().find("all_reduce(31 x f16, max)")) << e.what();
    EXPECT_NE(std::string::npos, e.message().find("{1}"))
        << "must name the late rank: " << e.what();
  }
  EXPECT_LT(seconds_since(start), timeout_s + testing::load_slack_s());
  ASSERT_EQ(3u, errors.size());
  for (auto& [code, msg] : errors) {
    EXPECT_TRUE(code == ErrorCode::kTimeout || code == ErrorCode::kRemoteFailure) << msg;
  }
}

TEST(ThreadGroup, RankThatLeavesMakesOthersFailWithoutWaitingForTheTimeout) {
  const auto start = Clock::now();
  int failures = 0;
  std::mutex mu;
  EXPECT_THROW(ThreadGroup::run(
                   3,
                   [&](Communicator& c) {
                     c.barrier();
                     if (c.rank() == 0) return;  // leaves: no second barrier
                     try {
                       c.barrier();
                     } catch (const Error& e) {
                       EXPECT_EQ(ErrorCode::kRemoteFailure, e.code());
                       EXPECT_NE(std::string::npos, e.message().find("rank 0 left")) << e.what();
                       std::lock_guard lock(mu);
                       ++failures;
                       throw;
                     }
                   },
                   60.0),
               Error);
  EXPECT_EQ(2, failures);
  EXPECT_LT(seconds_since(start), testing::load_slack_s());  // the timeout is 60 s
}

TEST(ThreadGroup, RanksDisagreeingOnTheCollectiveIsAnError) {
  std::atomic<int> errors{0};
  EXPECT_THROW(ThreadGroup::run(2,
                                [&](Communicator& c) {
                                  std::vector<float> buf(20, 1.0f);
                                  try {
                                    c.all_reduce(buf.data(), buf.data(), 10 + c.rank(), DType::kF32,
                                                 ReduceOp::kSum);
                                  } catch (const Error& e) {
                                    EXPECT_EQ(ErrorCode::kInvalidArgument, e.code());
                                    EXPECT_NE(std::string::npos, e.message().find("disagree"));
                                    ++errors;
                                    throw;
                                  }
                                }),
               Error);
  EXPECT_EQ(2, errors.load());
}

TEST(ThreadGroup, CommunicatorIsBrokenAfterAFailure) {
  ThreadGroup group(2, 0.3);
  auto c0 = group.communicator(0);
  auto c1 = group.communicator(1);
  EXPECT_THROW(c0->barrier(), Error);  // rank 1 never comes: timeout
  try {
    c1->barrier();
    ADD_FAILURE() << "barrier on a failed group succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(ErrorCode::kRemoteFailure, e.code());
    EXPECT_NE(std::string::npos, e.message().find("timed out")) << e.what();
  }
}

TEST(ThreadGroup, TimeoutIsTheGivenSeconds) {
  ThreadGroup group(2, 0.25);
  auto c0 = group.communicator(0);
  EXPECT_EQ(0.25, c0->timeout_s());
  const auto start = Clock::now();
  CommHandle h = c0->all_gather_async(nullptr, nullptr, 0, DType::kF16);  // rank 1 never joins
  try {
    h.wait();
    ADD_FAILURE() << "no timeout";
  } catch (const Error& e) {
    EXPECT_EQ(ErrorCode::kTimeout, e.code()) << e.what();
    EXPECT_NE(std::string::npos, e.message().find("all_gather(0 x f16)")) << e.what();
    EXPECT_NE(std::string::npos, e.message().find("{1}")) << e.what();
  }
  // Not the default timeout (kDefaultCommTimeoutS, far above the slack).
  EXPECT_LT(seconds_since(start), 0.25 + testing::load_slack_s());
  EXPECT_FALSE(h.valid());
}

TEST(ThreadGroup, HandleMayOutliveItsCommunicator) {
  ThreadGroup group(1);
  auto c = group.communicator(0);
  std::vector<float> a(5000, 2.0f);
  CommHandle h = c->all_reduce_async(a.data(), a.data(), a.size(), DType::kF32, ReduceOp::kMax);
  c.reset();  // drains the queue
  EXPECT_TRUE(h.test());
  h.wait();
  EXPECT_EQ(2.0f, a[4999]);
}

// ---------------------------------------------------------------------------------------------
// bad arguments

TEST(ThreadGroup, BadArgumentsAreInvalidArgumentErrors) {
  EXPECT_THROW(ThreadGroup(0), Error);
  EXPECT_THROW(ThreadGroup(2, 0.0), Error);
  ThreadGroup group(1);
  auto c = group.communicator(0);
  EXPECT_THROW(group.communicator(0), Error);
  EXPECT_THROW(group.communicator(1), Error);
  std::vector<float> buf(64);
  auto code_of = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return e.code();
    }
    return ErrorCode::kInternal;
  };
  const auto kBad = ErrorCode::kInvalidArgument;
  EXPECT_EQ(kBad, code_of([&] { c->all_reduce(nullptr, buf.data(), 4, DType::kF32, {}); }));
  EXPECT_EQ(kBad, code_of([&] { c->all_reduce(buf.data(), buf.data() + 1, 4, DType::kF32, {}); }));
  EXPECT_EQ(kBad,
            code_of([&] { c->all_reduce(buf.data(), buf.data(), 4, DType::kF32, ReduceOp(7)); }));
  EXPECT_EQ(kBad, code_of([&] { c->all_reduce(buf.data(), buf.data(), 4, DType(9), {}); }));
  EXPECT_EQ(kBad, code_of([&] { c->broadcast(buf.data(), buf.data(), 4, DType::kF32, 1); }));
  EXPECT_EQ(kBad, code_of([&] { c->broadcast(buf.data(), buf.data(), 4, DType::kF32, -1); }));
  EXPECT_EQ(kBad, code_of([&] { c->broadcast(nullptr, buf.data(), 4, DType::kF32, 0); }));
  EXPECT_EQ(kBad, code_of([&] { c->all_gather(buf.data() + 1, buf.data(), 4, DType::kF32); }));
  EXPECT_EQ(kBad, code_of([&] {
              c->reduce_scatter(buf.data(), buf.data() + 2, 4, DType::kF32, ReduceOp::kSum);
            }));
  EXPECT_EQ(kBad, code_of([&] {
              c->all_reduce(buf.data(), buf.data(), SIZE_MAX / 2, DType::kF32, ReduceOp::kSum);
            }));
  EXPECT_EQ(kBad, code_of([&] { c->all_to_all(buf.data(), buf.data(), 4, DType::kF32); }));
  EXPECT_EQ(kBad, code_of([&] { c->all_to_all(buf.data(), buf.data() + 3, 4, DType::kF32); }));
  EXPECT_EQ(kBad, code_of([&] { c->all_to_all(nullptr, buf.data(), 4, DType::kF32); }));
  EXPECT_EQ(kBad, code_of([&] { c->split(-2, 0); }));
  EXPECT_EQ(kBad, code_of([&] { c->set_timeout_s(0); }));
  // Count 0 with null buffers is fine.
  c->all_reduce(nullptr, nullptr, 0, DType::kF32, ReduceOp::kSum);
  c->all_gather(nullptr, nullptr, 0, DType::kBF16);
  // The error message names the collective.
  try {
    c->all_reduce(buf.data(), buf.data() + 1, 4, DType::kBF16, ReduceOp::kMax);
  } catch (const Error& e) {
    EXPECT_NE(std::string::npos, e.message().find("all_reduce(4 x bf16, max)")) << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// split

TEST(ThreadGroup, SplitFormsOrderedSubGroups) {
  ThreadGroup::run(6, [](Communicator& world) {
    const int color = world.rank() % 2;
    auto sub = world.split(color, -world.rank());  // key reverses the order
    ASSERT_NE(nullptr, sub);
    ASSERT_EQ(3, sub->size());
    // Members of color c in world order are c, c+2, c+4; reversed by the key.
    const std::vector<int> expect_ranks =
        color == 0 ? std::vector<int>{4, 2, 0} : std::vector<int>{5, 3, 1};
    EXPECT_EQ(expect_ranks, sub->world_ranks());
    EXPECT_EQ(expect_ranks[sub->rank()], world.rank());
    // A sub-group all_reduce sums exactly its members' values.
    float v = static_cast<float>(world.rank());
    sub->all_reduce(&v, &v, 1, DType::kF32, ReduceOp::kSum);
    EXPECT_EQ(color == 0 ? 6.0f : 9.0f, v);
    // Collectives on the world and the sub-group interleave.
    float w = 1.0f;
    CommHandle h = world.all_reduce_async(&w, &w, 1, DType::kF32, ReduceOp::kSum);
    sub->barrier();
    h.wait();
    EXPECT_EQ(6.0f, w);
    // kNoColor opts out; a nested split works.
    auto pair = sub->split(sub->rank() < 2 ? 0 : Communicator::kNoColor, 0);
    if (sub->rank() < 2) {
      ASSERT_NE(nullptr, pair);
      EXPECT_EQ(2, pair->size());
      EXPECT_EQ("", check_all_reduce(*pair, 1031, DType::kBF16, ReduceOp::kSum, false, 5,
                                     Exactness::kFixedOrder));
    } else {
      EXPECT_EQ(nullptr, pair);
    }
  });
}

TEST(ThreadGroup, FailureReachesSubGroups) {
  EXPECT_THROW(ThreadGroup::run(
                   4,
                   [](Communicator& world) {
                     auto sub = world.split(world.rank() / 2, 0);
                     if (world.rank() == 3) throw std::runtime_error("rank 3 gives up");
                     // Ranks 0 and 1 would finish in their group; rank 2 needs rank 3.
                     try {
                       sub->barrier();
                       world.barrier();
                     } catch (const Error& e) {
                       EXPECT_EQ(ErrorCode::kRemoteFailure, e.code()) << e.what();
                       throw;
                     }
                   },
                   30.0),
               std::runtime_error);
}

// ---------------------------------------------------------------------------------------------
// counters and the factory

TEST(ThreadGroup, ByteCountersFollowTheRingVolumes) {
  ThreadGroup::run(4, [](Communicator& c) {
    std::vector<float> buf(4000);
    for (auto& x : buf) x = 1.0f;
    c.all_reduce(buf.data(), buf.data(), 1000, DType::kF32, ReduceOp::kSum);
    c.reduce_scatter(buf.data(), buf.data() + 1000, 250, DType::kF32, ReduceOp::kSum);
    std::vector<std::uint16_t> half(400);
    c.all_gather(half.data(), half.data() + 100 * c.rank(), 0, DType::kBF16);
    c.all_gather(half.data() + 100 * c.rank(), half.data(), 100, DType::kBF16);
    c.broadcast(buf.data(), buf.data(), 10, DType::kF32, 2);
    c.barrier();
    std::vector<float> chunks(4 * 30), got(4 * 30);
    c.all_to_all(chunks.data(), got.data(), 30, DType::kF32);
    const CommStats s = c.stats();
    EXPECT_EQ(1u, s[Collective::kAllToAll].calls);
    EXPECT_EQ(360u, s[Collective::kAllToAll].bytes_sent);  // 3 * 120
    EXPECT_EQ(360u, s[Collective::kAllToAll].bytes_received);
    EXPECT_EQ(1u, s[Collective::kAllReduce].calls);
    EXPECT_EQ(6000u, s[Collective::kAllReduce].bytes_sent);  // 2 * 3/4 * 4000
    EXPECT_EQ(6000u, s[Collective::kAllReduce].bytes_received);
    EXPECT_EQ(3000u, s[Collective::kReduceScatter].bytes_sent);  // 3 * 1000
    EXPECT_EQ(2u, s[Collective::kAllGather].calls);
    EXPECT_EQ(600u, s[Collective::kAllGather].bytes_received);  // 3 * 200
    EXPECT_EQ(c.rank() == 2 ? 40u : 0u, s[Collective::kBroadcast].bytes_sent);
    EXPECT_EQ(c.rank() == 2 ? 0u : 40u, s[Collective::kBroadcast].bytes_received);
    EXPECT_EQ(1u, s[Collective::kBarrier].calls);
    EXPECT_EQ(6000u + 3000u + 600u + 360u + (c.rank() == 2 ? 40u : 0u), s.bytes_sent());
    c.reset_stats();
    EXPECT_EQ(0u, c.stats().bytes_received());
  });
}

TEST(ThreadGroup, MakeCommunicatorGivesASingleRankThreadBackend) {
  CommOptions explicit_single;
  explicit_single.backend = "thread";
  explicit_single.rank = 0;
  explicit_single.size = 1;
  explicit_single.timeout_s = 42.0;
  auto c = make_communicator(explicit_single);
  EXPECT_EQ("thread", c->backend());
  EXPECT_EQ(1, c->size());
  EXPECT_EQ(42.0, c->timeout_s());
  EXPECT_EQ("",
            check_all_reduce(*c, 97, DType::kF16, ReduceOp::kAvg, true, 3, Exactness::kFixedOrder));
  CommOptions two = explicit_single;
  two.rank = 1;
  two.size = 2;
  testing::expect_error([&] { make_communicator(two); }, ErrorCode::kConfig, "ThreadGroup");
  CommOptions bogus = explicit_single;
  bogus.backend = "bogus";
  testing::expect_error([&] { make_communicator(bogus); }, ErrorCode::kConfig, "'bogus'");
  CommOptions no_deadline = explicit_single;
  no_deadline.timeout_s = 0;
  EXPECT_THROW(make_communicator(no_deadline), Error);
}

// ---------------------------------------------------------------------------------------------
// collective timestamps (Communicator::events)

TEST(ThreadGroupEvents, OffByDefaultRecordsNothing) {
  ThreadGroup::run(2, [](Communicator& c) {
    EXPECT_EQ(0u, c.event_capacity());
    std::vector<float> a(1000, 1.0f);
    c.all_reduce(a.data(), a.data(), a.size(), DType::kF32, ReduceOp::kSum);
    c.all_reduce_async(a.data(), a.data(), a.size(), DType::kF32, ReduceOp::kSum).wait();
    c.barrier();
    EXPECT_TRUE(c.events().empty());
  });
}

void expect_ordered(const CollectiveEvent& e, int k) {
  EXPECT_LE(e.issued, e.started) << "event " << k;
  EXPECT_LE(e.started, e.finished) << "event " << k;
}

TEST(ThreadGroupEvents, RecordedInIssueOrderWithOrderedTimestamps) {
  ThreadGroup::run(3, [](Communicator& c) {
    const std::size_t n = static_cast<std::size_t>(c.size());
    std::vector<float> a(3000, 1.0f), g(3 * 1000);
    std::vector<std::uint16_t> h(1000 * n, 0), b(7, 0);
    c.barrier();  // before recording: takes seq 0 all the same
    c.set_event_capacity(16);
    c.all_reduce(a.data(), a.data(), a.size(), DType::kF32, ReduceOp::kSum);  // inline
    CommHandle rs = c.reduce_scatter_async(h.data(), h.data() + c.rank() * 1000, 1000, DType::kBF16,
                                           ReduceOp::kSum);
    CommHandle ag = c.all_gather_async(a.data(), g.data(), 1000, DType::kF32);
    c.broadcast(b.data(), b.data(), 7, DType::kF16, 0);  // behind the two: on the worker
    ag.wait();
    rs.wait();
    c.barrier();
    const std::vector<CollectiveEvent> ev = c.events();
    ASSERT_EQ(5u, ev.size());
    const Collective kinds[] = {Collective::kAllReduce, Collective::kReduceScatter,
                                Collective::kAllGather, Collective::kBroadcast,
                                Collective::kBarrier};
    const std::size_t counts[] = {3000, 1000, 1000, 7, 0};
    const DType dtypes[] = {DType::kF32, DType::kBF16, DType::kF32, DType::kF16, DType::kF32};
    for (int k = 0; k < 5; ++k) {
      EXPECT_EQ(kinds[k], ev[k].kind) << k;
      EXPECT_EQ(counts[k], ev[k].count) << k;
      EXPECT_EQ(dtypes[k], ev[k].dtype) << k;
      EXPECT_EQ(static_cast<std::uint64_t>(k + 1), ev[k].seq) << k;
      expect_ordered(ev[k], k);
      if (k > 0) {
        EXPECT_LE(ev[k - 1].issued, ev[k].issued) << k;
        EXPECT_LE(ev[k - 1].finished, ev[k].started) << k;  // one at a time, in issue order
      }
    }
  });
}

// The test that timestamps are taken where the collective runs, not at issue or wait: rank 0
// issues an all_reduce and "computes" (sleeps) for far longer than rank 1 takes to join. Its
// event must have finished after rank 1 joined (so not stamped at issue) and before rank 0
// called wait() (so not stamped at wait): the collective ran during the compute.
TEST(ThreadGroupEvents, AsyncCollectiveRunsDuringTheIssuersCompute) {
  constexpr auto kPeerLate = std::chrono::milliseconds(150);
  constexpr auto kCompute = std::chrono::milliseconds(900);
  std::atomic<Clock::rep> peer_joined{0};
  ThreadGroup::run(2, [&](Communicator& c) {
    c.set_event_capacity(4);
    std::vector<float> a(4096, 1.0f);
    if (c.rank() == 1) {
      std::this_thread::sleep_for(kPeerLate);
      peer_joined = Clock::now().time_since_epoch().count();
      c.all_reduce(a.data(), a.data(), a.size(), DType::kF32, ReduceOp::kSum);
      const std::vector<CollectiveEvent> ev = c.events();
      ASSERT_EQ(1u, ev.size());
      expect_ordered(ev[0], 0);
      EXPECT_GE(ev[0].issued.time_since_epoch().count(), peer_joined.load());
      return;
    }
    const auto issue = Clock::now();
    CommHandle h = c.all_reduce_async(a.data(), a.data(), a.size(), DType::kF32, ReduceOp::kSum);
    std::this_thread::sleep_for(kCompute);
    const auto wait_called = Clock::now();
    h.wait();
    EXPECT_EQ(2.0f, a[4095]);
    const std::vector<CollectiveEvent> ev = c.events();
    ASSERT_EQ(1u, ev.size());
    const CollectiveEvent& e = ev[0];
    expect_ordered(e, 0);
    EXPECT_GE(e.issued, issue);
    const Clock::time_point joined{Clock::duration(peer_joined.load())};
    EXPECT_LT(e.started, joined) << "the worker began at once, before the peer came";
    EXPECT_GE(e.finished, joined) << "finished stamped before the peer joined (at issue?)";
    EXPECT_LT(e.finished, wait_called) << "finished stamped at wait(), not where it ran";
  });
}

// A blocking collective run inline is timed on the caller's thread the same way: it started
// when issued, before the late peer came, and finished after.
TEST(ThreadGroupEvents, BlockingCollectiveIsTimedWhereItRuns) {
  constexpr auto kPeerLate = std::chrono::milliseconds(150);
  std::atomic<Clock::rep> peer_joined{0};
  ThreadGroup::run(2, [&](Communicator& c) {
    c.set_event_capacity(1);
    if (c.rank() == 1) {
      std::this_thread::sleep_for(kPeerLate);
      peer_joined = Clock::now().time_since_epoch().count();
      c.barrier();
      return;
    }
    c.barrier();
    const std::vector<CollectiveEvent> ev = c.events();
    ASSERT_EQ(1u, ev.size());
    const Clock::time_point joined{Clock::duration(peer_joined.load())};
    expect_ordered(ev[0], 0);
    EXPECT_LT(ev[0].started, joined);
    EXPECT_GE(ev[0].finished, joined);
  });
}

TEST(ThreadGroupEvents, CapacityBoundsTheRecord) {
  ThreadGroup::run(2, [](Communicator& c) {
    c.set_event_capacity(3);
    // A reader on another thread while the worker records (TSan checks the locking).
    std::atomic<bool> stop{false};
    std::thread reader([&] {
      while (!stop.load()) EXPECT_LE(c.events().size(), 3u);
    });
    std::vector<CommHandle> handles;
    for (int k = 0; k < 50; ++k) handles.push_back(c.barrier_async());
    for (auto& h : handles) h.wait();
    stop = true;
    reader.join();
    std::vector<CollectiveEvent> ev = c.events();
    ASSERT_EQ(3u, ev.size());
    EXPECT_EQ(47u, ev[0].seq);
    EXPECT_EQ(49u, ev[2].seq);
    c.set_event_capacity(0);  // off: the record is dropped and nothing more is kept
    EXPECT_TRUE(c.events().empty());
    c.barrier();
    EXPECT_TRUE(c.events().empty());
    c.set_event_capacity(2);
    c.barrier();
    ev = c.events();
    ASSERT_EQ(1u, ev.size());
    EXPECT_EQ(51u, ev[0].seq);
  });
}

}  // namespace
}  // namespace zero::test
