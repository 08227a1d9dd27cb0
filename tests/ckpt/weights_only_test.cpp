// Weights-only load: a pretraining checkpoint (AdamW, stage 2, N = 4) starts a fine-tuning run of
// another optimizer, stage and world size (Lion, stage 3, N = 3): the parameters and masters
// bitwise the checkpoint's, the optimizer state fresh (zero), the step counter 0.
#include <gtest/gtest.h>

#include <optional>

#include "ckpt/ckpt_runs.hpp"
#include "ckpt/import_files.hpp"
#include "common/expect_error.hpp"

namespace zero {
namespace {

TEST(WeightsOnly, AdamWStage2N4IntoLionStage3N3) {
  testing::TempDir root("weights-only");
  const testing::RunSpec s{.stage = 2, .ranks = 4, .dtype = DType::kBF16};
  const testing::RankRun saved = testing::train_and_save(s, 5, root.path(), "data@5");
  ASSERT_EQ(saved.state.steps, 5);
  const Config lion = testing::import_config(3, DType::kBF16, "Lion");
  ASSERT_EQ(lion.optimizer.type, "Lion");
  ThreadGroup::run(3, [&](Communicator& c) {
    {
      // A full load refuses another optimizer, naming both.
      testing::MlpEngine e(c, lion, std::nullopt);
      testing::expect_error([&] { ckpt::load(e, root.path()); }, ErrorCode::kConfig,
                            "the checkpoint's optimizer is AdamW, the engine's Lion");
    }
    testing::MlpEngine e(c, lion, 7);
    const ckpt::LoadResult r = ckpt::load(e, root.path(), {.weights_only = true});
    EXPECT_EQ(r.steps, 0);
    EXPECT_EQ(r.saved_world_size, 4);
    EXPECT_EQ(r.saved_stage, 2);
    EXPECT_TRUE(r.trainer_state.empty());
    const testing::FullState st = testing::full_state(e);
    EXPECT_TRUE(testing::bitwise_equal(st.master, saved.state.master)) << "masters";
    EXPECT_TRUE(testing::bitwise_equal(testing::read_params(e), saved.params)) << "parameters";
    ASSERT_EQ(st.states.size(), 1u) << "Lion keeps one state";
    for (const auto& v : st.states[0]) {
      for (float x : v) ASSERT_EQ(f32_bits(x), 0u) << "Lion's momentum is not fresh";
    }
    EXPECT_EQ(e.training_state().steps, 0);
    EXPECT_EQ(e.training_state().skipped, 0);
    // And it trains from there: the first step is step 1.
    EXPECT_EQ(e.train(0, 1).size(), 1u);
    EXPECT_EQ(e.training_state().steps, 1);
  });
}

}  // namespace
}  // namespace zero
