// zero/torch/param_groups.cpp — the trainer's torch::optim set-up (its param_groups and default
// options) as the engine's parameter groups (zero/optimizer.hpp ParamGroup) and optimizer block.
//
// torch's options carry every field (a group without options takes the defaults), so a group
// with options sets all of its rule's options; the engine's group 0 is the defaults. Semantics
// kept: AdamWOptions is AdamW (decoupled decay); AdamOptions' weight_decay is L2 (the engine's
// Adam with adam_w_mode = false); SGDOptions' weight_decay is L2 as the engine's SGD; Adagrad
// without lr_decay or an initial accumulator value.
#include <algorithm>
#include <cmath>
#include <string>

#include "zero/error.hpp"
#include "zero/torch/optimizer_impl.hpp"

namespace zero::torch {
namespace {

namespace optim = ::torch::optim;

// One torch options object as the engine's optimizer block fields.
struct Translated {
  std::string type;
  ParamGroup group;  // every field the rule reads set
  bool adam_w_mode = true;
};

Translated translate(const optim::OptimizerOptions& o, const std::string& who) {
  Translated t;
  ParamGroup& g = t.group;
  auto adam = [&](const auto& a, const char* type, bool decoupled) {
    ZERO_CHECK(!a.amsgrad(), kConfig, "zero::torch: ", who,
               " sets amsgrad: AMSGrad is not supported");
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
    ZERO_CHECK(ad->lr_decay() == 0.0 && ad->initial_accumulator_value() == 0.0, kConfig,
               "zero::torch: ", who, " sets lr_decay = ", ad->lr_decay(),
               " / initial_accumulator_value = ", ad->initial_accumulator_value(),
               ": the engine's Adagrad supports neither (both must be 0)");
    t.type = "Adagrad";
    g.lr = ad->lr();
    g.eps = ad->eps();
    g.weight_decay = ad->weight_decay();
  } else {
    ZERO_THROW(kConfig, "zero::torch: ", who,
               " are not AdamWOptions, AdamOptions, SGDOptions or AdagradOptions (the rules the "
               "engine steps)");
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

const char* options_name(const std::string& type) {
  if (type == "AdamW") return "AdamWOptions";
  if (type == "Adam") return "AdamOptions";
  if (type == "SGD") return "SGDOptions";
  return "AdagradOptions";
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
      t.group.name = "group." + std::to_string(k);
      out.groups.push_back(std::move(t.group));
      id = static_cast<int>(out.groups.size());
    }
    for (const at::Tensor& p : pg.params()) out.group_of.emplace(p.unsafeGetTensorImpl(), id);
  }
  return out;
}

}  // namespace zero::torch
