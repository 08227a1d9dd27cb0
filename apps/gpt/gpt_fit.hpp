// gpt/gpt_fit.hpp — will a run of the GPT trainer fit this machine? zero-train and zero-bench ask
// before their first allocation (zero/engine/fit.hpp): the engine's planned bytes
// (zero/engine/plan.hpp) for the model's units plus the model's own activations and workspace, per
// rank, times the ranks this process runs, against the budget per tier. When it does not fit, the
// first of a fixed ladder of changes that does (a higher stage, activation checkpointing, the
// optimizer and then the parameters on NVMe) is named.
//
// Thread safety: pure functions.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "gpt/gpt_model.hpp"
#include "zero/config/config.hpp"
#include "zero/engine/activation_checkpointing.hpp"
#include "zero/engine/fit.hpp"
#include "zero/engine/plan.hpp"

namespace zero::gpt {

// The model's units as declare() makes them (declared on an engine that never allocates).
std::vector<UnitSpec> model_units(const GptConfig& g, const Config& config);

// The planner's input for a run of the model: its units, gather order and held gradients.
PlanInput plan_input(const GptConfig& g, const Config& config, int ranks,
                     const CheckpointSpec& spec);

// One candidate run: its config and checkpointing, and what it needs.
struct FitCandidate {
  Config config;
  CheckpointSpec checkpointing;
  // What differs from the run asked for: the stage, checkpointing ("" unchanged), the optimizer
  // and the stage-3 parameters on NVMe under nvme_dir.
  int stage = 0;
  std::string checkpoint;
  bool nvme_optimizer = false, nvme_params = false;
  std::string nvme_dir;
  FitNeed need;
  std::string shortfall;  // empty: it fits
};
// A candidate's change as the program's flags ("--zero-stage 3 --checkpoint-activations sqrt").
using FitFlags = std::function<std::string(const FitCandidate&)>;

struct FitResult {
  FitCandidate asked;
  // When the run asked for does not fit: the first change of the ladder that fits, if any.
  std::vector<FitCandidate> tried;
  int fits_instead = -1;  // index into `tried`; -1: none
  // The run asked for's per-rank bytes by category, and the trainer's, for the message.
  PlanResult plan;
  std::size_t activations = 0, workspace = 0;
  bool fits() const { return asked.shortfall.empty(); }
  // "does not fit: host memory: needs ..., has ... (...): short by .... Per rank: params16 ...,
  // ...; fits instead with: <flags> (needs ...)" or "... no higher stage, ... fits".
  std::string message(const FitFlags& flags) const;
};

// `rows` sequences of the model's seq per rank and micro-step; `ranks` ranks in the world, `local`
// of them in this process; NVMe candidates use `nvme_dir` when the config names none.
FitResult check_fit(const GptConfig& g, const Config& config, const CheckpointSpec& spec, int rows,
                    int ranks, int local, const MemoryBudget& budget, bool device_is_host,
                    const std::string& nvme_dir);

}  // namespace zero::gpt
