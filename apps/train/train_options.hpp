// train/train_options.hpp — zero-train's command line: the flags (kUsage), what they set
// (Options) and the training config they make (file < environment < flags).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gpt/gpt_model.hpp"
#include "zero/config/config.hpp"

namespace zero::train {

extern const char* const kUsage;

struct Options {
  int ranks = 2;
  gpt::GptConfig model{.vocab = 0, .seq = 64, .layers = 4, .dim = 128, .heads = 4};
  int batch = 8;             // --batch, else train_micro_batch_size_per_gpu (make_config)
  bool batch_given = false;  // --batch on the command line
  int steps = 200;
  std::string dtype;   // empty: from the config (bf16.enabled / fp16.enabled), else f32
  int grad_accum = 0;  // 0: from the config
  double lr = 0;       // 0: from the config
  // Activation checkpointing policy; "config": the config's activation_checkpointing block
  // (number_checkpoints segments, none when unset). cpu_checkpointing is always the config's.
  std::string checkpoint = "config";
  std::string data = gpt::kDefaultCorpus;
  int eval_every = 50;
  std::uint64_t seed = 1;
  double memory_budget = 0;  // bytes of memory per rank (all tiers but NVMe); 0: none
  std::vector<std::string> config_args;
  std::string device = "cpu";  // cpu | cuda
  std::string save_dir;        // training-state checkpoints (empty: none)
  int save_every = 0;          // 0: after the last step only
  int keep = 0;
  bool save_async = false;
  bool resume = false;
  std::string resume_dir;    // empty: save_dir
  std::string metrics;       // --metrics FILE (empty: none)
  double peak_flops = 0;     // --peak-flops: per rank; 0 = unknown (no MFU)
  std::string plot;          // --plot FILE (empty: none)
  std::string plot_against;  // --plot-against FILE: an earlier run's --metrics (empty: none)
  bool progress = true;      // the status line on a terminal's stderr (--no-progress: off)
};

// Parses the flags (not --help). Throws kInvalidArgument naming the flag.
Options parse(int argc, char** argv);
// The training config: --config FILE, the environment, --set / --zero-stage and the flags that
// stand for keys (--dtype, --grad-accum, --lr, --trace, the offload shorthands), the micro batch.
Config make_config(const Options& o);
[[noreturn]] void bad(const std::string& what);

}  // namespace zero::train
