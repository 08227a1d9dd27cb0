// A checkpoint of a run with frozen parameters (the LoRA-like model of
// tests/common/lora_training.hpp, the base frozen) saved after 2 steps and loaded into a fresh
// engine whose base starts elsewhere: the frozen parameters come back from the checkpoint (they
// have no master or state in memory; the checkpoint keeps their values, their state as the fresh
// zeros), and training goes on bitwise as the uninterrupted run at the same world size and
// stage (stages 0-3, N = 4, f32 and bf16); at another world size and stage every loaded value
// is bitwise the saved one, and the frozen parameters stay so through further training.
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/ckpt_runs.hpp"
#include "common/bitwise.hpp"
#include "common/lora_training.hpp"
#include "zero/ckpt/ckpt.hpp"
#include "zero/comm/comm.hpp"
#include "zero/engine/engine.hpp"

namespace zero {
namespace {

using namespace zero::testing;  // NOLINT: the model's helpers

constexpr int kBefore = 2;

// One rank's engine of the LoRA model (base frozen), its parameters declared with `init` (the
// model's initial values unless given).
struct LoraEngine : Engine {
  const std::vector<UnitSpec> units = lora_units(true);
  LoraEngine(Communicator& comm, const Config& cfg,
             std::optional<std::vector<float>> init = std::nullopt)
      : Engine(comm, cfg) {
    declare(*this, units, init ? *init : initial_params(total_params(units)));
  }
  // Trains steps [from, to).
  void train(int from, int to) {
    for (int s = from; s < to; ++s) train_step(*this, units, s, false);
  }
};

// Rank 0's parameters after kBefore + after steps: uninterrupted, or saved after kBefore into
// `dir` by one run and resumed by another at `resume_ranks` with `resume`.
std::vector<float> uninterrupted(int ranks, const Config& cfg, int after) {
  return on_ranks<std::vector<float>>(ranks, [&](Communicator& comm) {
    LoraEngine e(comm, cfg);
    e.train(0, kBefore + after);
    return read_all(e, e.units);
  });
}

std::vector<float> resumed(int ranks, const Config& cfg, int resume_ranks, const Config& resume,
                           const std::string& dir, int after) {
  ThreadGroup::run(ranks, [&](Communicator& comm) {
    LoraEngine e(comm, cfg);
    e.train(0, kBefore);
    ckpt::Saver saver(e, {.dir = dir});
    saver.save();
  });
  return on_ranks<std::vector<float>>(resume_ranks, [&](Communicator& comm) {
    std::vector<float> elsewhere = initial_params(total_params(lora_units(true)));
    for (float& v : elsewhere) v = 0.25f - v;  // the checkpoint must bring every value back
    LoraEngine e(comm, resume, elsewhere);
    const ckpt::LoadResult r = ckpt::load(e, dir);
    EXPECT_EQ(r.steps, kBefore);
    e.train(kBefore, kBefore + after);
    return read_all(e, e.units);
  });
}

TEST(CkptFrozen, ResumeWithFrozenParametersBitwise) {
  constexpr int kN = 4;
  for (bool bf16 : {false, true}) {
    for (int stage : {0, 1, 2, 3}) {
      const std::string what =
          std::string(bf16 ? "bf16" : "f32") + " stage " + std::to_string(stage);
      const Config cfg = config_for(stage, bf16);
      TempDir dir("frozen-" + std::to_string(stage) + (bf16 ? "-bf16" : ""));
      const std::vector<float> want = uninterrupted(kN, cfg, 2);
      const std::vector<float> got = resumed(kN, cfg, kN, cfg, dir.path(), 2);
      ASSERT_EQ(got.size(), want.size()) << what;
      const std::size_t bad = testing::bits_differing(got.data(), want.data(), got.size());
      EXPECT_EQ(bad, 0u) << what << ": resumed run differs from the uninterrupted one";
    }
  }
}

TEST(CkptFrozen, ResumeAtAnotherWorldSizeAndStage) {
  const Config saved = config_for(3, false), resume = config_for(1, false);
  const std::vector<float> want = uninterrupted(4, saved, 0);
  const std::vector<UnitSpec> units = lora_units(true);
  const std::vector<float> init = initial_params(total_params(units));
  for (int after : {0, 2}) {
    TempDir dir("frozen-reshard-" + std::to_string(after));
    const std::vector<float> got = resumed(4, saved, 3, resume, dir.path(), after);
    ASSERT_EQ(got.size(), want.size());
    for_each_param(units, [&](UnitId u, int i, std::size_t at, std::size_t n) {
      const UnitSpec& us = units[static_cast<std::size_t>(u)];
      const bool frozen = is_base(static_cast<std::size_t>(u));
      if (!frozen && after > 0) return;  // trained on at N = 3: other batches
      for (std::size_t j = at; j < at + n; ++j) {
        ASSERT_EQ(got[j], frozen ? init[j] : want[j])
            << us.name << "." << us.params[static_cast<std::size_t>(i)].name << " after " << after
            << " steps at N = 3";
      }
    });
  }
}

}  // namespace
}  // namespace zero
