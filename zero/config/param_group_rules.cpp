// zero/config/param_group_rules.cpp — the config's parameter-group rules
// (optimizer.param_groups, a zero extension): which parameters a group takes (by name, by
// number of dimensions) and the options it sets over the optimizer block's, read and validated
// here; the engine assigns the parameters (zero/param_groups.cpp).
#include <cmath>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>

#include "zero/config.hpp"
#include "zero/config/config_reader.hpp"
#include "zero/error.hpp"
#include "zero/optimizer.hpp"

namespace zero::detail {
namespace {

using nlohmann::json;

[[noreturn]] void fail(const std::string& key, const json& v, const std::string& why) {
  ZERO_THROW(kConfig, "config key '", key, "' = ", v.dump(), ": ", why);
}

// Reads a number in [lo, hi] into `out`.
void number(const json& obj, const std::string& path, const char* key, double lo, double hi,
            std::optional<double>& out) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return;
  if (!it->is_number() || !(it->get<double>() >= lo && it->get<double>() <= hi)) {
    fail(path + "." + key, *it,
         std::isinf(hi) ? "must be a finite number >= " + json(lo).dump()
                        : "must be a number in [" + json(lo).dump() + ", " + json(hi).dump() + "]");
  }
  out = it->get<double>();
}

void only(const json& obj, const std::string& path, std::initializer_list<const char*> keys) {
  for (const auto& [k, v] : obj.items()) {
    bool known = false;
    for (const char* want : keys) known = known || k == want;
    if (!known) fail(path + "." + k, v, "unknown key here");
  }
}

}  // namespace

std::vector<ParamGroupRule> read_param_group_rules(const json& v, const std::string& path) {
  if (!v.is_array()) fail(path, v, "must be an array of groups");
  std::vector<ParamGroupRule> rules;
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::string at = path + "[" + std::to_string(i) + "]";
    const json& g = v[i];
    if (!g.is_object()) fail(at, g, "must be an object (name, match, params)");
    only(g, at, {"name", "match", "params"});
    ParamGroupRule r;
    const auto name = g.find("name");
    if (name == g.end() || !name->is_string() || name->get<std::string>().empty()) {
      fail(at + ".name", name == g.end() ? json() : *name, "must be a non-empty string");
    }
    r.group.name = name->get<std::string>();
    for (const ParamGroupRule& before : rules) {
      if (before.group.name == r.group.name)
        fail(at + ".name", *name, "a group of that name is above");
    }
    const auto match = g.find("match");
    if (match == g.end() || !match->is_object() || match->empty()) {
      fail(at + ".match", match == g.end() ? json() : *match,
           "must say which parameters: {\"names\": [...], \"max_dims\": k}");
    }
    only(*match, at + ".match", {"names", "max_dims"});
    if (const auto n = match->find("names"); n != match->end()) {
      if (!n->is_array()) fail(at + ".match.names", *n, "must be an array of strings");
      for (const json& s : *n) {
        if (!s.is_string() || s.get<std::string>().empty()) {
          fail(at + ".match.names", *n, "every entry must be a non-empty string");
        }
        r.names.push_back(s.get<std::string>());
      }
    }
    if (const auto d = match->find("max_dims"); d != match->end()) {
      if (!d->is_number_integer() || d->get<int>() < 0) {
        fail(at + ".match.max_dims", *d, "must be an integer >= 0");
      }
      r.max_dims = d->get<int>();
    }
    if (const auto p = g.find("params"); p != g.end()) {
      const std::string pp = at + ".params";
      if (!p->is_object()) fail(pp, *p, "must be an object of optimizer options");
      only(*p, pp,
           {"lr", "betas", "eps", "weight_decay", "momentum", "dampening", "nesterov",
            "bias_correction"});
      constexpr double kInf = std::numeric_limits<double>::infinity();
      number(*p, pp, "lr", 0.0, kInf, r.group.lr);
      number(*p, pp, "eps", 0.0, 1.0, r.group.eps);
      number(*p, pp, "weight_decay", 0.0, kInf, r.group.weight_decay);
      number(*p, pp, "momentum", 0.0, 1.0, r.group.momentum);
      number(*p, pp, "dampening", 0.0, 1.0, r.group.dampening);
      if (const auto b = p->find("betas"); b != p->end()) {
        if (!b->is_array() || b->size() != 2 || !(*b)[0].is_number() || !(*b)[1].is_number() ||
            !((*b)[0].get<double>() >= 0.0 && (*b)[0].get<double>() <= 1.0) ||
            !((*b)[1].get<double>() >= 0.0 && (*b)[1].get<double>() < 1.0)) {
          fail(pp + ".betas", *b, "must be two numbers in [0, 1)");
        }
        r.group.beta1 = (*b)[0].get<double>();
        r.group.beta2 = (*b)[1].get<double>();
      }
      for (const char* k : {"nesterov", "bias_correction"}) {
        if (const auto x = p->find(k); x != p->end()) {
          if (!x->is_boolean()) fail(pp + "." + k, *x, "must be true or false");
          (std::string(k) == "nesterov" ? r.group.nesterov : r.group.bias_correction) =
              x->get<bool>();
        }
      }
    }
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
