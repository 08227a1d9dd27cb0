// Per-rank memory of zero::torch at N = 4, stages 0-3, against torch::optim::AdamW on one rank:
// LibTorch's own view (bytes of the storages behind the module's parameter and .grad tensors,
// at rest after step() and at its peak during backward, seen from tensor hooks of the test's
// own) and the engine's tracker.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <mutex>

#include "torch_runs.hpp"

namespace zero::testing {
namespace {

struct Seen {
  zero::torch::TensorBytes rest;  // after step()
  zero::torch::TensorBytes peak;  // max over the hooks during backward
  zero::torch::TensorBytes after_backward;
  std::size_t tracker_params = 0, tracker_grads_peak = 0, tracker_state = 0, tracker_master = 0;
  std::size_t largest_unit = 0;  // bytes
};

ct::Dims memory_dims() { return {65, 64, 4, 8, 16}; }

// Hooks on every parameter that record LibTorch's view each time a gradient arrives.
void watch(const std::vector<::torch::Tensor>& params, zero::torch::TensorBytes& peak) {
  for (const auto& p : params) {
    auto all = params;
    const_cast<::torch::Tensor&>(p).register_hook([all, &peak](::torch::Tensor g) {
      const auto b = zero::torch::tensor_bytes(all);
      peak.params = std::max(peak.params, b.params);
      peak.grads = std::max(peak.grads, b.grads);
      return g;
    });
  }
}

Seen measure_torch_adamw(const TokenData& data) {
  const ct::Dims d = memory_dims();
  ct::Model model = make_model(d);
  ::torch::optim::AdamW opt(model->parameters(), ::torch::optim::AdamWOptions(kLr));
  Seen s;
  watch(model->parameters(), s.peak);
  for (int step = 0; step < 2; ++step) {
    opt.zero_grad();
    auto loss = ct::loss(model, data.tokens[static_cast<std::size_t>(step)].slice(0, 0, 3),
                         data.targets[static_cast<std::size_t>(step)].slice(0, 0, 3));
    loss.backward();
    s.after_backward = zero::torch::tensor_bytes(model->parameters());
    opt.step();
  }
  s.rest = zero::torch::tensor_bytes(model->parameters());
  return s;
}

Seen measure_zero(int stage, const TokenData& data) {
  const ct::Dims d = memory_dims();
  constexpr int kRanks = 4;
  std::vector<ct::Model> models;
  for (int q = 0; q < kRanks; ++q) models.push_back(make_model(d, 1 + q));
  TorchRun r;
  r.stage = stage;
  r.ranks = kRanks;
  // Buckets of about one block (a block is 49,920 parameters): what a user sets for a model
  // whose state does not fit, where DeepSpeed's defaults would bucket this small model whole.
  r.reduce_bucket = 50000;
  r.prefetch_bucket = 50000;
  r.max_live = 100000;
  const Config config = torch_config(r);
  Seen seen;
  std::mutex mu;
  ThreadGroup::run(kRanks, [&](Communicator& comm) {
    const int q = comm.rank();
    ct::Model& model = models[static_cast<std::size_t>(q)];
    zero::torch::Optimizer opt(comm, *model, config);
    Seen s;
    watch(model->parameters(), s.peak);
    for (int step = 0; step < 2; ++step) {
      opt.zero_grad();
      auto loss =
          ct::loss(model, data.tokens[static_cast<std::size_t>(step)].slice(0, 3 * q, 3 * q + 3),
                   data.targets[static_cast<std::size_t>(step)].slice(0, 3 * q, 3 * q + 3));
      loss.backward();
      s.after_backward = zero::torch::tensor_bytes(model->parameters());
      opt.step();
    }
    s.rest = zero::torch::tensor_bytes(model->parameters());
    const MemoryReport rep = opt.engine().memory_report();
    // The CPU engine charges its own memory to the host tiers (device on a GPU build's CUDA).
    auto sum = [&](MemCategory c, bool peak) {
      std::size_t b = 0;
      for (MemTier t : {MemTier::kDevice, MemTier::kHost, MemTier::kPinned})
        b += peak ? rep.at(c, t).peak : rep.at(c, t).current;
      return b;
    };
    s.tracker_params = sum(MemCategory::kParams16, false);
    s.tracker_master = sum(MemCategory::kMasterParams, false);
    s.tracker_grads_peak = sum(MemCategory::kGradients, true);
    s.tracker_state = sum(MemCategory::kOptimizerState, false);
    for (const auto& u : opt.units()) {
      std::size_t b = 0;
      for (const auto& p : u.params) b += static_cast<std::size_t>(p.numel()) * 4;
      s.largest_unit = std::max(s.largest_unit, b);
    }
    if (q == 0) {
      std::lock_guard<std::mutex> lock(mu);
      seen = s;
    }
  });
  return seen;
}

TEST(TorchMemory, StageSavingsShowInLibTorchTensorsAndTheTracker) {
  const TokenData data = make_data(2, memory_dims());
  std::size_t psi = 0;
  for (const auto& p : make_model(memory_dims())->parameters())
    psi += static_cast<std::size_t>(p.numel());
  const std::size_t whole = psi * 4;  // f32 bytes of all parameters
  std::printf("char transformer, %zu parameters (%zu B f32), rank 0 of N = 4, f32\n", psi, whole);
  std::printf("%-18s %12s %12s %12s %12s | %12s %12s %12s\n", "", "torch params", "torch grads",
              "grads peak", "params peak", "tracker par", "tracker grad", "tracker m+v");
  const Seen base = measure_torch_adamw(data);
  std::printf("%-18s %12zu %12zu %12zu %12zu | %12s %12s %12s\n", "torch AdamW (N=1)",
              base.rest.params, base.after_backward.grads, base.peak.grads, base.peak.params, "-",
              "-", "-");
  EXPECT_EQ(base.rest.params, whole);
  EXPECT_EQ(base.after_backward.grads, whole);
  for (int stage = 0; stage <= 3; ++stage) {
    const Seen s = measure_zero(stage, data);
    std::printf("%-18s %12zu %12zu %12zu %12zu | %12zu %12zu %12zu\n",
                ("zero stage " + std::to_string(stage)).c_str(), s.rest.params,
                s.after_backward.grads, s.peak.grads, s.peak.params, s.tracker_params,
                s.tracker_grads_peak, s.tracker_state);
    // Parameters: whole views of the engine's working copy in stages 0-2; in stage 3 nothing is
    // left in LibTorch's tensors between uses, and at most the units in use during backward.
    if (stage < 3) {
      EXPECT_EQ(s.rest.params, whole) << "stage " << stage;
      EXPECT_GE(s.tracker_params, whole);
    } else {
      EXPECT_EQ(s.rest.params, 0u);
      EXPECT_LE(s.peak.params, 2 * s.largest_unit);
      // The shard, and pooled buffers for the unit in use, the one before it (released when the
      // next operator reads another unit) and the prefetch: whole / N + 3 units.
      EXPECT_LE(s.tracker_params, whole / 4 + 3 * s.largest_unit + 4096);
      EXPECT_LT(s.tracker_params, whole * 3 / 4);
    }
    // Gradients: in LibTorch's tensors only while their unit is in flight (every stage); the
    // tracker shows where they are kept: whole in stages 0-1, sharded in 2-3.
    EXPECT_EQ(s.after_backward.grads, 0u) << "stage " << stage;
    EXPECT_LE(s.peak.grads, 2 * s.largest_unit) << "stage " << stage;
    EXPECT_LT(s.peak.grads, whole / 2) << "stage " << stage;
    if (stage < 2)
      EXPECT_GE(s.tracker_grads_peak, whole) << "stage " << stage;
    else  // the shard and the units in flight
      EXPECT_LE(s.tracker_grads_peak, whole / 4 + 3 * s.largest_unit + 4096) << "stage " << stage;
    // Optimizer state (m, v f32): whole at stage 0, a quarter from stage 1.
    if (stage == 0)
      EXPECT_GE(s.tracker_state, 2 * whole);
    else
      EXPECT_LT(s.tracker_state, 2 * whole / 3);
  }
}

}  // namespace
}  // namespace zero::testing
