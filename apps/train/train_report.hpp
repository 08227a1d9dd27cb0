// train/train_report.hpp — what zero-train reports of a run besides its step lines: the --metrics
// JSON line, the --plot loss curves (the model FLOPs per token behind MFU: gpt/gpt_cost.hpp).
//
// Thread safety: plain values and functions; LossPlot belongs to the printing rank.
#pragma once

#include <string>
#include <vector>

#include "common/svg_chart.hpp"
#include "gpt/gpt_model.hpp"
#include "zero/device/memory.hpp"
#include "zero/engine/engine.hpp"

namespace zero::train {

// --plot FILE: the printing rank's loss curves, written at the end of the run by write(), or by
// the destructor while an error unwinds the run (the curves up to the failure; a write error
// then is dropped, not reported over the run's own).
struct LossPlot {
  std::string path;   // empty: no --plot
  std::string title;  // the run: stage, ranks, model
  std::vector<svg::Point> train, val;
  // --plot-against: an earlier run's training loss, and what to call it.
  std::vector<svg::Point> against;
  std::string against_name;
  bool written = false;

  // Throws kIO naming the file when it cannot be written.
  void write(const std::string& note = "");
  ~LossPlot();
};

// Rank 0's (step, loss) from a --metrics file, in file order. Throws kIO naming the file when it
// cannot be read, kInvalidArgument naming the file and line when a line is not a metrics line.
std::vector<svg::Point> read_loss_curve(const std::string& path);

// The mean loss of the last `n` points (all of them when fewer).
double final_loss(const std::vector<svg::Point>& curve, std::size_t n = 10);

// One step of one rank, as --metrics writes it.
struct StepLine {
  int step = 0;
  int rank = 0;
  double loss = 0;       // the mean over ranks
  double rank_loss = 0;  // this rank's
  double step_s = 0;
  double tokens = 0;  // every rank's tokens in this step
  double flops_per_rank = 0;
  double mfu = 0;  // 0: no --peak-flops
  double lr = 0;
  double grad_norm = 0;
  bool applied = true;
};
// One JSON object on one line: the step, throughput, peak bytes per memory tier of `tracker`,
// and the engine's metrics.
std::string metrics_line(const StepLine& s, const MemoryTracker& tracker,
                         const StepMetrics& engine);

}  // namespace zero::train
