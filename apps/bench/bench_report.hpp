// bench/bench_report.hpp — what zero-bench measured for each configuration, and its writers
// (text tables, JSON, CSV, an SVG of stacked bar charts: memory and step time).
//
// Thread safety: plain values; the writers are pure functions of them.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "zero/device/memory.hpp"
#include "zero/engine/plan.hpp"

namespace zero::bench {

struct RankFigures {
  int rank = 0;
  // Tracker readings after the last step: current and peak bytes by (category, tier).
  std::array<std::array<std::size_t, kNumMemTiers>, kNumMemCategories> current{}, peak{};
  std::size_t total_current = 0;  // tracker: all tiers but NVMe
  std::size_t total_peak = 0;
  std::size_t buffers = 0;  // engine pools inside the categories (in flight / gathered)
  std::size_t comm_bytes_per_step = 0;
  std::size_t cross_group_bytes_per_step = 0;  // hybrid: of comm_bytes_per_step, to other groups
  double step_ms = 0;                          // median over the measured steps
  double last_loss = 0;
  // Communication per measured step (medians, StepResult::metrics): collectives executing on
  // this rank (total) and its thread blocked on them (exposed).
  double comm_busy_ms = 0;
  double comm_wait_ms = 0;
  // --trace: the median step of the same configuration run again with the timeline recorded, and
  // the baseline it is compared with: the mean of the untraced runs before and after it (the
  // second run of a configuration tends to be the faster one; before-and-after cancels that).
  double traced_step_ms = 0;
  double untraced_step_ms = 0;

  std::size_t category(MemCategory c) const;  // current, all tiers
  std::size_t category_peak(MemCategory c) const;
  // params16 + master + optimizer state + gradients, current, on the device (or, CPU-only, the
  // host tier that stands for it; offloaded bytes in pinned memory or on NVMe apart), less the
  // engine's pool buffers.
  std::size_t model_state() const;
  std::size_t tier(MemTier t) const;  // current, all categories
};

struct ConfigFigures {
  int stage = 0;
  std::string checkpoint;        // "none", "sqrt", ...
  std::string offload = "none";  // optimizer offload: none | cpu | nvme | cpu:R | nvme:R
  int hybrid = 0;                // hybrid sharding over groups of this many ranks (0: none)
  bool quantized = false;        // stage 3 with qwZ + qgZ (int8 collectives)
  bool comm_debug = false;       // comm_debug detail: every collective's fingerprint checked
  int ranks = 1;
  std::string dtype;  // working dtype
  std::string reduce_dtype;
  std::size_t params = 0;            // Ψ
  std::size_t trainable_params = 0;  // of Ψ, not frozen (--freeze)
  std::vector<RankFigures> per_rank;
  std::size_t process_rss = 0;  // this process (all in-process ranks), at the end of the run
  PlanResult plan;              // predicted engine memory
  std::size_t predicted_activations = 0;  // peak kActivations per rank
  std::size_t predicted_other = 0;        // the trainer's workspace per rank
  FormulaBytes formula;                   // DESIGN.md for Ψ at this stage
  double comm_theory_bytes = 0;           // per rank per step
  double cross_group_theory_bytes = 0;    // of it, to other groups (hybrid sharding)
  double step_ms_stage0 = 0;              // the stage-0 run with the same checkpointing

  std::size_t predicted_total() const {
    return plan.total() + predicted_activations + predicted_other;
  }
};

// RankFigures as 64-bit words and back: under a launcher every process measures its own rank and
// the figures travel through an all-gather (which copies bits).
std::vector<std::uint64_t> pack(const RankFigures& f);
RankFigures unpack(const std::uint64_t* words);

// "stage 3 +ckpt sqrt +off nvme": the configuration as the tables name it.
std::string label(const ConfigFigures& c);

// Human-readable: one block per configuration, then a summary across configurations.
std::string format_config(const ConfigFigures& c);
std::string format_summary(const std::vector<ConfigFigures>& all);

std::string to_json(const std::vector<ConfigFigures>& all);
std::string to_csv(const std::vector<ConfigFigures>& all);
// Per-rank memory of rank 0 by category, one stacked bar per configuration; below it rank 0's
// step time per configuration (exposed communication and the rest, stacked; communication
// executing beside them).
std::string to_svg(const std::vector<ConfigFigures>& all);

}  // namespace zero::bench
