// The engine's parameter groups: EngineOptions::param_groups resolved over the config's
// optimizer block (group 0), and attach mode's element ranges handed to the placement, which
// cuts every stepped range into runs of one group (zero/placement.hpp GroupRun).
#include <set>
#include <string>

#include "zero/engine_impl.hpp"
#include "zero/log.hpp"

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
  input.num_groups = static_cast<int>(group_params.size());
  ZERO_CHECK(opts.attach_groups.empty() || ownership == detail::Ownership::kAttached,
             kInvalidArgument,
             "EngineOptions::attach_groups is for attach mode; a managed engine's parameters name "
             "their group (ParamSpec::group)");
  for (const EngineOptions::GroupRange& r : opts.attach_groups) {
    input.group_spans.push_back({0, r.begin, r.end, r.group});
  }
}

}  // namespace zero
