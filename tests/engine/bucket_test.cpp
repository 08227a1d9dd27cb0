// Buckets: consecutive units merged into one reduce-scatter (reduce_bucket_size) and one
// post-step all-gather (allgather_bucket_size). A merged collective runs over a rank-major
// staging buffer, so every element is reduced over the same ranks in the same order as without
// buckets: the parameters, masters and norms are bitwise those of the run without buckets, the
// collectives per step are fewer (counted by the communicator), and the planner still predicts
// the tracker byte for byte.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/mlp_model.hpp"
#include "common/mlp_training.hpp"
#include "zero/comm/comm.hpp"
#include "zero/engine/engine.hpp"
#include "zero/engine/plan.hpp"

namespace zero {
namespace {

using testing::kDims;
using testing::kRows;
using testing::Mlp;
using testing::RunResult;
using testing::RunSpec;

// The MLP's three units have 75, 264 and 161 elements. 520 merges units 0 and 1 (padded 384 at
// N = 1 and 2, 512 at N = 4) and leaves unit 2 alone (mixed buckets); 1e9 merges all three.
constexpr long kMixed = 520;
constexpr long kAll = 1'000'000'000;

void expect_same_run(const RunSpec& s, const RunResult& got, const RunResult& ref) {
  EXPECT_TRUE(testing::bitwise_equal(got.params, ref.params))
      << describe(s) << ": max |diff| " << testing::max_abs_diff(got.params, ref.params);
  EXPECT_TRUE(testing::bitwise_equal(got.masters, ref.masters)) << describe(s) << " (masters)";
  ASSERT_EQ(got.steps.size(), ref.steps.size()) << describe(s);
  for (std::size_t i = 0; i < ref.steps.size(); ++i) {
    EXPECT_EQ(got.steps[i].grad_norm, ref.steps[i].grad_norm) << describe(s) << " step " << i;
    EXPECT_EQ(got.steps[i].applied, ref.steps[i].applied) << describe(s) << " step " << i;
  }
}

TEST(EngineBuckets, MergedCollectivesGiveBitwiseTheRunWithoutBuckets) {
  int runs = 0;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int n : {1, 2, 3, 4}) {
      for (int stage : {1, 2, 3}) {
        for (int accumulation : {1, 3}) {
          RunSpec base{.stage = stage,
                       .ranks = n,
                       .dtype = dt,
                       .accumulation = accumulation,
                       .clip = true,
                       .steps = 8};
          if (stage == 3) base.persistence = 200;  // units 0 and 2 whole: post-step gathers too
          const RunResult ref = testing::train(base);
          for (bool overlap : {false, true}) {
            for (long bucket : {kMixed, kAll}) {
              RunSpec s = base;
              s.overlap = overlap;
              s.reduce_bucket = bucket;
              s.allgather_bucket = bucket;
              expect_same_run(s, testing::train(s), ref);
              ++runs;
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(runs, 3 * 4 * 3 * 2 * 4);
}

TEST(EngineBuckets, BitwiseWithOffloadAndOnADiscreteDevice) {
  for (int stage : {1, 2, 3}) {
    for (bool discrete : {false, true}) {
      RunSpec base{.stage = stage,
                   .ranks = 3,
                   .dtype = DType::kBF16,
                   .accumulation = 2,
                   .clip = true,
                   .steps = 6,
                   .offload_buffers = 2,
                   .offload_chunk = 50};
      base.discrete = discrete;
      const RunResult ref = testing::train(base);
      RunSpec s = base;
      s.overlap = true;
      s.reduce_bucket = kAll;
      s.allgather_bucket = kAll;
      expect_same_run(s, testing::train(s), ref);
    }
  }
}

// Collectives per micro-step and step, counted by the communicator.
struct Calls {
  std::uint64_t reduce_scatter = 0, all_gather = 0;
};
Calls calls_per_step(const RunSpec& s) {
  Calls out;
  ThreadGroup::run(s.ranks, [&](Communicator& comm) {
    const Config cfg = testing::make_config(s);
    Engine e(comm, cfg);
    Mlp mlp(kDims);
    mlp.declare(e);
    mlp.init(e, 3);
    mlp.micro_step(e, testing::make_batch(mlp.in(), mlp.out(), kRows, 0, 0, comm.rank()));
    e.step();  // the first step records the gather order (stage 3)
    comm.reset_stats();
    mlp.micro_step(e, testing::make_batch(mlp.in(), mlp.out(), kRows, 1, 0, comm.rank()));
    e.step();
    if (comm.rank() == 0) {
      out.reduce_scatter = comm.stats()[Collective::kReduceScatter].calls;
      out.all_gather = comm.stats()[Collective::kAllGather].calls;
    }
  });
  return out;
}

TEST(EngineBuckets, MergedBucketsIssueFewerCollectives) {
  for (int stage : {1, 2}) {
    RunSpec s{.stage = stage, .ranks = 2, .dtype = DType::kBF16};
    const Calls per_unit = calls_per_step(s);
    // Three units: three reduce-scatters, three post-step all-gathers, one all-gather of the
    // norm and overflow flags.
    EXPECT_EQ(per_unit.reduce_scatter, 3u) << "stage " << stage;
    EXPECT_EQ(per_unit.all_gather, 4u) << "stage " << stage;
    s.reduce_bucket = kAll;
    s.allgather_bucket = kAll;
    const Calls merged = calls_per_step(s);
    EXPECT_EQ(merged.reduce_scatter, 1u) << "stage " << stage;
    EXPECT_EQ(merged.all_gather, 2u) << "stage " << stage;
    s.reduce_bucket = kMixed;
    s.allgather_bucket = 0;
    const Calls mixed = calls_per_step(s);
    EXPECT_EQ(mixed.reduce_scatter, 2u) << "stage " << stage;
    EXPECT_EQ(mixed.all_gather, 4u) << "stage " << stage;
  }
}

TEST(EngineBuckets, ThePlannerPredictsTheTrackerWithBuckets) {
  int checked = 0;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (int n : {1, 2, 3}) {
      for (int stage : {1, 2, 3}) {
        for (bool overlap : {false, true}) {
          for (long bucket : {kMixed, kAll}) {
            RunSpec s{.stage = stage, .ranks = n, .dtype = dt, .overlap = overlap};
            s.reduce_bucket = bucket;
            s.allgather_bucket = bucket;
            if (stage == 3) s.persistence = 200;
            testing::expect_plan_equals_tracker(testing::make_config(s), n, describe(s));
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_EQ(checked, 2 * 3 * 3 * 2 * 2);
}

}  // namespace
}  // namespace zero
