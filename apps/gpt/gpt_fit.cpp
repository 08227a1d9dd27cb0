// Will a run of the GPT trainer fit (gpt/gpt_fit.hpp).
#include "gpt/gpt_fit.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "zero/comm/comm.hpp"
#include "zero/device/memory_report.hpp"
#include "zero/engine/engine.hpp"

namespace zero::gpt {

std::vector<UnitSpec> model_units(const GptConfig& g, const Config& config) {
  ThreadGroup group(1);
  auto comm = group.communicator(0);
  Config cfg = config;
  cfg.zero_optimization.hybrid_shard_size = 0;  // one rank: no groups
  Engine e(*comm, cfg);
  MemoryTracker t;
  GptModel m(g, t);
  m.declare(e);
  std::vector<UnitSpec> units;
  for (UnitId u = 0; u < e.num_units(); ++u) units.push_back(e.unit(u));
  return units;
}

PlanInput plan_input(const GptConfig& g, const Config& config, int ranks,
                     const CheckpointSpec& spec) {
  PlanInput pin;
  pin.units = model_units(g, config);
  pin.ranks = ranks;
  pin.config = config;
  pin.gather_order = GptModel::gather_order(g, spec);
  pin.grads_held = GptModel::grads_held(g);
  return pin;
}

namespace {

// The run's need: the plan per rank plus the model's activations and workspace, times `local`.
FitCandidate evaluate(const GptConfig& g, FitCandidate c, int rows, int ranks, int local,
                      const MemoryBudget& budget, bool device_is_host,
                      PlanResult* plan_out = nullptr, std::size_t* act_out = nullptr,
                      std::size_t* ws_out = nullptr) {
  const CheckpointSpec& spec = c.checkpointing;
  c.stage = c.config.zero_optimization.stage;
  const PlanResult plan = plan_engine_memory(plan_input(g, c.config, ranks, spec));
  MemoryTracker t;
  GptModel m(g, t);
  const std::size_t act = m.activation_bytes(rows, g.seq, spec);
  const std::size_t ws = m.workspace_bytes(rows, g.seq);
  c.need = fit_need(plan, local, act + ws, device_is_host);
  c.shortfall = fit_shortfall(c.need, budget);
  if (plan_out != nullptr) *plan_out = plan;
  if (act_out != nullptr) *act_out = act;
  if (ws_out != nullptr) *ws_out = ws;
  return c;
}

std::string need_text(const FitNeed& n) {
  std::string s = "host " + format_bytes(n.host);
  if (n.device > 0) s += ", device " + format_bytes(n.device);
  if (n.nvme > 0) s += ", NVMe " + format_bytes(n.nvme);
  return s;
}

}  // namespace

FitResult check_fit(const GptConfig& g, const Config& config, const CheckpointSpec& spec, int rows,
                    int ranks, int local, const MemoryBudget& budget, bool device_is_host,
                    const std::string& nvme_dir) {
  FitResult r;
  FitCandidate asked;
  asked.config = config;
  asked.checkpointing = spec;
  r.asked = evaluate(g, std::move(asked), rows, ranks, local, budget, device_is_host, &r.plan,
                     &r.activations, &r.workspace);
  if (r.fits()) return r;
  // The ladder, cheapest first by what each adds to a step: a higher stage adds communication
  // only; checkpointing recomputes the blocks' forward; the optimizer on NVMe moves its 12 bytes
  // per parameter through the disk each step; the parameters on NVMe, every gather.
  const int stage = config.zero_optimization.stage;
  const CheckpointSpec sqrt = CheckpointSpec::resolve("sqrt", config.activation_checkpointing);
  const bool plain = spec.policy == CheckpointPolicy::kNone;
  auto candidate = [&](int s, bool ckpt, bool nvme_optimizer, bool nvme_params) {
    FitCandidate c;
    c.config = config;
    c.checkpointing = ckpt ? sqrt : spec;
    c.config.zero_optimization.stage = s;
    if (ckpt) c.checkpoint = "sqrt";
    c.nvme_optimizer = nvme_optimizer;
    c.nvme_params = nvme_params;
    OffloadConfig& o = c.config.zero_optimization.offload_optimizer;
    c.nvme_dir = o.nvme_path.empty() ? nvme_dir : o.nvme_path;
    if (nvme_optimizer) {
      o.device = OffloadDevice::kNvme;
      o.nvme_path = c.nvme_dir;
    }
    if (nvme_params) {
      OffloadConfig& p = c.config.zero_optimization.offload_param;
      p.device = OffloadDevice::kNvme;
      if (p.nvme_path.empty()) p.nvme_path = c.nvme_dir;
    }
    return c;
  };
  MemoryBudget with_nvme = budget;
  if (with_nvme.nvme == 0) {
    const MemoryBudget m = machine_budget(Device::cpu(), nvme_dir);
    with_nvme.nvme = m.nvme;
    with_nvme.nvme_from = m.nvme_from;
  }
  auto add = [&](FitCandidate c) {
    const bool nvme = c.nvme_optimizer || c.nvme_params;
    r.tried.push_back(
        evaluate(g, std::move(c), rows, ranks, local, nvme ? with_nvme : budget, device_is_host));
  };
  for (int s = std::max(stage + 1, 1); s <= 3; ++s) add(candidate(s, false, false, false));
  if (plain) {
    for (int s = stage; s <= 3; ++s) add(candidate(s, true, false, false));
  }
  add(candidate(std::max(stage, 2), plain, true, false));
  add(candidate(3, plain, true, true));
  for (std::size_t k = 0; k < r.tried.size() && r.fits_instead < 0; ++k) {
    if (r.tried[k].shortfall.empty()) r.fits_instead = static_cast<int>(k);
  }
  return r;
}

std::string FitResult::message(const FitFlags& flags) const {
  std::string s = "does not fit: " + asked.shortfall + ". Per rank: ";
  for (MemCategory c :
       {MemCategory::kParams16, MemCategory::kMasterParams, MemCategory::kOptimizerState,
        MemCategory::kGradients, MemCategory::kCommBuffers, MemCategory::kOffloadStaging}) {
    const std::size_t b = plan.at(c);
    if (b > 0) s += std::string(to_string(c)) + " " + format_bytes(b) + ", ";
  }
  s += "activations " + format_bytes(activations) + ", workspace " + format_bytes(workspace) +
       "; this process: " + need_text(asked.need) + ". ";
  if (fits_instead >= 0) {
    const FitCandidate& c = tried[static_cast<std::size_t>(fits_instead)];
    s += "Fits instead with: " + flags(c) + " (needs " + need_text(c.need) + ")";
  } else {
    s += "No higher stage, activation checkpointing or NVMe offload fits (the last tried, " +
         flags(tried.back()) + ": " + tried.back().shortfall +
         "): fewer ranks per process, a smaller model or batch, or more memory";
  }
  return s;
}

}  // namespace zero::gpt
