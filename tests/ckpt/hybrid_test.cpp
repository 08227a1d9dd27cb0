// Checkpoints of hybrid-sharded runs (zero_optimization.hybrid_shard_size): the first group
// writes the shards every group holds (a checkpoint of a world of G), every group loads them.
// Save at step k, load into fresh hybrid engines, train to 2k: bitwise the uninterrupted run, on
// every rank of every group (stages 2-3, f32 / bf16, synchronous and asynchronous saves); a
// hybrid checkpoint loads into flat sharding and a flat one into hybrid sharding with the state
// bitwise the saved one; a write that fails on one rank fails every rank of every group.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ckpt/ckpt_runs.hpp"
#include "common/expect_error.hpp"

namespace zero {
namespace {

using testing::FullState;
using testing::on_every_rank;
using testing::RankRun;
using testing::Resumed;
using testing::RunSpec;
using testing::TempDir;

constexpr int kHalf = 4;

TEST(CkptHybrid, ResumedRunIsBitwiseTheUninterruptedOneOnEveryRank) {
  for (int stage : {2, 3}) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      for (bool async : {false, true}) {
        const std::string what = "stage " + std::to_string(stage) + " " +
                                 std::string(to_string(dt)) + (async ? " async" : " sync");
        TempDir dir("hybrid-" + std::to_string(stage) + std::string(to_string(dt)) +
                    (async ? "a" : "s"));
        RunSpec s{.stage = stage, .ranks = 4, .dtype = dt, .clip = true};
        s.hybrid = 2;
        const std::vector<RankRun> straight = on_every_rank<RankRun>(
            4, [&](Communicator& c) { return testing::run_straight(c, s, 2 * kHalf); });
        const std::vector<FullState> saved = on_every_rank<FullState>(4, [&](Communicator& c) {
          return testing::run_and_save(c, s, kHalf, dir.path(), async);
        });
        const std::vector<Resumed> resumed = on_every_rank<Resumed>(
            4, [&](Communicator& c) { return testing::run_resumed(c, s, 2 * kHalf, dir.path()); });
        for (int r = 0; r < 4; ++r) {
          const auto k = static_cast<std::size_t>(r);
          EXPECT_EQ(resumed[k].info.saved_world_size, 2) << what;  // one group's files
          EXPECT_TRUE(testing::bitwise_equal(resumed[k].loaded, saved[k])) << what << " rank " << r;
          EXPECT_TRUE(testing::bitwise_equal(resumed[k].run.params, straight[k].params))
              << what << " rank " << r;
          EXPECT_TRUE(testing::bitwise_equal(resumed[k].run.state, straight[k].state))
              << what << " rank " << r;
        }
        // Only the first group's ranks wrote data files.
        int files = 0;
        for (const auto& entry : std::filesystem::recursive_directory_iterator(dir.path())) {
          const std::string n = entry.path().filename().string();
          files += n.rfind("rank-", 0) == 0 && n.find(".bin") != std::string::npos ? 1 : 0;
        }
        EXPECT_LE(files, 2 * 2) << what << ": keep 2 steps of 2 ranks' files";
      }
    }
  }
}

TEST(CkptHybrid, LoadsIntoFlatShardingAndBack) {
  for (const bool from_hybrid : {true, false}) {
    TempDir dir(std::string("hybrid-reshape-") + (from_hybrid ? "h" : "f"));
    RunSpec hybrid{.stage = 3, .ranks = 4, .clip = true};
    hybrid.hybrid = 2;
    RunSpec flat{.stage = 3, .ranks = 2, .clip = true};
    const RunSpec& a = from_hybrid ? hybrid : flat;
    const RunSpec& b = from_hybrid ? flat : hybrid;
    const std::vector<FullState> saved = on_every_rank<FullState>(a.ranks, [&](Communicator& c) {
      return testing::run_and_save(c, a, kHalf, dir.path(), false);
    });
    const std::vector<Resumed> resumed = on_every_rank<Resumed>(b.ranks, [&](Communicator& c) {
      return testing::run_resumed(c, b, 2 * kHalf, dir.path());
    });
    for (const Resumed& r : resumed) {
      EXPECT_EQ(r.info.saved_world_size, 2);
      // The same global batch over 2 ranks or 2 groups of 2: the full state at the save is that
      // of a world of 2 either way.
      EXPECT_TRUE(testing::bitwise_equal(r.loaded, saved[0]))
          << (from_hybrid ? "hybrid -> flat" : "flat -> hybrid");
    }
  }
}

TEST(CkptHybrid, AFailedWriteFailsEveryRankOfEveryGroup) {
  TempDir dir("hybrid-fail");
  // A file where the checkpoint directory should be: the first group cannot write.
  std::ofstream(dir.path() + "/blocked") << "x";
  RunSpec s{.stage = 2, .ranks = 4};
  s.hybrid = 2;
  const std::vector<int> failed = on_every_rank<int>(4, [&](Communicator& c) {
    Engine e(c, testing::make_config(s));
    const testing::Mlp mlp(testing::kDims);
    mlp.declare(e);
    mlp.init(e, 1);
    testing::train_steps(e, mlp, 0, 1, 1);
    ckpt::Saver saver(e, {.dir = dir.path() + "/blocked/ckpt"});
    try {
      saver.save("t");
    } catch (const Error& err) {
      EXPECT_EQ(err.code(), ErrorCode::kIO) << err.what();
      return 1;
    }
    return 0;
  });
  EXPECT_EQ(failed, std::vector<int>(4, 1));
}

}  // namespace
}  // namespace zero
