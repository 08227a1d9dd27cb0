// tests/common/lora_training.hpp — the LoRA-like model of the frozen-parameter tests
// (tests/engine/frozen_test.cpp, attach_frozen_test.cpp, tests/ckpt/frozen_resume_test.cpp): per
// layer a frozen base unit (a Linear's weight and bias) and a trainable adapter unit (low-rank A
// and B), as LoRA fine-tuning freezes the base (Hu et al. 2021). The loss is the least-squares
// regression of tests/common/least_squares.hpp over the concatenated parameters (the gradient of
// a frozen parameter is computed and dropped, as autograd would not compute it).
// Thread safety: pure functions; each rank trains its own engine on its own thread.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/least_squares.hpp"
#include "zero/config/config.hpp"
#include "zero/engine/engine.hpp"

namespace zero::testing {

constexpr int kLayers = 3;
constexpr std::int64_t kDim = 64, kRank = 4;
constexpr int kBatch = 3;
constexpr int kSteps = 4;

// Units 2l (base: weight, bias; frozen) and 2l + 1 (adapter: A, B; trainable).
inline std::vector<UnitSpec> lora_units(bool frozen_base, int base_group = 0) {
  std::vector<UnitSpec> units;
  for (int l = 0; l < kLayers; ++l) {
    const std::string n = std::to_string(l);
    units.push_back({"base" + n,
                     {{"weight", {kDim, kDim}, base_group, !frozen_base},
                      {"bias", {kDim}, base_group, !frozen_base}}});
    units.push_back({"lora" + n, {{"A", {kRank, kDim}}, {"B", {kDim, kRank}}}});
  }
  return units;
}

inline bool is_base(std::size_t u) { return u % 2 == 0; }

inline std::size_t total_params(const std::vector<UnitSpec>& units) {
  std::size_t n = 0;
  for (const UnitSpec& u : units)
    for (const ParamSpec& p : u.params) n += p.numel();
  return n;
}

inline std::vector<float> initial_params(std::size_t n) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> d(-0.5f, 0.5f);
  std::vector<float> p(n);
  for (float& v : p) v = d(rng);
  return p;
}

// Mean-loss gradient of 0.5 (a . theta - y)^2 over the rank's micro-batch of the step
// (least_squares.hpp: kBatch samples of micro-step 0).
inline std::vector<float> trainer_grad(int step, int rank, const std::vector<float>& theta) {
  return least_squares::trainer_grad(
      least_squares::batch(static_cast<int>(theta.size()), kBatch, step, 0, rank), theta);
}

inline Config config_for(int stage, bool bf16) {
  std::string z = R"({"stage": )" + std::to_string(stage);
  if (stage == 3) z += R"(, "stage3_param_persistence_threshold": 0)";
  z += "}";
  return parse_config(R"({"zero_optimization": )" + z + R"(, "bf16": {"enabled": )" +
                      (bf16 ? "true" : "false") + R"(}, "gradient_clipping": 0.3,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1}}})");
}

// Visits every parameter: f(unit, index, offset in the concatenation, numel).
template <typename F>
void for_each_param(const std::vector<UnitSpec>& units, F&& f) {
  std::size_t at = 0;
  for (std::size_t u = 0; u < units.size(); ++u)
    for (std::size_t i = 0; i < units[u].params.size(); ++i) {
      const std::size_t n = units[u].params[i].numel();
      f(static_cast<UnitId>(u), static_cast<int>(i), at, n);
      at += n;
    }
}

// Declares the LoRA-like model's units and sets every parameter from `init`.
inline void declare(Engine& e, const std::vector<UnitSpec>& units, const std::vector<float>& init) {
  for (const UnitSpec& u : units) e.add_unit(u);
  for_each_param(units, [&](UnitId u, int i, std::size_t at, std::size_t n) {
    e.set_param(u, i, init.data() + at, n);
  });
}

// One step: every unit gathered for the forward, the gradients of the trainable parameters
// written (`reference`: the base's too, as zero), step().
inline void train_step(Engine& e, const std::vector<UnitSpec>& units, int step, bool reference) {
  std::vector<float> theta(total_params(units));
  for_each_param(units, [&](UnitId u, int i, std::size_t at, std::size_t n) {
    GatherGuard g = e.gather(u);
    convert(g.param(i).data, e.param_dtype(), theta.data() + at, DType::kF32, n);
  });
  const std::vector<float> grad = trainer_grad(step, e.comm().rank(), theta);
  for_each_param(units, [&](UnitId u, int i, std::size_t at, std::size_t n) {
    const bool frozen = is_base(static_cast<std::size_t>(u));
    if (frozen && !reference) return;  // the frozen run writes no gradient for the base
    // The reference's base gradient is zero (a frozen parameter's, as the frozen run sees it).
    std::vector<float> gi(n, 0.0f);
    if (!frozen) std::copy_n(grad.begin() + static_cast<long>(at), n, gi.begin());
    convert(gi.data(), DType::kF32, e.grad(u, i).data, e.param_dtype(), n);
    if (i == 1) e.grads_ready(u);
  });
  e.step();
}

// Every parameter's working value as f32, concatenated (collective in stage 3).
inline std::vector<float> read_all(Engine& e, const std::vector<UnitSpec>& units) {
  std::vector<float> out(total_params(units));
  for_each_param(units, [&](UnitId u, int i, std::size_t at, std::size_t n) {
    e.read_param(u, i, out.data() + at, n);
  });
  return out;
}

// The engine options of the reference: the base trainable in group 1 of lr 0.
inline EngineOptions reference_options() {
  ParamGroup still{.name = "still"};
  still.lr = 0.0;
  EngineOptions opts;
  opts.param_groups = {still};
  return opts;
}

}  // namespace zero::testing
