// The engine's parameter groups: EngineOptions::param_groups and then the config's rules
// (optimizer.param_groups) resolved over the config's optimizer block (group 0); the rules'
// parameters assigned at lay-out; attach mode's element ranges handed to the placement, which
// cuts every stepped range into runs of one group (engine/placement.hpp GroupRun).
#include <set>
#include <string>

#include "engine/engine_impl.hpp"
#include "zero/core/log.hpp"

namespace zero {

void Engine::Impl::make_groups() {
  group_params = {oparams};
  std::set<std::string> names;
  for (std::size_t k = 0; k < opts.param_groups.size(); ++k) {
    const ParamGroup& g = opts.param_groups[k];
    ZERO_CHECK(names.insert(g.name).second, kInvalidArgument, "parameter group ", k + 1, " '",
               g.name, "': a group of that name was added before it");
    group_params.push_back(g.apply(oparams));
    if (g.lr.has_value() && !schedule.scales_group_lr()) {
      ZERO_LOG(kWarn, "parameter group '", g.name, "' sets lr = ", *g.lr, " but scheduler ",
               to_string(schedule.type()),
               " sets the same lr on every group (DeepSpeed's meaning: its warmup / cycle lr "
               "keys are absolute); the group's lr is not used. WarmupCosineLR scales each "
               "group's own lr.");
    }
  }
  // The config's rules (optimizer.param_groups) after the trainer's own groups.
  first_rule_group = static_cast<int>(group_params.size());
  for (const ParamGroupRule& r : cfg.optimizer.param_groups) {
    ZERO_CHECK(names.insert(r.group.name).second, kConfig,
               "config key 'optimizer.param_groups': "
               "group '",
               r.group.name, "' has the name of a group the trainer added");
    try {
      group_params.push_back(r.group.apply(oparams));
    } catch (const Error& e) {
      ZERO_THROW(kConfig, "config key 'optimizer.param_groups': ", e.message());
    }
  }
  input.num_groups = static_cast<int>(group_params.size());
  ZERO_CHECK(opts.attach_groups.empty() || ownership == detail::Ownership::kAttached,
             kInvalidArgument,
             "EngineOptions::attach_groups is for attach mode; a managed engine's parameters name "
             "their group (ParamSpec::group)");
  for (const EngineOptions::GroupRange& r : opts.attach_groups) {
    input.group_spans.push_back({0, r.begin, r.end, r.group});
  }
}

void Engine::Impl::assign_rule_groups(std::vector<UnitSpec>& units) const {
  const auto& rules = cfg.optimizer.param_groups;
  if (rules.empty()) return;
  for (UnitSpec& u : units)
    for (ParamSpec& p : u.params) {
      if (p.group != 0) continue;  // the trainer's choice
      for (std::size_t k = 0; k < rules.size(); ++k) {
        if (rules[k].matches(u.name + "." + p.name, p.shape.size())) {
          p.group = first_rule_group + static_cast<int>(k);
          break;
        }
      }
    }
}

}  // namespace zero
