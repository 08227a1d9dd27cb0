// Frozen parameters through the LibTorch adapter: the char transformer with every >= 2-D weight
// but the head's frozen (requires_grad(false); BitFit-like: biases, norms' gains and the head
// train), so each block's child unit mixes frozen and trainable parameters and the adapter splits
// it into "<unit> (frozen)" and "<unit>". Against ::torch::optim::AdamW over the trainable
// parameters only (the frozen ones are in no optimizer, as a torch trainer writes it): N = 1..3
// in-process ranks, stages 0-3, f32, 10 steps, clipping on: within 1e-5 relative, the frozen
// parameters bitwise their initial values, stage k bitwise stage 0. The engine holds no master
// or state for them, and at stage 3 they are sharded like the rest.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "torch_runs.hpp"

namespace zero::testing {
namespace {

constexpr int kFrozenSteps = 10;

bool frozen_name(const std::string& name, const ::torch::Tensor& t) {
  return t.dim() >= 2 && name.rfind("head.", 0) != 0;
}

void freeze(ct::Model& model) {
  for (auto& p : model->named_parameters())
    if (frozen_name(p.key(), p.value())) p.value().set_requires_grad(false);
}

std::vector<::torch::Tensor> reference(const TorchRun& r, const TokenData& data) {
  ct::Model model = make_model(test_dims());
  freeze(model);
  std::vector<::torch::Tensor> trainable;
  for (auto& p : model->parameters())
    if (p.requires_grad()) trainable.push_back(p);
  ::torch::optim::AdamW opt(
      trainable,
      ::torch::optim::AdamWOptions(kLr).betas({0.9, 0.999}).eps(1e-8).weight_decay(kWeightDecay));
  for (int s = 0; s < r.steps; ++s) {
    opt.zero_grad();
    auto loss = ct::loss(model, data.tokens[static_cast<std::size_t>(s)],
                         data.targets[static_cast<std::size_t>(s)]);
    loss.backward();
    ::torch::nn::utils::clip_grad_norm_(trainable, r.clip);
    opt.step();
  }
  return snapshot(*model);
}

struct FrozenRun {
  std::vector<::torch::Tensor> params;
  std::size_t master = 0, state = 0, params16 = 0;  // rank 0's bytes after training
  std::size_t trainable_step = 0;                   // rank 0's stepped trainable elements
  int frozen_units = 0;
};

FrozenRun train(const TorchRun& r, const TokenData& data) {
  std::vector<ct::Model> models;
  for (int q = 0; q < r.ranks; ++q) {
    models.push_back(make_model(test_dims(), 1 + q));
    freeze(models.back());
  }
  const Config config = torch_config(r);
  FrozenRun out;
  std::mutex mu;
  ThreadGroup::run(r.ranks, [&](Communicator& comm) {
    const int q = comm.rank();
    ct::Model& model = models[static_cast<std::size_t>(q)];
    zero::torch::Optimizer opt(comm, *model, config);
    const int rows = kBatch / r.ranks;
    for (int s = 0; s < r.steps; ++s) {
      auto tok = data.tokens[static_cast<std::size_t>(s)].slice(0, q * rows, (q + 1) * rows);
      auto tgt = data.targets[static_cast<std::size_t>(s)].slice(0, q * rows, (q + 1) * rows);
      opt.zero_grad();
      ct::loss(model, tok, tgt).backward();
      opt.step();
    }
    Engine& e = opt.engine();
    const MemoryTracker& t = e.tracker();
    FrozenRun mine;
    for (UnitId u = 0; u < e.num_units(); ++u) {
      const bool frozen = !e.unit(u).params[0].trainable;
      for (const ParamSpec& p : e.unit(u).params) EXPECT_EQ(p.trainable, !frozen) << p.name;
      if (frozen) {
        ++mine.frozen_units;
      } else {
        mine.trainable_step += e.unit_step_numel(u);
      }
    }
    mine.master = t.current(MemCategory::kMasterParams);
    mine.state = t.current(MemCategory::kOptimizerState);
    mine.params16 = t.current(MemCategory::kParams16);
    opt.detach();
    if (q == 0) {
      std::lock_guard<std::mutex> lock(mu);
      mine.params = snapshot(*model);
      out = std::move(mine);
    }
  });
  return out;
}

TEST(TorchFrozen, RequiresGradFalseAgainstAdamWOnTheTrainableOnly) {
  const TokenData data = make_data(kFrozenSteps, test_dims());
  TorchRun base;
  base.steps = kFrozenSteps;
  base.clip = 0.5;
  const std::vector<::torch::Tensor> ref = reference(base, data);
  // The frozen parameters' initial values and positions in named_parameters order.
  ct::Model init = make_model(test_dims());
  std::vector<bool> frozen;
  for (const auto& p : init->named_parameters()) frozen.push_back(frozen_name(p.key(), p.value()));
  const std::vector<::torch::Tensor> start = snapshot(*init);
  double worst = 0;
  for (int ranks : {1, 2, 3}) {
    std::vector<::torch::Tensor> stage0;
    for (int stage : {0, 1, 2, 3}) {
      TorchRun r = base;
      r.stage = stage;
      r.ranks = ranks;
      const std::string what = "stage " + std::to_string(stage) + " N=" + std::to_string(ranks);
      const FrozenRun got = train(r, data);
      ASSERT_EQ(got.params.size(), start.size()) << what;
      EXPECT_GT(got.frozen_units, 0) << what;
      for (std::size_t i = 0; i < start.size(); ++i) {
        if (frozen[i]) EXPECT_TRUE(::torch::equal(got.params[i], start[i])) << what << " #" << i;
      }
      const double d = max_rel_diff(got.params, ref);
      worst = std::max(worst, d);
      EXPECT_LE(d, 1e-5) << what;
      // f32: the parameters are the master (no copy); AdamW's two f32 moments over the trainable
      // stepped elements only.
      EXPECT_EQ(got.master, 0u) << what;
      EXPECT_EQ(got.state, 2 * 4 * got.trainable_step) << what;
      if (stage == 0) {
        stage0 = got.params;
      } else {
        EXPECT_TRUE(bitwise_equal(got.params, stage0)) << what << ": not bitwise stage 0";
      }
    }
  }
  std::printf("torch frozen: worst relative difference to torch::optim::AdamW %.3g\n", worst);
}

}  // namespace
}  // namespace zero::testing
