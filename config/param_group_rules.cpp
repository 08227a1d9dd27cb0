// config/param_group_rules.cpp — the config's parameter-group rules
// (optimizer.param_groups, a zero extension): which parameters a group takes (by name, by
// number of dimensions) and the options it sets over the optimizer block's, read here through
// the config's Reader (types, ranges and unknown keys checked there, each error naming
// "optimizer.param_groups[i].<key>"); the engine assigns the parameters (engine/param_groups.cpp).
#include <limits>
#include <string>
#include <vector>

#include "config/config_reader.hpp"
#include "zero/config/config.hpp"
#include "zero/optim/optimizer.hpp"

namespace zero::detail {

using nlohmann::json;

std::vector<ParamGroupRule> read_param_group_rules(Reader& optimizer) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<ParamGroupRule> rules;
  const std::size_t n = optimizer.array_size("param_groups", "must be an array of groups");
  for (std::size_t i = 0; i < n; ++i) {
    Reader g = optimizer.element("param_groups", i, "must be an object (name, match, params)");
    ParamGroupRule r;
    g.get("name", r.group.name);
    if (r.group.name.empty()) g.fail_msg("name", "must be a non-empty string");
    for (const ParamGroupRule& before : rules) {
      if (before.group.name == r.group.name) {
        g.fail("name", r.group.name, "a group of that name is above");
      }
    }
    if (const json* m = g.find("match", false); m == nullptr || !m->is_object() || m->empty()) {
      g.fail("match", m == nullptr ? json() : *m,
             "must say which parameters: {\"names\": [...], \"max_dims\": k}");
    }
    Reader match = g.sub("match");
    match.get("names", r.names);
    match.get_int("max_dims", r.max_dims, 0, std::numeric_limits<int>::max());
    match.finish();
    if (const json* p = g.find("params", false); p != nullptr && !p->is_object()) {
      g.fail("params", *p, "must be an object of optimizer options");
    }
    Reader p = g.sub("params");
    ParamGroup& o = r.group;
    p.get_num("lr", o.lr, 0.0, kInf);
    p.get_num("eps", o.eps, 0.0, 1.0);
    p.get_num("weight_decay", o.weight_decay, 0.0, kInf);
    p.get_num("momentum", o.momentum, 0.0, 1.0);
    p.get_num("dampening", o.dampening, 0.0, 1.0);
    if (const json* b = p.find("betas")) {
      if (!b->is_array() || b->size() != 2 || !(*b)[0].is_number() || !(*b)[1].is_number() ||
          !((*b)[0].get<double>() >= 0.0 && (*b)[0].get<double>() < 1.0) ||
          !((*b)[1].get<double>() >= 0.0 && (*b)[1].get<double>() < 1.0)) {
        p.fail("betas", *b, "must be two numbers in [0, 1)");
      }
      o.beta1 = (*b)[0].get<double>();
      o.beta2 = (*b)[1].get<double>();
    }
    p.get("nesterov", o.nesterov);
    p.get("bias_correction", o.bias_correction);
    p.finish();
    g.finish();
    rules.push_back(std::move(r));
  }
  return rules;
}

json param_group_rules_json(const std::vector<ParamGroupRule>& rules) {
  json out = json::array();
  for (const ParamGroupRule& r : rules) {
    json match = json::object();
    if (!r.names.empty()) match["names"] = r.names;
    if (r.max_dims >= 0) match["max_dims"] = r.max_dims;
    json params = json::object();
    const ParamGroup& g = r.group;
    if (g.lr) params["lr"] = *g.lr;
    if (g.beta1) params["betas"] = {*g.beta1, g.beta2.value_or(0.999)};
    if (g.eps) params["eps"] = *g.eps;
    if (g.weight_decay) params["weight_decay"] = *g.weight_decay;
    if (g.momentum) params["momentum"] = *g.momentum;
    if (g.dampening) params["dampening"] = *g.dampening;
    if (g.nesterov) params["nesterov"] = *g.nesterov;
    if (g.bias_correction) params["bias_correction"] = *g.bias_correction;
    out.push_back({{"name", g.name}, {"match", match}, {"params", params}});
  }
  return out;
}

}  // namespace zero::detail

namespace zero {

bool ParamGroupRule::matches(const std::string& name, std::size_t dims) const {
  if (max_dims >= 0 && dims <= static_cast<std::size_t>(max_dims)) return true;
  for (const std::string& n : names) {
    if (name.find(n) != std::string::npos) return true;
  }
  return false;
}

}  // namespace zero
