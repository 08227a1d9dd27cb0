// The models zero-plan plans for (plan/plan_model.hpp).
#include "plan/plan_model.hpp"

#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "gpt/gpt_cost.hpp"
#include "gpt/gpt_fit.hpp"
#include "zero/core/error.hpp"
#include "zero/engine/activation_checkpointing.hpp"

namespace zero::plan {

using json = nlohmann::json;

TrainerModel gpt_trainer(const gpt::GptConfig& g, int rows, const Config& base) {
  // The units do not change with the stage or the tiers: declared once (an engine per candidate
  // would cost more than its plan).
  auto units = std::make_shared<std::vector<UnitSpec>>(gpt::model_units(g, base));
  TrainerModel t;
  t.plan_input = [g, units](const Config& c) {
    PlanInput pin;
    pin.units = *units;
    pin.ranks = 1;  // the chooser sets the world
    pin.config = c;
    pin.gather_order =
        gpt::GptModel::gather_order(g, CheckpointSpec::from_config(c.activation_checkpointing));
    pin.grads_held = gpt::GptModel::grads_held(g);
    return pin;
  };
  auto tracker = std::make_shared<MemoryTracker>();
  auto model = std::make_shared<gpt::GptModel>(g, *tracker);
  t.trainer_bytes = [g, rows, model, tracker](const Config& c) {
    const CheckpointSpec spec = CheckpointSpec::from_config(c.activation_checkpointing);
    return model->activation_bytes(rows, g.seq, spec) + model->workspace_bytes(rows, g.seq);
  };
  t.flops = [g, rows](const Config& c) {
    const CheckpointSpec spec = CheckpointSpec::from_config(c.activation_checkpointing);
    return static_cast<double>(rows) * g.seq * gpt::step_flops_per_token(g, spec);
  };
  return t;
}

namespace {

[[noreturn]] void bad(const std::string& file, const std::string& key, const json& v,
                      const std::string& why) {
  ZERO_THROW(kConfig, "units file ", file, ": ", key, " = ", v.dump(), ": ", why);
}

void only(const std::string& file, const std::string& key, const json& obj,
          const std::set<std::string>& allowed) {
  if (!obj.is_object()) bad(file, key, obj, "expected an object");
  for (const auto& [k, v] : obj.items()) {
    if (allowed.count(k) == 0) bad(file, key.empty() ? k : key + "." + k, v, "unknown key");
  }
}

}  // namespace

TrainerModel units_trainer(const std::string& path) {
  std::ifstream in(path);
  ZERO_CHECK(in.good(), kIO, "units file: cannot read '", path, "'");
  std::ostringstream s;
  s << in.rdbuf();
  json j;
  try {
    j = json::parse(s.str());
  } catch (const json::exception& e) {
    ZERO_THROW(kConfig, "units file ", path, ": not JSON: ", e.what());
  }
  only(path, "", j, {"units", "activation_bytes", "flops_per_micro_step", "tokens_per_micro_step"});
  if (!j.contains("units") || !j["units"].is_array() || j["units"].empty()) {
    bad(path, "units", j.value("units", json()), "expected a non-empty array");
  }
  std::vector<UnitSpec> units;
  double params = 0;
  for (std::size_t u = 0; u < j["units"].size(); ++u) {
    const std::string key = "units[" + std::to_string(u) + "]";
    const json& ju = j["units"][u];
    only(path, key, ju, {"name", "params"});
    if (!ju.contains("name") || !ju["name"].is_string()) {
      bad(path, key + ".name", ju.value("name", json()), "expected a string");
    }
    if (!ju.contains("params") || !ju["params"].is_array() || ju["params"].empty()) {
      bad(path, key + ".params", ju.value("params", json()), "expected a non-empty array");
    }
    UnitSpec spec{.name = ju["name"].get<std::string>(), .params = {}};
    for (std::size_t k = 0; k < ju["params"].size(); ++k) {
      const std::string pk = key + ".params[" + std::to_string(k) + "]";
      const json& jp = ju["params"][k];
      only(path, pk, jp, {"name", "shape", "trainable"});
      ParamSpec p;
      if (!jp.contains("name") || !jp["name"].is_string()) {
        bad(path, pk + ".name", jp.value("name", json()), "expected a string");
      }
      p.name = jp["name"].get<std::string>();
      if (!jp.contains("shape") || !jp["shape"].is_array() || jp["shape"].empty()) {
        bad(path, pk + ".shape", jp.value("shape", json()), "expected an array of extents");
      }
      for (const json& e : jp["shape"]) {
        if (!e.is_number_integer() || e.get<std::int64_t>() < 1) {
          bad(path, pk + ".shape", jp["shape"], "every extent an integer >= 1");
        }
        p.shape.push_back(e.get<std::int64_t>());
      }
      if (jp.contains("trainable")) {
        if (!jp["trainable"].is_boolean()) bad(path, pk + ".trainable", jp["trainable"], "bool");
        p.trainable = jp["trainable"].get<bool>();
      }
      params += static_cast<double>(p.numel());
      spec.params.push_back(std::move(p));
    }
    units.push_back(std::move(spec));
  }
  auto number = [&](const char* key) -> double {
    if (!j.contains(key)) return 0;
    if (!j[key].is_number() || j[key].get<double>() < 0) bad(path, key, j[key], "a number >= 0");
    return j[key].get<double>();
  };
  const auto act = static_cast<std::size_t>(number("activation_bytes"));
  const double flops = number("flops_per_micro_step");
  if (flops == 0)
    return units_model(std::move(units), act, 6.0 * params * number("tokens_per_micro_step"));
  return units_model(std::move(units), act, flops);
}

TrainerModel units_model(std::vector<UnitSpec> units, std::size_t activation_bytes, double flops) {
  auto shared = std::make_shared<std::vector<UnitSpec>>(std::move(units));
  TrainerModel t;
  t.plan_input = [shared](const Config& c) {
    PlanInput pin;
    pin.units = *shared;
    pin.config = c;
    return pin;
  };
  t.trainer_bytes = [activation_bytes](const Config&) { return activation_bytes; };
  t.flops = [flops](const Config&) { return flops; };
  return t;
}

TrainerModel safetensors_trainer(const std::string& path, const std::string& unit_pattern,
                                 std::size_t activation_bytes, double tokens) {
  std::vector<UnitSpec> units = units_from_safetensors(path, unit_pattern);
  double params = 0;
  for (const UnitSpec& u : units) {
    for (const ParamSpec& p : u.params) params += static_cast<double>(p.numel());
  }
  return units_model(std::move(units), activation_bytes, 6.0 * params * tokens);
}

}  // namespace zero::plan
