// Frozen parameters (ParamSpec::trainable = false) on a LoRA-like model: per layer a frozen base
// unit (a Linear's weight and bias) and a trainable adapter unit (low-rank A and B), as LoRA
// fine-tuning freezes the base (Hu et al. 2021, "LoRA").
//
// What it shows, in-process ranks (ThreadGroup), stages 0-3, N = 1..4:
//  - the frozen parameters are bitwise unchanged after training (f32 and bf16), and the trainable
//    ones are bitwise those of the all-trainable run whose base is in a group of lr 0 (zero
//    gradient, zero update: the same trajectory for the adapters), and stage k bitwise stage 0;
//  - the bytes the communicator counts per step exclude them: the reduction moves exactly the
//    trainable units' elements, and stages 1-2's post-step all-gather too;
//  - the tracker's gradient / master / optimizer-state bytes per rank at N = 4 (a table against
//    the same model all-trainable) are those of the trainable elements only, from the layout's
//    arithmetic, and the planner's prediction equals the measurement in every category;
//  - errors: grad() of a frozen parameter names it; a unit mixing frozen and trainable
//    parameters names both.
// The model and its loss: tests/common/lora_training.hpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "common/expect_error.hpp"
#include "common/lora_training.hpp"
#include "zero/comm/comm.hpp"
#include "zero/config/config.hpp"
#include "zero/engine/engine.hpp"
#include "zero/engine/plan.hpp"

namespace zero {
namespace {

using namespace zero::testing;  // NOLINT: the model's helpers

// Trains the LoRA-like model for `steps` (`reference`: the base trainable in a group of lr 0),
// calling inspect(engine) after each step; returns the parameters (every rank the same).
template <typename Inspect>
std::vector<float> train(Communicator& comm, const Config& cfg, bool reference, int steps,
                         Inspect&& inspect) {
  const std::vector<UnitSpec> units = lora_units(!reference, reference ? 1 : 0);
  Engine e(comm, cfg, reference ? reference_options() : EngineOptions{});
  declare(e, units, initial_params(total_params(units)));
  for (int step = 0; step < steps; ++step) {
    train_step(e, units, step, reference);
    inspect(e);
  }
  return read_all(e, units);
}

std::vector<float> run(int ranks, int stage, bool bf16, bool reference) {
  std::vector<float> got;
  std::mutex mu;
  const Config cfg = config_for(stage, bf16);
  ThreadGroup::run(ranks, [&](Communicator& comm) {
    std::vector<float> mine = train(comm, cfg, reference, kSteps, [](Engine&) {});
    if (comm.rank() == 0) {
      std::lock_guard<std::mutex> lock(mu);
      got = std::move(mine);
    }
  });
  return got;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

TEST(EngineFrozen, FrozenUnchangedTrainableAsTheReferenceStagesBitwise) {
  const std::vector<UnitSpec> units = lora_units(true);
  const std::vector<float> init = initial_params(total_params(units));
  // The frozen elements' positions in the concatenation, and the initial values as the working
  // dtype holds them (bf16: rounded once by set_param).
  std::vector<bool> frozen(init.size(), false);
  for_each_param(units, [&](UnitId u, int, std::size_t at, std::size_t n) {
    if (is_base(static_cast<std::size_t>(u)))
      std::fill_n(frozen.begin() + static_cast<long>(at), n, true);
  });
  int runs = 0;
  for (bool bf16 : {false, true}) {
    std::vector<float> start(init.size());
    if (bf16) {
      std::vector<std::uint16_t> b(init.size());
      convert(init.data(), DType::kF32, b.data(), DType::kBF16, init.size());
      convert(b.data(), DType::kBF16, start.data(), DType::kF32, init.size());
    } else {
      start = init;
    }
    for (int ranks : {1, 2, 3, 4}) {
      std::vector<float> stage0;
      for (int stage : {0, 1, 2, 3}) {
        const std::string what = std::string(bf16 ? "bf16" : "f32") + " stage " +
                                 std::to_string(stage) + " N=" + std::to_string(ranks);
        const std::vector<float> got = run(ranks, stage, bf16, /*reference=*/false);
        const std::vector<float> ref = run(ranks, stage, bf16, /*reference=*/true);
        ASSERT_EQ(got.size(), init.size()) << what;
        std::size_t moved = 0, frozen_bad = 0, ref_bad = 0, stage_bad = 0;
        for (std::size_t j = 0; j < got.size(); ++j) {
          if (frozen[j]) {
            frozen_bad += same_bits(got[j], start[j]) ? 0 : 1;
          } else {
            moved += got[j] != start[j] ? 1 : 0;
          }
          ref_bad += same_bits(got[j], ref[j]) ? 0 : 1;
          if (stage > 0) stage_bad += same_bits(got[j], stage0[j]) ? 0 : 1;
        }
        EXPECT_EQ(frozen_bad, 0u) << what << ": frozen parameters changed";
        EXPECT_GT(moved, 0u) << what << ": the adapters did not train";
        EXPECT_EQ(ref_bad, 0u) << what
                               << ": not bitwise the all-trainable run with lr 0 on the base";
        EXPECT_EQ(stage_bad, 0u) << what << ": not bitwise stage 0";
        if (stage == 0) stage0 = got;
        ++runs;
      }
    }
  }
  std::printf(
      "frozen: %d runs, frozen parameters bitwise unchanged, adapters bitwise the reference\n",
      runs);
}

// The reduction (and stages 1-2's all-gather of the updated shards) moves the trainable units'
// elements only: the bytes the communicator counts over one step against the layout.
TEST(EngineFrozen, BytesSentPerStepExcludeFrozenParameters) {
  constexpr int kN = 4;
  for (int stage : {0, 1, 2, 3}) {
    for (bool reference : {false, true}) {
      const Config cfg = config_for(stage, /*bf16=*/false);
      ThreadGroup::run(kN, [&](Communicator& comm) {
        CommStats before = comm.stats();
        std::size_t trainable_padded = 0, trainable_shard = 0, all_padded = 0;
        int seen = 0;
        train(comm, cfg, reference, 2, [&](Engine& e) {
          if (++seen == 1) {  // the second step is measured (the first includes set-up)
            before = comm.stats();
            for (UnitId u = 0; u < e.num_units(); ++u) {
              all_padded += e.unit_padded_numel(u);
              if (!reference && is_base(static_cast<std::size_t>(u))) continue;
              trainable_padded += e.unit_padded_numel(u);
              trainable_shard += e.unit_shard_numel(u);
            }
            return;
          }
          const CommStats after = comm.stats();
          auto sent = [&](Collective c) { return after[c].bytes_sent - before[c].bytes_sent; };
          const std::string what = std::string(reference ? "all-trainable" : "frozen") + " stage " +
                                   std::to_string(stage);
          const std::uint64_t n = kN;
          if (stage == 0) {
            // all_reduce: 2 (N-1)/N x the trainable units' f32 gradients.
            EXPECT_EQ(sent(Collective::kAllReduce), 2 * (n - 1) * trainable_padded * 4 / n) << what;
            EXPECT_EQ(sent(Collective::kReduceScatter), 0u) << what;
          } else {
            EXPECT_EQ(sent(Collective::kAllReduce), 0u) << what;
            EXPECT_EQ(sent(Collective::kReduceScatter), (n - 1) * trainable_shard * 4) << what;
          }
          if (stage == 1 || stage == 2) {
            // The updated trainable shards, and the norm's (sum, flag) all-gather of 16 bytes.
            EXPECT_EQ(sent(Collective::kAllGather), (n - 1) * (trainable_shard * 4 + 16)) << what;
          }
          if (comm.rank() == 0 && !reference) {
            std::printf(
                "stage %d N=%d: reduce bytes sent per rank %llu (trainable %zu of %zu "
                "padded elements)\n",
                stage, kN,
                static_cast<unsigned long long>(sent(Collective::kAllReduce) +
                                                sent(Collective::kReduceScatter)),
                trainable_padded, all_padded);
          }
        });
      });
    }
  }
}

std::size_t bytes(const MemoryTracker& t, MemCategory c) {
  return t.current(c) - t.current(c, MemTier::kNvme);
}

// The table of the issue: per rank gradient / master / optimizer-state bytes at N = 4, bf16
// (fp32 master, f32 reduction, two f32 AdamW moments), LoRA-like model frozen vs all-trainable.
TEST(EngineFrozen, LoraMemoryTableAgainstAllTrainable) {
  constexpr int kN = 4;
  std::printf(
      "LoRA-like model: %d layers of a frozen base (%lldx%lld + %lld) and adapters A, B "
      "(rank %lld); bf16, AdamW, N = %d, bytes per rank (rank 0)\n",
      kLayers, static_cast<long long>(kDim), static_cast<long long>(kDim),
      static_cast<long long>(kDim), static_cast<long long>(kRank), kN);
  std::printf("%-6s %-14s %10s %10s %10s %10s\n", "stage", "model", "params16", "gradients",
              "master", "state");
  for (int stage : {0, 1, 2, 3}) {
    const Config cfg = config_for(stage, /*bf16=*/true);
    for (bool reference : {true, false}) {
      PlanInput pin;
      pin.ranks = kN;
      pin.config = cfg;
      pin.units = lora_units(!reference);
      const PlanResult plan = plan_engine_memory(pin);
      std::mutex mu;
      ThreadGroup::run(kN, [&](Communicator& comm) {
        train(comm, cfg, reference, 2, [&](Engine& e) {
          if (e.training_state().steps < 2) return;
          const MemoryTracker& t = e.tracker();
          // The trainable units' stepped elements (stage 0: whole; else the shard) and their
          // accumulated gradient elements (stages 0-1 whole, 2-3 the shard).
          std::size_t step = 0, acc = 0;
          for (UnitId u = 0; u < e.num_units(); ++u) {
            if (!reference && is_base(static_cast<std::size_t>(u))) continue;
            step += e.unit_step_numel(u);
            acc += stage >= 2 ? e.unit_shard_numel(u) : e.unit_padded_numel(u);
          }
          const std::string what = std::string(reference ? "all-trainable" : "frozen") + " stage " +
                                   std::to_string(stage);
          EXPECT_EQ(bytes(t, MemCategory::kMasterParams), step * 4) << what;
          EXPECT_EQ(bytes(t, MemCategory::kOptimizerState), 2 * step * 4) << what;
          EXPECT_EQ(bytes(t, MemCategory::kGradients) - e.buffer_bytes().in_flight_grads, acc * 4)
              << what;
          for (std::size_t c = 0; c < kNumMemCategories; ++c) {
            EXPECT_EQ(bytes(t, static_cast<MemCategory>(c)), plan.bytes[c])
                << to_string(static_cast<MemCategory>(c)) << ": planner, " << what;
          }
          if (comm.rank() == 0) {
            std::lock_guard<std::mutex> lock(mu);
            std::printf("%-6d %-14s %10zu %10zu %10zu %10zu\n", stage,
                        reference ? "all-trainable" : "base frozen",
                        bytes(t, MemCategory::kParams16), bytes(t, MemCategory::kGradients),
                        bytes(t, MemCategory::kMasterParams),
                        bytes(t, MemCategory::kOptimizerState));
          }
        });
      });
    }
  }
}

TEST(EngineFrozen, GradOfAFrozenParameterIsAnErrorNamingIt) {
  ThreadGroup::run(2, [](Communicator& comm) {
    Engine e(comm, config_for(2, false));
    for (const UnitSpec& u : lora_units(true)) e.add_unit(u);
    { GatherGuard g = e.gather(0); }
    testing::expect_error([&] { e.grad(0, 1); }, ErrorCode::kInvalidArgument,
                          "grad('base0.bias'): the parameter is frozen");
    // grads_ready on a frozen unit is allowed (a trainer's generic backward) and does nothing;
    // step() does not ask for it.
    e.grads_ready(0);
    for (UnitId u = 1; u < e.num_units(); u += 2) e.grads_ready(u);
    EXPECT_TRUE(e.step().applied);
  });
  ThreadGroup::run(1, [](Communicator& comm) {
    Engine e(comm, config_for(0, false));
    testing::expect_error(
        [&] {
          e.add_unit({"mixed", {{"w", {4}, 0, false}, {"a", {3}}}});
        },
        ErrorCode::kInvalidArgument,
        "unit 'mixed' mixes frozen and trainable parameters ('w' is frozen, "
        "'a' is not)");
  });
}

}  // namespace
}  // namespace zero
