// choose_config(): enumerate, plan, fit, time, rank (zero/choose.hpp).
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "zero/choose.hpp"
#include "zero/error.hpp"
#include "zero/memory_report.hpp"

namespace zero {

namespace {

std::string num(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.15g", x);
  return b;
}

// One combination of the space: its --set assignments and label.
struct Combo {
  std::vector<std::string> sets;
  std::string label;
};

void add(Combo& c, const std::string& key, const std::string& value) {
  c.sets.push_back(key + "=" + value);
}

std::vector<Combo> enumerate(const ChooseSpace& s, const World& w) {
  std::vector<Combo> out;
  std::vector<int> ckpts = {0};
  if (s.checkpoint_segments > 0) ckpts.push_back(s.checkpoint_segments);
  for (int stage : s.stages) {
    for (const std::string& opt : s.optimizer_offload) {
      if (opt == "nvme" && w.nvme_path.empty()) continue;
      const std::vector<double> ratios = opt == "cpu" ? s.cpu_ratios : std::vector<double>{1.0};
      for (double ratio : ratios) {
        const std::vector<std::string> params =
            stage == 3 ? s.param_offload : std::vector<std::string>{"none"};
        for (const std::string& par : params) {
          if (par == "nvme" && w.nvme_path.empty()) continue;
          const std::vector<std::int64_t> pre =
              stage == 3 ? s.prefetch : std::vector<std::int64_t>{-1};
          const std::vector<std::int64_t> per =
              stage == 3 ? s.persistence : std::vector<std::int64_t>{-1};
          for (const std::string& md : s.moment_dtypes) {
            for (std::int64_t bucket : s.buckets) {
              for (std::int64_t pf : pre) {
                for (std::int64_t pt : per) {
                  for (int ck : ckpts) {
                    Combo c;
                    add(c, "zero_optimization.stage", std::to_string(stage));
                    add(c, "zero_optimization.offload_optimizer.device", opt);
                    std::string label = "stage " + std::to_string(stage) + ", optimizer " + opt;
                    if (opt == "cpu") {
                      add(c, "zero_optimization.offload_optimizer.ratio", num(ratio));
                      if (ratio < 1) label += " " + num(ratio);
                    }
                    if (opt == "nvme") {
                      add(c, "zero_optimization.offload_optimizer.nvme_path", w.nvme_path);
                    }
                    if (stage == 3) {
                      add(c, "zero_optimization.offload_param.device", par);
                      if (par == "nvme") {
                        add(c, "zero_optimization.offload_param.nvme_path", w.nvme_path);
                      }
                      label += ", params " + par;
                    }
                    add(c, "optimizer.params.moment_dtype", md);
                    label += ", " + md + " moments";
                    add(c, "zero_optimization.reduce_bucket_size", std::to_string(bucket));
                    add(c, "zero_optimization.allgather_bucket_size", std::to_string(bucket));
                    label += bucket == 0 ? ", bucket/unit" : ", buckets " + num(bucket);
                    if (stage == 3) {
                      add(c, "zero_optimization.stage3_prefetch_bucket_size", std::to_string(pf));
                      add(c, "zero_optimization.stage3_param_persistence_threshold",
                          std::to_string(pt));
                      label += ", prefetch " + num(pf) + ", persist " + num(pt);
                    }
                    add(c, "activation_checkpointing.number_checkpoints", std::to_string(ck));
                    label += ck > 0 ? ", checkpointing " + std::to_string(ck) : "";
                    c.label = label;
                    out.push_back(std::move(c));
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  return out;
}

// The budget less the margin (0 stays "not limited").
MemoryBudget budget_of(const World& w, double margin) {
  auto less = [&](std::size_t b) {
    return static_cast<std::size_t>(static_cast<double>(b) * (1.0 - margin));
  };
  MemoryBudget b;
  const std::string m = margin > 0 ? " less a " + num(100 * margin) + "% margin" : "";
  b.host = less(w.host_bytes);
  b.host_from = "host memory per node " + format_bytes(w.host_bytes) + m;
  b.device = w.device_is_host ? 0 : less(w.device_bytes);
  b.device_from = "device memory per rank " + format_bytes(w.device_bytes) + m;
  b.nvme = less(w.nvme_bytes);
  b.nvme_from = "NVMe " + format_bytes(w.nvme_bytes) + m;
  return b;
}

// Per-rank device need for the device budget (fit_need sums the ranks of the node).
void fit(Candidate& c, const World& w, const MemoryBudget& b) {
  c.need = fit_need(c.plan, w.local(), c.trainer_bytes, w.device_is_host);
  FitNeed per_tier = c.need;
  if (!w.device_is_host) per_tier.device /= static_cast<std::size_t>(w.local());  // per rank
  c.shortfall = fit_shortfall(per_tier, b);
  auto worst = [&](std::size_t need, std::size_t has) {
    if (has > 0 && need > has && need - has > c.worst_short) {
      c.worst_short = need - has;
      c.worst_budget = has;
    }
  };
  worst(per_tier.host, b.host);
  worst(per_tier.device, b.device);
  worst(per_tier.nvme, b.nvme);
}

}  // namespace

std::string config_document(const std::string& base_json, const std::vector<std::string>& sets) {
  ZERO_CHECK(nlohmann::ordered_json::accept(base_json), kConfig, "config: not JSON: ", base_json);
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(base_json);
  ZERO_CHECK(j.is_object(), kConfig, "config: not a JSON object: ", base_json);
  for (const std::string& s : sets) {
    const std::size_t eq = s.find('=');
    const std::string path = s.substr(0, eq), value = s.substr(eq + 1);
    nlohmann::ordered_json* at = &j;
    for (std::size_t a = 0, b; a <= path.size(); a = b + 1) {
      b = path.find('.', a);
      if (b == std::string::npos) b = path.size();
      at = &(*at)[path.substr(a, b - a)];
    }
    *at = nlohmann::ordered_json::accept(value) ? nlohmann::ordered_json::parse(value)
                                                : nlohmann::ordered_json(value);
  }
  return j.dump(2) + "\n";
}

Choice choose_config(const TrainerModel& trainer, const std::string& base_json, const World& world,
                     const MachineProfile& profile, const ChooseSpace& space, double margin) {
  ZERO_CHECK(trainer.plan_input && trainer.trainer_bytes && trainer.flops, kInvalidArgument,
             "choose_config: the trainer's plan_input, trainer_bytes and flops are required");
  ZERO_CHECK(margin >= 0 && margin < 1, kInvalidArgument, "choose_config: margin ", margin,
             " not in [0, 1)");
  ZERO_CHECK(world.ranks >= 1 && world.local() >= 1 && world.local() <= world.ranks,
             kInvalidArgument, "choose_config: ranks ", world.ranks, ", ranks per node ",
             world.local());
  Choice out;
  out.margin = margin;
  out.budget = budget_of(world, margin);
  (void)ConfigBuilder().merge_json(base_json, "the base config").build();  // valid on its own
  for (const Combo& combo : enumerate(space, world)) {
    Candidate c;
    c.label = combo.label;
    c.sets = combo.sets;
    PlanInput pin;
    try {
      ConfigBuilder b;
      b.merge_json(base_json, "the base config");
      for (const std::string& s : combo.sets) b.set(s, "zero-plan");
      c.config = b.build();
      c.json = config_document(base_json, combo.sets);
      pin = trainer.plan_input(c.config);
      pin.ranks = world.ranks;
      c.plan = plan_engine_memory(pin);
    } catch (const Error& e) {
      // A combination the reader or the placement refuses (kConfig / kInvalidArgument) is no
      // candidate; anything else is a real failure.
      if (e.code() != ErrorCode::kConfig && e.code() != ErrorCode::kInvalidArgument) throw;
      ++out.rejected;
      continue;
    }
    c.trainer_bytes = trainer.trainer_bytes(c.config);
    fit(c, world, out.budget);
    c.time = predict_step(c, pin, world, profile, trainer.flops(c.config), &c.untimed);
    out.candidates.push_back(std::move(c));
  }
  // Fitting and timed first, fastest first; then fitting but untimed; then the rest, least short
  // first. Ties keep the enumeration's order (the simpler configuration first).
  auto rank = [](const Candidate& c) { return !c.fits() ? 2 : (c.untimed.empty() ? 0 : 1); };
  std::stable_sort(out.candidates.begin(), out.candidates.end(),
                   [&](const Candidate& a, const Candidate& b) {
                     if (rank(a) != rank(b)) return rank(a) < rank(b);
                     if (rank(a) == 2) return a.worst_short < b.worst_short;
                     return a.time.total() < b.time.total();
                   });
  if (!out.candidates.empty() && out.candidates.front().fits()) out.chosen = 0;
  return out;
}

std::string Choice::why_lost(std::size_t i) const {
  const Candidate& c = candidates.at(i);
  if (!c.fits()) {
    return "does not fit by " + format_bytes(c.worst_short) + " of " +
           format_bytes(c.worst_budget) + " (" + c.shortfall + ")";
  }
  if (!c.untimed.empty()) return "fits, not timed: " + c.untimed;
  if (chosen < 0) return "fits";
  const double best = candidates[static_cast<std::size_t>(chosen)].time.total();
  const double d = c.time.total() - best;
  char b[96];
  std::snprintf(b, sizeof b, "fits, slower by %.3g s (+%.1f%%)", d, best > 0 ? 100 * d / best : 0);
  return b;
}

}  // namespace zero
