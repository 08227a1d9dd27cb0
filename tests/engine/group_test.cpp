// The engine on a data-parallel sub-communicator of a larger layout: 4 ranks as 2 (TP-like) x 2
// (DP), the world split by the trainer (Communicator::split) into tensor groups {0,1}, {2,3} and
// data-parallel groups {0,2}, {1,3}; each engine runs on its DP group only, sees that group as
// its world (size 2, its rank in the group), and trains bitwise as the same two ranks do alone,
// at every stage, while the tensor groups run collectives of their own before, between and
// after the engine's steps.
#include <gtest/gtest.h>

#include <memory>
#include <mutex>
#include <vector>

#include "common/compare.hpp"
#include "common/mlp_training.hpp"
#include "zero/comm/comm.hpp"
#include "zero/engine/engine.hpp"

namespace zero::testing {
namespace {

constexpr int kTp = 2, kDp = 2;

TEST(EngineGroups, DataParallelGroupInsideATwoByTwoLayoutTrainsAsTheGroupAlone) {
  for (int stage = 0; stage <= 3; ++stage) {
    RunSpec spec;
    spec.stage = stage;
    spec.ranks = kDp;
    spec.steps = 6;
    spec.clip = true;
    const RunResult alone = train(spec);  // the two DP ranks as a world of their own

    std::mutex mu;
    std::vector<RunResult> in_layout(kTp * kDp);
    ThreadGroup::run(kTp * kDp, [&](Communicator& world) {
      const int tp_rank = world.rank() % kTp, dp_rank = world.rank() / kTp;
      // Ranks with the same TP position form a DP group; ranks of one DP position a TP group.
      std::unique_ptr<Communicator> dp = world.split(/*color=*/tp_rank, /*key=*/dp_rank);
      std::unique_ptr<Communicator> tp = world.split(/*color=*/dp_rank, /*key=*/tp_rank);
      ASSERT_EQ(dp->size(), kDp);
      ASSERT_EQ(dp->rank(), dp_rank);
      EXPECT_EQ(dp->world_ranks(), (std::vector<int>{tp_rank, tp_rank + kTp}));
      // The tensor group's own traffic around the engine's (a layer's partial sums).
      float partial = static_cast<float>(world.rank() + 1);
      tp->all_reduce(&partial, &partial, 1, DType::kF32, ReduceOp::kSum);
      EXPECT_EQ(partial, static_cast<float>(2 * kTp * dp_rank + 1 + 2));
      RunResult mine = train_rank(*dp, spec);
      tp->all_reduce(&partial, &partial, 1, DType::kF32, ReduceOp::kSum);
      world.barrier();
      std::lock_guard<std::mutex> lock(mu);
      in_layout[static_cast<std::size_t>(world.rank())] = std::move(mine);
    });
    for (int r = 0; r < kTp * kDp; ++r) {
      const RunResult& got = in_layout[static_cast<std::size_t>(r)];
      EXPECT_TRUE(bitwise_equal(got.params, alone.params))
          << "stage " << stage << ", world rank " << r << ": max diff "
          << max_abs_diff(got.params, alone.params);
      EXPECT_TRUE(bitwise_equal(got.masters, alone.masters)) << "stage " << stage << ", rank " << r;
      ASSERT_EQ(got.steps.size(), alone.steps.size());
      for (std::size_t k = 0; k < got.steps.size(); ++k) {
        EXPECT_EQ(got.steps[k].grad_norm, alone.steps[k].grad_norm) << "stage " << stage;
      }
    }
  }
}

TEST(EngineGroups, TheEngineSeesItsGroupAsItsWorld) {
  ThreadGroup::run(kTp * kDp, [&](Communicator& world) {
    std::unique_ptr<Communicator> dp = world.split(world.rank() % kTp, world.rank() / kTp);
    const Config cfg = parse_config(R"({"zero_optimization": {"stage": 3}})");
    Engine e(*dp, cfg);
    EXPECT_EQ(&e.comm(), dp.get());
    EXPECT_EQ(e.comm().size(), kDp);
    // Shards are split over the group: a 491-element unit padded to a multiple of 2 x 32.
    e.add_unit({"w", {{"w", {491}}}});
    EXPECT_EQ(e.unit_shard_numel(0), e.unit_padded_numel(0) / kDp);
    EXPECT_EQ(e.unit_padded_numel(0) % (kDp * 32), 0u);
  });
}

}  // namespace
}  // namespace zero::testing
