// choose_config(): enumerate, plan, fit, time, rank (zero/plan/choose.hpp).
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "zero/core/error.hpp"
#include "zero/device/memory_report.hpp"
#include "zero/plan/choose.hpp"

namespace zero {

namespace {

std::string num(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.15g", x);
  return b;
}

// One combination of the space (or one value of an axis): its --set assignments and label.
struct Combo {
  std::vector<std::string> sets;
  std::string label;
};
using Axis = std::vector<Combo>;

// Every combination of one value per axis, in order (the first axis varies slowest).
std::vector<Combo> product(const std::vector<Axis>& axes) {
  std::vector<Combo> out = {Combo{}};
  for (const Axis& axis : axes) {
    std::vector<Combo> next;
    for (const Combo& head : out) {
      for (const Combo& v : axis) {
        Combo c = head;
        c.sets.insert(c.sets.end(), v.sets.begin(), v.sets.end());
        c.label += v.label;
        next.push_back(std::move(c));
      }
    }
    out = std::move(next);
  }
  return out;
}

// Every --set key of the axes below but the optimizer's and activation checkpointing's is under
// this block.
const std::string kZ = "zero_optimization.";

// The optimizer's tier: offload none, cpu at each ratio, or nvme (only with a path).
Axis optimizer_axis(const ChooseSpace& s, const World& w) {
  const bool nvme = !w.nvme_path.empty();
  Axis opt;
  for (const std::string& o : s.optimizer_offload) {
    if (o == "cpu") {
      for (double r : s.cpu_ratios) {
        opt.push_back(
            {{kZ + "offload_optimizer.device=cpu", kZ + "offload_optimizer.ratio=" + num(r)},
             ", optimizer cpu" + (r < 1 ? " " + num(r) : std::string())});
      }
    } else if (o != "nvme" || nvme) {
      Combo c{{kZ + "offload_optimizer.device=" + o}, ", optimizer " + o};
      if (o == "nvme") c.sets.push_back(kZ + "offload_optimizer.nvme_path=" + w.nvme_path);
      opt.push_back(c);
    }
  }
  return opt;
}

// Stage 3's parameter tier: none, cpu, or nvme (only with a path).
Axis param_axis(const ChooseSpace& s, const World& w) {
  Axis par;
  for (const std::string& p : s.param_offload) {
    if (p == "nvme" && w.nvme_path.empty()) continue;
    Combo c{{kZ + "offload_param.device=" + p}, ", params " + p};
    if (p == "nvme") c.sets.push_back(kZ + "offload_param.nvme_path=" + w.nvme_path);
    par.push_back(c);
  }
  return par;
}

Axis moments_axis(const ChooseSpace& s) {
  Axis moments;
  for (const std::string& m : s.moment_dtypes) {
    moments.push_back({{"optimizer.params.moment_dtype=" + m}, ", " + m + " moments"});
  }
  return moments;
}

// reduce_bucket_size and allgather_bucket_size together.
Axis buckets_axis(const ChooseSpace& s) {
  Axis buckets;
  for (std::int64_t b : s.buckets) {
    const std::string v = std::to_string(b);
    buckets.push_back({{kZ + "reduce_bucket_size=" + v, kZ + "allgather_bucket_size=" + v},
                       b == 0 ? ", bucket/unit" : ", buckets " + v});
  }
  return buckets;
}

// Stage 3's prefetch bucket, each non-zero one with every max-live bound (0: twice the largest
// unit).
Axis prefetch_axis(const ChooseSpace& s, std::int64_t largest_unit) {
  const std::int64_t kDefaultLive = ZeroOptimizationConfig{}.stage3_max_live_parameters;
  Axis prefetch;
  for (std::int64_t v : s.prefetch) {
    const Combo p{{kZ + "stage3_prefetch_bucket_size=" + std::to_string(v)},
                  ", prefetch " + std::to_string(v)};
    if (v == 0 || s.max_live.empty()) {  // without a prefetch max-live bounds nothing
      prefetch.push_back(p);
      continue;
    }
    for (std::int64_t m : s.max_live) {
      const std::int64_t live = m > 0 ? m : std::max<std::int64_t>(2 * largest_unit, 1);
      Combo c = p;
      c.sets.push_back(kZ + "stage3_max_live_parameters=" + std::to_string(live));
      if (live != kDefaultLive) c.label += ", max-live " + std::to_string(live);
      prefetch.push_back(c);
    }
  }
  return prefetch;
}

Axis persistence_axis(const ChooseSpace& s) {
  Axis persist;
  for (std::int64_t v : s.persistence) {
    persist.push_back({{kZ + "stage3_param_persistence_threshold=" + std::to_string(v)},
                       ", persist " + std::to_string(v)});
  }
  return persist;
}

// Hybrid sharding across nodes: a group per node, or none.
Axis hybrid_axis(const ChooseSpace& s, const World& w) {
  Axis hybrid;
  for (const std::string& h : s.hybrid) {
    if (h == "node") {
      hybrid.push_back({{kZ + "hybrid_shard_size=" + std::to_string(w.local())},
                        ", hybrid " + std::to_string(w.local())});
    } else {
      hybrid.push_back({{kZ + "hybrid_shard_size=0"}, ""});
    }
  }
  return hybrid;
}

// ZeRO++'s quantized collectives: weights, gradients, both or none.
Axis quantized_axis(const ChooseSpace& s) {
  Axis quant;
  for (const std::string& q : s.quantized) {
    const bool qw = q == "weights" || q == "both", qg = q == "gradients" || q == "both";
    quant.push_back({{kZ + "zero_quantized_weights=" + (qw ? "true" : "false"),
                      kZ + "zero_quantized_gradients=" + (qg ? "true" : "false")},
                     std::string(qw ? ", qwZ" : "") + (qg ? ", qgZ" : "")});
  }
  return quant;
}

// Activation checkpointing: off, or the space's segments.
Axis checkpointing_axis(const ChooseSpace& s) {
  Axis ckpt;
  ckpt.push_back({{"activation_checkpointing.number_checkpoints=0"}, ""});
  if (s.checkpoint_segments > 0) {
    const std::string k = std::to_string(s.checkpoint_segments);
    ckpt.push_back({{"activation_checkpointing.number_checkpoints=" + k}, ", checkpointing " + k});
  }
  return ckpt;
}

// The space's axes for one stage: NVMe only with a path; parameter offload, prefetch (with its
// max-live bound), persistence and quantized collectives only at stage 3 (DeepSpeed's "valid only
// with stage 3": not enumerated elsewhere); hybrid sharding and quantized collectives only across
// nodes. largest_unit: the model's largest unit in elements (max_live 0 stands for twice it).
std::vector<Axis> axes_of(int stage, const ChooseSpace& s, const World& w,
                          std::int64_t largest_unit) {
  const bool nodes = w.local() < w.ranks && w.ranks % w.local() == 0;
  std::vector<Axis> axes = {{{{kZ + "stage=" + std::to_string(stage)}, "stage " + num(stage)}},
                            optimizer_axis(s, w)};
  if (stage == 3) axes.push_back(param_axis(s, w));
  axes.push_back(moments_axis(s));
  axes.push_back(buckets_axis(s));
  if (stage == 3) {
    axes.push_back(prefetch_axis(s, largest_unit));
    axes.push_back(persistence_axis(s));
  }
  if (nodes && stage > 0) axes.push_back(hybrid_axis(s, w));
  if (nodes && stage == 3) axes.push_back(quantized_axis(s));
  axes.push_back(checkpointing_axis(s));
  return axes;
}

std::vector<Combo> enumerate(const ChooseSpace& s, const World& w, std::int64_t largest_unit) {
  std::vector<Combo> out;
  for (int stage : s.stages) {
    for (Combo& c : product(axes_of(stage, s, w, largest_unit))) out.push_back(std::move(c));
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
    if (has > 0) {
      c.fullest = std::max(c.fullest, static_cast<double>(need) / static_cast<double>(has));
    }
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
  for (const std::string& h : space.hybrid) {
    ZERO_CHECK(h == "none" || h == "node", kInvalidArgument, "choose_config: hybrid '", h,
               "' (none, node)");
  }
  for (const std::string& q : space.quantized) {
    ZERO_CHECK(q == "none" || q == "weights" || q == "gradients" || q == "both", kInvalidArgument,
               "choose_config: quantized '", q, "' (none, weights, gradients, both)");
  }
  Choice out;
  out.margin = margin;
  out.budget = budget_of(world, margin);
  const Config base = ConfigBuilder().merge_json(base_json, "the base config").build();
  std::int64_t largest_unit = 0;
  for (const UnitSpec& u : trainer.plan_input(base).units) {
    std::int64_t n = 0;
    for (const ParamSpec& p : u.params) n += static_cast<std::int64_t>(p.numel());
    largest_unit = std::max(largest_unit, n);
  }
  for (const Combo& combo : enumerate(space, world, largest_unit)) {
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
  // first. Equal predicted times (what the model cannot tell apart: stages 1 and 2 without
  // accumulation move the same buckets) go to the one that leaves the most room, then keep the
  // enumeration's order (the simpler configuration first).
  auto rank = [](const Candidate& c) { return !c.fits() ? 2 : (c.untimed.empty() ? 0 : 1); };
  std::stable_sort(out.candidates.begin(), out.candidates.end(),
                   [&](const Candidate& a, const Candidate& b) {
                     if (rank(a) != rank(b)) return rank(a) < rank(b);
                     if (rank(a) == 2) return a.worst_short < b.worst_short;
                     if (a.time.total() != b.time.total()) return a.time.total() < b.time.total();
                     return rank(a) == 0 && a.fullest < b.fullest;
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
  const Candidate& ch = candidates[static_cast<std::size_t>(chosen)];
  const double best = ch.time.total();
  const double d = c.time.total() - best;
  char b[160];
  if (d == 0 && &c != &ch) {
    std::snprintf(b, sizeof b,
                  "fits, as fast by the profile, with less room (%.1f%% of its fullest tier's "
                  "budget against %.1f%%)",
                  100 * c.fullest, 100 * ch.fullest);
    return b;
  }
  std::snprintf(b, sizeof b, "fits, slower by %.3g s (+%.1f%%)", d, best > 0 ? 100 * d / best : 0);
  return b;
}

}  // namespace zero
