// torch/param_groups.cpp — the trainer's torch::optim set-up (its param_groups and default
// options) as the engine's parameter groups (zero/optim/optimizer.hpp ParamGroup) and optimizer
// block.
//
// torch's options carry every field (a group without options takes the defaults), so a group
// with options sets all of its rule's options; the engine's group 0 is the defaults. Semantics
// kept (LibTorch 1.13's torch/csrc/api/src/optim/{adam,adamw,sgd,adagrad}.cpp): AdamWOptions is
// AdamW (decoupled decay); AdamOptions' weight_decay is L2 (the engine's Adam with adam_w_mode =
// false); SGDOptions' weight_decay is L2 as the engine's SGD, a group's momentum 0 steps without
// the buffer; Adagrad's weight_decay is L2. What the engine cannot step is an error naming the
// option and the group: amsgrad, Adagrad's lr_decay and initial_accumulator_value, a group with
// SGD momentum over defaults without it (the buffers are sized by group 0), and any value out of
// the engine's range (OptimizerParams::validate).
#include <algorithm>
#include <cmath>
#include <string>

#include "torch/optimizer_impl.hpp"
#include "zero/core/error.hpp"

namespace zero::torch {
namespace {

namespace optim = ::torch::optim;

// One torch options object as the engine's optimizer block fields.
struct Translated {
  std::string type;
  ParamGroup group;  // every field the rule reads set
  bool adam_w_mode = true;
};

const char* options_name(const std::string& type) {
  if (type == "AdamW") return "AdamWOptions";
  if (type == "Adam") return "AdamOptions";
  if (type == "SGD") return "SGDOptions";
  return "AdagradOptions";
}

// `who`: "the default options" or "parameter group <k>'s options", for messages.
Translated translate(const optim::OptimizerOptions& o, const std::string& who) {
  Translated t;
  ParamGroup& g = t.group;
  auto adam = [&](const auto& a, const char* type, bool decoupled) {
    ZERO_CHECK(!a.amsgrad(), kConfig, "zero::torch: ", who, " set ", type,
               "Options::amsgrad = true: the engine's Adam keeps no maximum of the second "
               "moments (AMSGrad); use amsgrad = false");
    t.type = type;
    t.adam_w_mode = decoupled;
    g.lr = a.lr();
    g.beta1 = std::get<0>(a.betas());
    g.beta2 = std::get<1>(a.betas());
    g.eps = a.eps();
    g.weight_decay = a.weight_decay();
  };
  if (const auto* w = dynamic_cast<const optim::AdamWOptions*>(&o)) {
    adam(*w, "AdamW", true);
  } else if (const auto* a = dynamic_cast<const optim::AdamOptions*>(&o)) {
    adam(*a, "Adam", false);  // torch's Adam: weight_decay is added to the gradient (L2)
  } else if (const auto* s = dynamic_cast<const optim::SGDOptions*>(&o)) {
    t.type = "SGD";
    g.lr = s->lr();
    g.momentum = s->momentum();
    g.dampening = s->dampening();
    g.nesterov = s->nesterov();
    g.weight_decay = s->weight_decay();
  } else if (const auto* ad = dynamic_cast<const optim::AdagradOptions*>(&o)) {
    // torch: clr = lr / (1 + (step - 1) lr_decay), the sum starts at initial_accumulator_value.
    ZERO_CHECK(ad->lr_decay() == 0.0, kConfig, "zero::torch: ", who,
               " set AdagradOptions::lr_decay = ", ad->lr_decay(),
               ": the engine's Adagrad steps with the group's lr (no lr / (1 + (step - 1) "
               "lr_decay)); use lr_decay = 0, and the config's scheduler for a decaying lr");
    ZERO_CHECK(ad->initial_accumulator_value() == 0.0, kConfig, "zero::torch: ", who,
               " set AdagradOptions::initial_accumulator_value = ", ad->initial_accumulator_value(),
               ": the engine's Adagrad starts every sum of squared gradients at 0; use 0");
    t.type = "Adagrad";
    g.lr = ad->lr();
    g.eps = ad->eps();
    g.weight_decay = ad->weight_decay();
  } else {
    ZERO_THROW(kConfig, "zero::torch: ", who,
               " are not AdamWOptions, AdamOptions, SGDOptions or AdagradOptions (the rules the "
               "engine steps)");
  }
  // The engine's ranges (a dampening outside [0, 1], Nesterov without momentum or with
  // dampening, ...), named as the trainer wrote them: torch checks only the defaults.
  OptimizerParams p;
  p.type = parse_optimizer_type(t.type);
  p.adam_w_mode = t.adam_w_mode;
  p.lr = *g.lr;
  p.weight_decay = *g.weight_decay;
  if (g.beta1) p.beta1 = *g.beta1;
  if (g.beta2) p.beta2 = *g.beta2;
  if (g.eps) p.eps = *g.eps;
  if (g.momentum) p.momentum = *g.momentum;
  if (g.dampening) p.dampening = *g.dampening;
  if (g.nesterov) p.nesterov = *g.nesterov;
  try {
    p.validate();
  } catch (const Error& e) {
    ZERO_THROW(kConfig, "zero::torch: ", who, " (", options_name(t.type), "): ", e.message());
  }
  return t;
}

// The config's optimizer block with the trainer's defaults; a key the config gave with another
// value is an error naming both.
OptimizerConfig merged(const OptimizerConfig& config, const Translated& d,
                       const std::string& options_type) {
  OptimizerConfig o = config;
  auto same = [&](const char* key, double have, double want, const char* field) {
    if (!config.given.contains(key)) return;
    ZERO_CHECK(std::abs(have - want) <= 1e-12 * std::max(1.0, std::abs(want)), kConfig,
               "config key 'optimizer.params.", key, "' = ", have, " but the trainer's ",
               options_type, "::", field, " = ", want,
               ": give it one way (the options the trainer passes are used when the config leaves "
               "the key out)");
  };
  if (config.given.contains("type")) {
    ZERO_CHECK(config.type == d.type, kConfig, "config key 'optimizer.type' = \"", config.type,
               "\" but the trainer passes ", options_type, " (", d.type,
               "): give the optimizer one way");
  }
  const ParamGroup& g = d.group;
  o.type = d.type;
  o.adam_w_mode = d.adam_w_mode;
  if (d.type == "Adam") {
    ZERO_CHECK(!config.given.contains("adam_w_mode") || !config.adam_w_mode, kConfig,
               "config key 'optimizer.params.adam_w_mode' = true but the trainer passes "
               "AdamOptions, whose weight_decay is L2 (torch::optim::Adam); use AdamWOptions "
               "for decoupled decay");
  }
  same("lr", config.lr, *g.lr, "lr");
  o.lr = *g.lr;
  same("weight_decay", config.weight_decay, *g.weight_decay, "weight_decay");
  o.weight_decay = *g.weight_decay;
  if (g.beta1) {
    if (config.given.contains("betas")) {
      same("betas", config.betas[0], *g.beta1, "betas[0]");
      same("betas", config.betas[1], *g.beta2, "betas[1]");
    }
    o.betas = {*g.beta1, *g.beta2};
  }
  if (g.eps) {
    same("eps", config.eps, *g.eps, "eps");
    o.eps = *g.eps;
  }
  if (g.momentum) {
    same("momentum", config.momentum, *g.momentum, "momentum");
    same("dampening", config.dampening, *g.dampening, "dampening");
    o.momentum = *g.momentum;
    o.dampening = *g.dampening;
    o.nesterov = *g.nesterov;
  }
  return o;
}

}  // namespace

EngineGroups engine_groups(const std::vector<optim::OptimizerParamGroup>& groups,
                           const optim::OptimizerOptions* defaults, const Config& config) {
  EngineGroups out{config, {}, {}};
  std::string type = config.optimizer.type;
  if (defaults != nullptr) {
    const Translated d = translate(*defaults, "the default options");
    out.config.optimizer = merged(config.optimizer, d, options_name(d.type));
    type = d.type;
  }
  for (std::size_t k = 0; k < groups.size(); ++k) {
    const optim::OptimizerParamGroup& pg = groups[k];
    int id = 0;
    if (pg.has_options()) {
      const std::string who = "parameter group " + std::to_string(k) + "'s options";
      Translated t = translate(pg.options(), who);
      ZERO_CHECK(t.type == type, kConfig, "zero::torch: ", who, " are ", options_name(t.type),
                 " but the optimizer is ", type,
                 " (one rule for every group, as one torch::optim optimizer)");
      // SGD's momentum buffers are laid out when group 0 (the defaults) has momentum: a group
      // may step without one (momentum 0), not with one the layout does not hold.
      const double base_momentum = out.config.optimizer.momentum;
      ZERO_CHECK(t.type != "SGD" || *t.group.momentum == 0.0 || base_momentum > 0.0, kConfig,
                 "zero::torch: ", who, " set SGDOptions::momentum = ", *t.group.momentum,
                 " but the ", defaults != nullptr ? "default options'" : "config's optimizer",
                 " momentum is ", base_momentum,
                 ": the engine keeps momentum buffers for every group when the defaults have "
                 "momentum, for none otherwise; give the defaults a momentum > 0 (a group with "
                 "momentum 0 then steps without it, as torch::optim::SGD does)");
      t.group.name = "group." + std::to_string(k);
      out.groups.push_back(std::move(t.group));
      id = static_cast<int>(out.groups.size());
    }
    for (const at::Tensor& p : pg.params()) out.group_of.emplace(p.unsafeGetTensorImpl(), id);
  }
  return out;
}

}  // namespace zero::torch
