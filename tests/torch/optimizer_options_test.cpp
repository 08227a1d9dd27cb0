// The trainer's AdamOptions, SGDOptions and AdagradOptions through zero::torch against
// torch::optim::Adam, SGD and Adagrad themselves, with the same three parameter groups whose
// options differ: the >= 2-D weights on the defaults (a group without options), the < 2-D
// parameters and the head each with options of their own, every option off its torch default.
// The char transformer, 20 steps, f32, N = 1..3 in-process ranks, stages 0-3: within 1e-5
// relative of torch, stage k bitwise stage 0. Each comparison can fail: the same run with one
// option dropped (its torch default, or AdamW's decoupled decay for Adam's L2) misses torch by
// more than 10x the bound. Then what the engine cannot step, refused naming the option and the
// group: amsgrad, Adagrad's lr_decay and initial_accumulator_value, SGD momentum in a group over
// defaults without it, values outside the engine's ranges that torch checks only in the defaults.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/expect_error.hpp"
#include "torch_runs.hpp"

namespace zero::testing {
namespace {

namespace optim = ::torch::optim;

constexpr int kSteps = 20;
constexpr double kBound = 1e-5;  // relative to each tensor's largest value
constexpr double kMiss = 1e-4;   // a run with an option dropped must be farther than this

const TokenData& data() {
  static const TokenData d = make_data(kSteps, test_dims());
  return d;
}

// One torch::optim set-up: the defaults (group 0: the >= 2-D weights but the head's) and the
// options of group 1 (< 2-D parameters) and group 2 (the head); nullopt: the group has no
// options of its own (it takes the defaults).
template <typename Options>
struct Recipe {
  Options defaults;
  std::optional<Options> small, head;
};

template <typename Options>
std::vector<optim::OptimizerParamGroup> groups_of(ct::Model& model, const Recipe<Options>& s) {
  std::vector<at::Tensor> weights, small, head;
  for (const auto& p : model->named_parameters()) {
    if (p.key().rfind("head.", 0) == 0) {
      head.push_back(p.value());
    } else {
      (p.value().dim() >= 2 ? weights : small).push_back(p.value());
    }
  }
  auto group = [](std::vector<at::Tensor> params, const std::optional<Options>& o) {
    return o ? optim::OptimizerParamGroup(std::move(params), std::make_unique<Options>(*o))
             : optim::OptimizerParamGroup(std::move(params));
  };
  std::vector<optim::OptimizerParamGroup> g;
  g.push_back(group(weights, std::nullopt));
  g.push_back(group(small, s.small));
  g.push_back(group(head, s.head));
  return g;
}

// TorchOptimizer (torch::optim::Adam, SGD, Adagrad) over the groups, one rank, the whole batch.
template <typename TorchOptimizer, typename Options>
std::vector<::torch::Tensor> torch_run(const Recipe<Options>& s) {
  ct::Model model = make_model(test_dims());
  TorchOptimizer opt(groups_of(model, s), s.defaults);
  for (int k = 0; k < kSteps; ++k) {
    opt.zero_grad();
    ct::loss(model, data().tokens[static_cast<std::size_t>(k)],
             data().targets[static_cast<std::size_t>(k)])
        .backward();
    opt.step();
  }
  return snapshot(*model);
}

Config stage_config(int stage) {
  return parse_config(R"({"zero_optimization": {"stage": )" + std::to_string(stage) +
                      (stage == 3 ? R"(, "stage3_param_persistence_threshold": 0)" : "") + "}}");
}

// zero::torch built from the same groups and defaults (no optimizer block in the config).
template <typename Options>
std::vector<::torch::Tensor> zero_run(int ranks, int stage, const Recipe<Options>& s) {
  const Config cfg = stage_config(stage);
  return train_zero_with(ranks, kSteps, data(), [&](Communicator& comm, ct::Model& model) {
    return std::make_unique<zero::torch::Optimizer>(comm, zero::torch::units_by_child(*model),
                                                    groups_of(model, s), s.defaults, cfg);
  });
}

// N = 1..3, stages 0-3 against `ref`, each within kBound; stage k bitwise stage 0.
template <typename Options>
void expect_matches(const char* name, const std::vector<::torch::Tensor>& ref,
                    const Recipe<Options>& s) {
  for (int ranks = 1; ranks <= 3; ++ranks) {
    std::vector<::torch::Tensor> stage0;
    double worst = 0;
    for (int stage = 0; stage <= 3; ++stage) {
      const auto got = zero_run(ranks, stage, s);
      const double rel = max_rel_diff(got, ref);
      worst = std::max(worst, rel);
      EXPECT_LE(rel, kBound) << name << " N=" << ranks << " stage " << stage;
      if (stage == 0) {
        stage0 = got;
      } else {
        EXPECT_TRUE(bitwise_equal(got, stage0)) << name << " N=" << ranks << " stage " << stage;
      }
    }
    std::printf("%s N=%d, stages 0-3: max rel diff to torch::optim::%s %.3g\n", name, ranks, name,
                worst);
  }
}

// zero::torch with `s` (one option dropped) misses `ref` by more than kMiss (N = 2, stage 0).
template <typename Options>
void expect_misses(const std::string& what, const std::vector<::torch::Tensor>& ref,
                   const Recipe<Options>& s) {
  const double rel = max_rel_diff(zero_run(2, 0, s), ref);
  std::printf("  without %s: max rel diff %.3g\n", what.c_str(), rel);
  EXPECT_GT(rel, kMiss) << "dropping " << what << " changed nothing the test sees";
}

// ---- Adam: L2 weight decay (added to the gradient), betas, eps per group

Recipe<optim::AdamOptions> adam_setup() {
  Recipe<optim::AdamOptions> s{
      optim::AdamOptions(2e-3).betas({0.8, 0.95}).eps(1e-6).weight_decay(0.05), {}, {}};
  s.small = optim::AdamOptions(3e-3).betas({0.85, 0.99}).eps(1e-4).weight_decay(0.0);
  s.head = optim::AdamOptions(5e-4).betas({0.7, 0.9}).eps(1e-3).weight_decay(0.2);
  return s;
}

TEST(TorchOptimizerOptions, AdamOptionsPerGroupMatchTorchAdam) {
  const auto s = adam_setup();
  const auto ref = torch_run<optim::Adam>(s);
  expect_matches("Adam", ref, s);
  {
    auto d = s;
    d.defaults.betas({0.9, 0.999});
    expect_misses("the defaults' betas", ref, d);
  }
  {
    auto d = s;
    d.small->eps(1e-8);
    expect_misses("group 1's eps", ref, d);
  }
  {
    auto d = s;
    d.defaults.weight_decay(0.0);
    expect_misses("the defaults' weight_decay", ref, d);
  }
  {
    auto d = s;
    d.head.reset();
    expect_misses("group 2's options", ref, d);
  }
  // The same values as AdamW: decoupled decay where torch's Adam adds it to the gradient.
  Recipe<optim::AdamWOptions> w{
      optim::AdamWOptions(2e-3).betas({0.8, 0.95}).eps(1e-6).weight_decay(0.05), {}, {}};
  w.small = optim::AdamWOptions(3e-3).betas({0.85, 0.99}).eps(1e-4).weight_decay(0.0);
  w.head = optim::AdamWOptions(5e-4).betas({0.7, 0.9}).eps(1e-3).weight_decay(0.2);
  expect_misses("L2 weight decay (AdamW's decoupled instead)", ref, w);
}

// ---- SGD: momentum (0 in one group), dampening (from the second step on), Nesterov, L2 decay

Recipe<optim::SGDOptions> sgd_setup() {
  Recipe<optim::SGDOptions> s{
      optim::SGDOptions(0.05).momentum(0.9).dampening(0.3).weight_decay(0.01), {}, {}};
  s.small = optim::SGDOptions(0.1).momentum(0.8).nesterov(true).weight_decay(0.002);
  s.head = optim::SGDOptions(0.02).momentum(0.0).dampening(0.5).weight_decay(0.05);
  return s;
}

TEST(TorchOptimizerOptions, SgdOptionsPerGroupMatchTorchSgd) {
  const auto s = sgd_setup();
  const auto ref = torch_run<optim::SGD>(s);
  expect_matches("SGD", ref, s);
  {
    auto d = s;
    d.defaults.dampening(0.0);
    expect_misses("the defaults' dampening", ref, d);
  }
  {
    auto d = s;
    d.small->nesterov(false);
    expect_misses("group 1's nesterov", ref, d);
  }
  {
    auto d = s;
    d.small->momentum(0.9);
    expect_misses("group 1's momentum (the defaults' instead)", ref, d);
  }
  {
    auto d = s;
    d.head->momentum(0.9);
    expect_misses("group 2's momentum 0 (0.9 instead)", ref, d);
  }
  {
    auto d = s;
    d.defaults.weight_decay(0.0);
    expect_misses("the defaults' weight_decay", ref, d);
  }
}

// ---- Adagrad: eps and L2 weight decay per group (lr_decay and the initial accumulator: refused)
// The defaults' eps stays well above the gradients' rounding noise: N ranks sum a gradient in
// another order than one rank, and Adagrad divides by sqrt(sum) + eps, so with eps 1e-6 an element
// whose gradient cancels to ~1e-10 moves by lr 1e-4 on the noise alone (3.8e-6 relative at N = 2,
// against 4.8e-7 with eps 1e-4).

Recipe<optim::AdagradOptions> adagrad_setup() {
  Recipe<optim::AdagradOptions> s{optim::AdagradOptions(0.02).eps(1e-4).weight_decay(0.01), {}, {}};
  s.small = optim::AdagradOptions(0.04).eps(1e-3).weight_decay(0.0);
  s.head = optim::AdagradOptions(0.008).eps(1e-10).weight_decay(0.1);
  return s;
}

TEST(TorchOptimizerOptions, AdagradOptionsPerGroupMatchTorchAdagrad) {
  const auto s = adagrad_setup();
  const auto ref = torch_run<optim::Adagrad>(s);
  expect_matches("Adagrad", ref, s);
  {
    auto d = s;
    d.small->eps(1e-10);
    expect_misses("group 1's eps", ref, d);
  }
  {
    auto d = s;
    d.defaults.weight_decay(0.0);
    expect_misses("the defaults' weight_decay", ref, d);
  }
  {
    auto d = s;
    d.head.reset();
    expect_misses("group 2's options", ref, d);
  }
}

// ---- what the engine cannot step: each refused, naming the option and the group

template <typename Options>
void expect_refused(const Recipe<Options>& s, const std::vector<std::string>& needles) {
  ct::Model model = make_model(test_dims());
  const Config cfg = stage_config(2);
  ThreadGroup::run(1, [&](Communicator& comm) {
    for (const std::string& n : needles) {
      expect_error(
          [&] { zero::torch::Optimizer opt(comm, *model, groups_of(model, s), s.defaults, cfg); },
          ErrorCode::kConfig, n);
    }
  });
}

TEST(TorchOptimizerOptions, WhatTheEngineCannotStepIsRefusedNamingOptionAndGroup) {
  {
    auto s = adam_setup();
    s.head->amsgrad(true);
    expect_refused(s, {"parameter group 2's options", "AdamOptions::amsgrad = true"});
  }
  {
    Recipe<optim::AdamWOptions> s{optim::AdamWOptions(1e-3).amsgrad(true), {}, {}};
    expect_refused(s, {"the default options", "AdamWOptions::amsgrad = true"});
  }
  {
    auto s = adagrad_setup();
    s.small->lr_decay(0.01);
    expect_refused(s, {"parameter group 1's options", "AdagradOptions::lr_decay = 0.01"});
  }
  {
    auto s = adagrad_setup();
    s.defaults.initial_accumulator_value(0.1);
    expect_refused(s, {"the default options", "AdagradOptions::initial_accumulator_value = 0.1"});
  }
  {
    // Momentum buffers are laid out by the defaults: none here, so a group cannot have one.
    auto s = sgd_setup();
    s.defaults.momentum(0.0).dampening(0.0);
    expect_refused(s, {"parameter group 1's options", "SGDOptions::momentum = 0.8",
                       "default options' momentum is 0"});
  }
  {
    // torch checks Nesterov's requirements in the defaults only; the engine in every group.
    auto s = sgd_setup();
    s.small->dampening(0.1);
    expect_refused(s, {"parameter group 1's options (SGDOptions)", "nesterov",
                       "requires momentum > 0 and dampening = 0"});
  }
  {
    auto s = sgd_setup();
    s.defaults.dampening(1.5);
    expect_refused(s, {"the default options (SGDOptions)", "dampening = 1.5"});
  }
  {
    auto s = adam_setup();
    s.small->betas({0.9, 1.0});
    expect_refused(s, {"parameter group 1's options (AdamOptions)", "betas[1] = 1"});
  }
}

}  // namespace
}  // namespace zero::testing
