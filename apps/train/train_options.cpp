// zero-train's command line (see train/train_options.hpp).
#include "train/train_options.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "gpt/gpt_flags.hpp"
#include "zero/core/error.hpp"
#include "zero/engine/activation_checkpointing.hpp"

namespace zero::train {

const char* const kUsage = R"(usage: zero-train [flags]
  --zero-stage S          ZeRO stage 0-3 (default 0; also --config / ZERO_STAGE)
  --ranks N               in-process ranks (default 2); under mpirun/srun/torchrun the processes
  --config FILE           DeepSpeed-style JSON config;  --set key.path=value  one key (repeatable)
  --layers L --dim D --heads H --seq T    the GPT model (default 4, 128, 4, 64)
  --freeze F              the first F units frozen, as fine-tuning the top of a model: 1 the
                          embedding (and the tied head), 1 + k also blocks 0..k-1 (default 0)
  --batch B               sequences per rank per micro-step (default: the config's
                          train_micro_batch_size_per_gpu, derived from train_batch_size as
                          DeepSpeed does, else 8); with that key set too, the two must agree
  --steps K               optimizer steps (default 200)
  --dtype f32|bf16|f16    working dtype (default: the config's, else f32)
  --grad-accum A          micro-steps per step
  --lr X                  peak learning rate
  --checkpoint-activations [P]   activation checkpointing: sqrt (bare), every:K, list:A,B,
                          none (default: the config's activation_checkpointing.number_checkpoints;
                          its cpu_checkpointing applies to every policy)
  --data FILE             training text (default /usr/share/common-licenses/GPL-3)
  --eval-every K          validation loss every K steps (0: never)
  --seed S                data and init seed
  --offload-optimizer none|cpu|nvme   fp32 master + optimizer state to pinned memory / NVMe
  --offload-param none|cpu|nvme       stage-3 parameter shards to pinned memory / NVMe
  --nvme-path DIR         directory of the swap files (both offloads)
  --memory-budget B       cap each rank's memory (e.g. 512M, 2G); NVMe files are not counted
  --device cpu|cuda       where the model and the engine run (default cpu); cuda: one GPU per
                          rank over NCCL (--ranks 1, or one process per GPU under a launcher)
  --save-dir DIR          save training-state checkpoints under DIR (DIR/step-<n>, DIR/latest)
  --save-every K          ... every K steps (default: only after the last step)
  --keep K                keep the newest K checkpoints (default 0: all)
  --save-async            write checkpoints on a background thread (the step only snapshots)
  --resume [DIR]          continue from DIR's latest checkpoint (default: --save-dir), at any
                          --ranks and stage; the data continues at the saved step
  --trace FILE            record the run's timeline (config trace.enabled / trace.path) and
                          write it as Chrome trace JSON (https://ui.perfetto.dev)
  --metrics FILE          one JSON line per rank per step: loss, tokens/s, model FLOP/s,
                          peak memory per tier, and the engine's StepMetrics
  --peak-flops F          the hardware's peak FLOP/s per rank: MFU in the step lines and metrics
  --plot FILE             an SVG chart of the training loss (every step) and the validation loss
                          (every --eval-every) against the step, written at the end
  --plot-against FILE     with --plot: also draw the training loss of an earlier run, read from
                          its --metrics FILE (rank 0's lines), and print how the final losses
                          (the mean of the last 10 steps) compare
  --no-progress           no status line on stderr (shown only when stderr is a terminal)
  --help                  this text
)";

void bad(const std::string& what) {
  ZERO_THROW(kInvalidArgument, what, " (run zero-train --help)");
}

Options parse(int argc, char** argv) {
  Options o;
  bool ranks_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) bad(a + " needs a value");
      return argv[++i];
    };
    // The whole of the next argument as a finite number > 0.
    auto positive = [&](const std::string& flag, const char* unit) {
      const std::string text = value();
      char* end = nullptr;
      const double x = std::strtod(text.c_str(), &end);
      if (text.empty() || *end != '\0' || !std::isfinite(x) || x <= 0) {
        bad(flag + " expects a finite number > 0" + unit + ", got '" + text.substr(0, 40) + "'");
      }
      return x;
    };
    ranks_given = ranks_given || a == "--ranks";
    o.batch_given = o.batch_given || a == "--batch";
    if (gpt::common_flag(a, value, o)) {
      continue;
    } else if (a == "--device") {
      o.device = value();
    } else if (a == "--dtype") {
      o.dtype = value();
    } else if (a == "--grad-accum") {
      o.grad_accum = gpt::flag_int(a, value());
    } else if (a == "--lr") {
      o.lr = positive(a, "");
    } else if (a == "--checkpoint-activations") {
      // Optional policy argument: none | every:K | sqrt | list:...; bare flag = sqrt.
      if (i + 1 < argc && argv[i + 1][0] != '-') {
        o.checkpoint = value();
      } else {
        o.checkpoint = "sqrt";
      }
    } else if (a == "--eval-every") {
      o.eval_every = gpt::flag_int(a, value());
    } else if (a == "--seed") {
      o.seed = static_cast<std::uint64_t>(gpt::flag_int(a, value()));
    } else if (a == "--offload-optimizer") {
      o.config_args.push_back("--set");
      o.config_args.push_back("zero_optimization.offload_optimizer.device=" + value());
    } else if (a == "--offload-param") {
      o.config_args.push_back("--set");
      o.config_args.push_back("zero_optimization.offload_param.device=" + value());
    } else if (a == "--nvme-path") {  // for both offloads
      const std::string dir = value();
      for (const char* key : {"offload_optimizer", "offload_param"}) {
        o.config_args.push_back("--set");
        o.config_args.push_back(std::string("zero_optimization.") + key + ".nvme_path=" + dir);
      }
    } else if (a == "--save-dir") {
      o.save_dir = value();
    } else if (a == "--save-every") {
      o.save_every = gpt::flag_int(a, value());
    } else if (a == "--keep") {
      o.keep = gpt::flag_int(a, value());
    } else if (a == "--save-async") {
      o.save_async = true;
    } else if (a == "--resume") {
      o.resume = true;
      if (i + 1 < argc && argv[i + 1][0] != '-') o.resume_dir = argv[++i];
    } else if (a == "--trace") {
      const std::string path = value();
      o.config_args.push_back("--set");
      o.config_args.push_back("trace.enabled=true");
      o.config_args.push_back("--set");
      o.config_args.push_back("trace.path=" + path);
    } else if (a == "--metrics") {
      o.metrics = value();
    } else if (a == "--plot") {
      o.plot = value();
    } else if (a == "--plot-against") {
      o.plot_against = value();
    } else if (a == "--no-progress") {
      o.progress = false;
    } else if (a == "--peak-flops") {
      o.peak_flops = positive(a, " (FLOP/s)");
    } else if (a == "--zero-stage") {
      o.config_args.push_back(a);
      o.config_args.push_back(value());
    } else {
      bad("unknown argument '" + a + "'");
    }
  }
  if (o.device != "cpu" && o.device != "cuda") {
    bad("--device expects cpu or cuda, got '" + o.device + "'");
  }
#if !defined(ZERO_GPT_WITH_CUDA)
  if (o.device == "cuda") {
    bad("--device cuda needs zero-train built with CUDA (configure with -DZERO_WITH_CUDA=ON)");
  }
#endif
  // One GPU per process: --ranks defaults to 1 there (and must be 1 unless a launcher starts
  // the ranks, which run() checks).
  if (o.device == "cuda" && !ranks_given) o.ranks = 1;
  if (!o.plot_against.empty() && o.plot.empty()) bad("--plot-against needs --plot FILE");
  if (o.ranks < 1) bad("--ranks must be >= 1");
  if (o.steps < 1) bad("--steps must be >= 1");
  if (o.batch < 1) bad("--batch must be >= 1");
  if (o.save_every < 0 || o.keep < 0) bad("--save-every and --keep must be >= 0");
  if ((o.save_every > 0 || o.keep > 0 || o.save_async) && o.save_dir.empty()) {
    bad("--save-every / --keep / --save-async need --save-dir");
  }
  if (o.resume && o.resume_dir.empty() && o.save_dir.empty()) {
    bad("--resume needs a directory (--resume DIR, or --save-dir DIR)");
  }
  if (o.checkpoint != "config") (void)CheckpointSpec::parse(o.checkpoint);
  return o;
}

Config make_config(const Options& o) {
  ConfigBuilder b;
  // File < environment < flags, as every zero program.
  std::vector<std::string> files, rest;
  for (std::size_t i = 0; i < o.config_args.size(); i += 2) {
    if (o.config_args[i] == "--config") {
      b.merge_file(o.config_args[i + 1]);
    } else {
      rest.push_back(o.config_args[i]);
      rest.push_back(o.config_args[i + 1]);
    }
  }
  b.apply_env();
  b.apply_args(rest);
  if (!o.dtype.empty()) {
    const DType w = parse_dtype(o.dtype);
    b.set(std::string("bf16.enabled=") + (w == DType::kBF16 ? "true" : "false"), "--dtype");
    b.set(std::string("fp16.enabled=") + (w == DType::kF16 ? "true" : "false"), "--dtype");
  }
  if (o.grad_accum > 0) {
    b.set("gradient_accumulation_steps=" + std::to_string(o.grad_accum), "--grad-accum");
  }
  if (o.lr > 0) {
    char lr[32];
    std::snprintf(lr, sizeof lr, "%.17g", o.lr);  // std::to_string's %f makes 1e-7 zero
    b.set(std::string("optimizer.params.lr=") + lr, "--lr");
  }
  Config cfg = b.build();
  // The micro batch: --batch, or the config's train_micro_batch_size_per_gpu; both given, they
  // must agree. Neither: derived from train_batch_size at engine start if that is set (DeepSpeed's
  // rule), else zero-train's default.
  if (o.batch_given) {
    if (cfg.micro_batch_given && cfg.train_micro_batch_size_per_gpu != o.batch) {
      ZERO_THROW(kConfig, "--batch ", o.batch,
                 " and config key 'train_micro_batch_size_per_gpu' = ",
                 cfg.train_micro_batch_size_per_gpu, " disagree: give one of them");
    }
    cfg.train_micro_batch_size_per_gpu = o.batch;
    cfg.micro_batch_given = true;
  } else if (!cfg.micro_batch_given && cfg.train_batch_size == 0) {
    cfg.train_micro_batch_size_per_gpu = o.batch;
  }
  return cfg;
}

}  // namespace zero::train
