// The GPT decoder with its bottom frozen (GptConfig::frozen_units, zero-bench / zero-train
// --freeze): the embedding (with the tied head) and the first blocks frozen, as fine-tuning the
// top of a pretrained model.
//
// What it shows:
//  - the trainable units' gradients are bitwise the whole model's (the same operators on the same
//    values: freezing skips work, it changes none), with and without activation checkpointing,
//    and the frozen units get no gradient (the tap is never called for them);
//  - trained through the engine, N = 1..3, stages 0-3, bf16: the frozen parameters are bitwise
//    unchanged, the others train, stage k is bitwise stage 0; the tracker is the planner in every
//    category (the planner reads the frozen units from the model's declaration and the shortened
//    backward from gather_order), and the activation peak is activation_bytes();
//  - a frozen_units out of range is an error naming it.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "common/bitwise.hpp"
#include "common/compare.hpp"
#include "common/expect_error.hpp"
#include "gpt/gpt_model.hpp"
#include "zero/comm/comm.hpp"
#include "zero/config/config.hpp"
#include "zero/engine/activation_checkpointing.hpp"
#include "zero/engine/engine.hpp"
#include "zero/engine/plan.hpp"

namespace zero::gpt {
namespace {

constexpr int kVocab = 40, kSeq = 16, kRows = 2;

GptConfig model_config(int frozen_units) {
  return {.vocab = kVocab,
          .seq = kSeq,
          .layers = 3,
          .dim = 32,
          .heads = 4,
          .frozen_units = frozen_units};
}

TokenBatch random_batch(int rows, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  TokenBatch b;
  b.rows = rows;
  b.seq = kSeq;
  for (int i = 0; i < rows * (kSeq + 1); ++i) {
    b.tokens.push_back(static_cast<std::int32_t>(rng() % kVocab));
  }
  return b;
}

// Every (unit, param) gradient of one micro-step as f32; a unit never tapped stays empty.
using Grads = std::vector<std::vector<std::vector<float>>>;

Grads one_step_grads(int frozen_units, const CheckpointSpec& spec) {
  Grads g;
  ThreadGroup::run(1, [&](Communicator& comm) {
    Engine e(comm, parse_config(R"({"zero_optimization": {"stage": 0}})"));
    GptModel model(model_config(frozen_units), e.tracker());
    model.set_checkpointing(spec);
    model.declare(e);
    model.init_random(e, 3, 0.3f);
    g.assign(static_cast<std::size_t>(e.num_units()), {});
    model.forward_backward(e, random_batch(kRows, 11), [&](UnitId u, int p, const View& v) {
      auto& unit = g[static_cast<std::size_t>(u)];
      if (unit.size() <= static_cast<std::size_t>(p)) unit.resize(static_cast<std::size_t>(p) + 1);
      unit[static_cast<std::size_t>(p)].resize(v.count);
      convert(v.data, v.dtype, unit[static_cast<std::size_t>(p)].data(), DType::kF32, v.count);
    });
  });
  return g;
}

TEST(GptFrozen, TrainableGradientsAreBitwiseTheWholeModelsAndFrozenGetNone) {
  for (const std::string policy : {"none", "every:1", "sqrt"}) {
    const CheckpointSpec spec = CheckpointSpec::resolve(policy, {});
    const Grads whole = one_step_grads(0, spec);
    for (int frozen : {1, 2, 3}) {
      const Grads got = one_step_grads(frozen, spec);
      ASSERT_EQ(got.size(), whole.size());
      for (std::size_t u = 0; u < got.size(); ++u) {
        const std::string what =
            policy + ", frozen_units " + std::to_string(frozen) + ", unit " + std::to_string(u);
        if (static_cast<int>(u) < frozen) {
          EXPECT_TRUE(got[u].empty()) << what << ": a frozen unit's gradient was written";
          continue;
        }
        ASSERT_EQ(got[u].size(), whole[u].size()) << what;
        for (std::size_t p = 0; p < got[u].size(); ++p) {
          ASSERT_EQ(got[u][p].size(), whole[u][p].size()) << what;
          EXPECT_TRUE(testing::same_bits(got[u][p].data(), whole[u][p].data(), got[u][p].size()))
              << what << " param " << p << ": not bitwise the whole model's gradient";
        }
      }
    }
  }
}

struct Trained {
  zero::testing::Tensors start, end;
};

// bf16 AdamW with clipping, `steps` steps; after every step the activation peak checked against
// activation_bytes() and (from the second) the tracker against the planner.
Trained train(int ranks, int stage, int frozen_units, int steps) {
  const Config cfg =
      parse_config(R"({"zero_optimization": {"stage": )" + std::to_string(stage) +
                   (stage == 3 ? R"(, "stage3_param_persistence_threshold": 0)" : "") +
                   R"(}, "bf16": {"enabled": true}, "gradient_clipping": 0.5,
          "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "weight_decay": 0.1}}})");
  const GptConfig g = model_config(frozen_units);
  const CheckpointSpec spec = CheckpointSpec::resolve("sqrt", {});
  PlanResult plan;
  {
    ThreadGroup::run(1, [&](Communicator& comm) {  // the model's units, as zero-bench takes them
      Engine e(comm, cfg);
      MemoryTracker t;
      GptModel m(g, t);
      m.declare(e);
      PlanInput pin;
      for (UnitId u = 0; u < e.num_units(); ++u) pin.units.push_back(e.unit(u));
      pin.ranks = ranks;
      pin.config = cfg;
      pin.gather_order = GptModel::gather_order(g, spec);
      pin.grads_held = GptModel::grads_held(g);
      plan = plan_engine_memory(pin);
    });
  }
  Trained out;
  std::mutex mu;
  ThreadGroup::run(ranks, [&](Communicator& comm) {
    EngineOptions opts;
    opts.poison_released = true;
    Engine e(comm, cfg, opts);
    GptModel model(g, e.tracker());
    model.set_checkpointing(spec);
    model.declare(e);
    model.init(e, 5);
    zero::testing::Tensors start = zero::testing::read_params(e);
    for (int step = 0; step < steps; ++step) {
      e.tracker().reset_peaks();
      model.forward_backward(e, random_batch(kRows, 100 * step + comm.rank()));
      e.step();
      const std::string what = "stage " + std::to_string(stage) + " N=" + std::to_string(ranks) +
                               " frozen_units " + std::to_string(frozen_units);
      EXPECT_EQ(e.tracker().peak(MemCategory::kActivations, MemTier::kHost),
                model.activation_bytes(kRows, kSeq))
          << what;
      // From the second step: the first records the gather order stage 3 prefetches by (its
      // pool grows to the planned size then).
      for (std::size_t c = 0; step > 0 && c < kNumMemCategories; ++c) {
        const auto cat = static_cast<MemCategory>(c);
        if (cat == MemCategory::kActivations || cat == MemCategory::kOther) continue;
        EXPECT_EQ(e.tracker().current(cat), plan.bytes[c]) << to_string(cat) << ": " << what;
      }
    }
    zero::testing::Tensors end = zero::testing::read_params(e);
    if (comm.rank() == 0) {
      std::lock_guard<std::mutex> lock(mu);
      out.start = std::move(start);
      out.end = std::move(end);
    }
  });
  return out;
}

TEST(GptFrozen, FrozenUnitsUnchangedStagesBitwiseTrackerIsThePlanner) {
  constexpr int kFrozen = 2;  // the embedding (and tied head) and block0
  int runs = 0;
  for (int ranks : {1, 2, 3}) {
    zero::testing::Tensors stage0;
    for (int stage : {0, 1, 2, 3}) {
      const std::string what = "stage " + std::to_string(stage) + " N=" + std::to_string(ranks);
      const Trained t = train(ranks, stage, kFrozen, 3);
      ASSERT_EQ(t.end.size(), t.start.size()) << what;
      // read_params' tensors in declaration order: the embedding's 2, then 12 per block.
      const std::size_t frozen_tensors = 2 + 12 * (kFrozen - 1);
      for (std::size_t p = 0; p < t.end.size(); ++p) {
        const bool changed =
            !testing::same_bits(t.end[p].data(), t.start[p].data(), t.end[p].size());
        if (p < frozen_tensors) {
          EXPECT_FALSE(changed) << what << ": frozen parameter tensor " << p << " changed";
        } else {
          EXPECT_TRUE(changed) << what << ": parameter tensor " << p << " did not train";
        }
      }
      if (stage == 0) {
        stage0 = t.end;
      } else {
        EXPECT_TRUE(zero::testing::bitwise_equal(t.end, stage0)) << what << ": not stage 0's";
      }
      ++runs;
    }
  }
  std::printf("gpt frozen_units %d: %d runs, frozen bitwise unchanged, stage k bitwise stage 0\n",
              kFrozen, runs);
}

TEST(GptFrozen, FrozenUnitsOutOfRangeAreNamed) {
  MemoryTracker t;
  for (int bad : {-1, 4}) {
    zero::testing::expect_error([&] { GptModel m(model_config(bad), t); },
                                ErrorCode::kInvalidArgument,
                                "GptConfig.frozen_units = " + std::to_string(bad) + ": need 0..3");
  }
}

}  // namespace
}  // namespace zero::gpt
