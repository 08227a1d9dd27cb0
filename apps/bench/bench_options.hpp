// bench/bench_options.hpp — zero-bench's command line (its flags, their checks) and the engine
// configuration of one measured configuration (the user's --config / --set, then the harness's
// choices for the stage, offload, hybrid sharding and quantization).
//
// Thread safety: plain values and pure functions.
#pragma once

#include <string>
#include <vector>

#include "gpt/gpt_model.hpp"
#include "zero/config/config.hpp"

namespace zero::bench {

extern const char* const kUsage;

struct Options {
  int ranks = 4;
  int steps = 3;
  std::vector<int> stages{0, 1, 2, 3};
  std::vector<std::string> checkpoints{"none", "sqrt"};
  std::vector<std::string> offloads{"none", "cpu", "nvme"};  // optimizer offload
  std::string nvme_path = "/tmp";
  double memory_budget = 0;  // bytes per rank of memory (all tiers but NVMe); 0: none
  gpt::GptConfig model{.vocab = 0, .seq = 64, .layers = 6, .dim = 192, .heads = 4};
  int batch = 2;  // sequences per rank per step
  std::string dtype = "bf16";
  std::string reduce_dtype = "bf16";  // DESIGN.md's formulas count 16-bit gradients
  std::string data = gpt::kDefaultCorpus;
  std::string json, csv, svg;
  std::string trace, metrics;
  bool progress = true;     // --no-progress: nothing on stderr about how far the run is
  int hybrid = 0;           // --hybrid G: also each stage >= 1 sharded over groups of G (HSDP)
  bool quantized = false;   // --quantized: also stage 3 with qwZ + qgZ
  bool comm_debug = false;  // --comm-debug: each configuration again with comm_debug detail
  bool plan = false;
  double params = 0;                     // --plan --params
  int vocab = 0;                         // --plan without a corpus
  std::vector<std::string> config_args;  // --config / --set, forwarded to the config builder
};

// The flags (kInvalidArgument naming the flag on a bad one).
Options parse(int argc, char** argv);

// One item of --offload: "none", "cpu", "nvme", or "cpu:R" / "nvme:R" (a partial offload:
// zero_optimization.offload_optimizer.ratio = R, in [0, 1]). kInvalidArgument naming --offload.
struct OffloadChoice {
  std::string device = "none";
  double ratio = 1.0;
  bool ratio_given = false;
  bool overlap_step = false;  // "+overlap": offload_optimizer.overlap_step (stages 2-3)
};
OffloadChoice parse_offload(const std::string& item);

// The configuration of one run: the user's file / --set, then the harness's choices.
Config make_config(const Options& o, int stage, const std::string& offload = "none", int hybrid = 0,
                   bool quantized = false, bool comm_debug = false);

}  // namespace zero::bench
