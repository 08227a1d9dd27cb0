// zero-bench's command line and per-configuration engine config (see bench/bench_options.hpp).
#include "bench/bench_options.hpp"

#include <algorithm>
#include <sstream>
#include <string_view>

#include "gpt/gpt_flags.hpp"
#include "zero/core/error.hpp"

namespace zero::bench {

const char* const kUsage =
    R"(usage: zero-bench [flags]          what each ZeRO stage saves, measured
  --ranks N               in-process ranks (default 4); under mpirun the processes
  --steps S               steps per configuration (default 3; the first warms up)
  --stages L              stages to run (default 0,1,2,3)
  --checkpoint L          activation checkpointing policies: none, sqrt, every:K, list:A,B,
                          config (the config's number_checkpoints); default none,sqrt, or
                          none,config when the config sets number_checkpoints; the config's
                          cpu_checkpointing applies to every policy
  --offload L             optimizer offload per run: none, cpu, nvme (default none,cpu,nvme);
                          cpu:R / nvme:R offload the fraction R of the optimizer state
                          (offload_optimizer.ratio; nvme: R on NVMe, the rest in pinned memory);
                          a "+overlap" suffix (nvme+overlap, cpu:R+overlap) also sets
                          offload_optimizer.overlap_step (rows at stages 2-3 only)
  --nvme-path DIR         swap files for --offload nvme (default /tmp)
  --memory-budget B       cap each rank's memory (e.g. 512M); NVMe files are not counted
  --layers L --dim D --heads H --seq T   the GPT model (default 6, 192, 4, 64)
  --freeze F              the first F units frozen, as fine-tuning the top of a model: 1 the
                          embedding (and the tied head), 1 + k also blocks 0..k-1 (default 0)
  --batch B               sequences per rank per step (default 2)
  --dtype bf16|f16|f32    working dtype (default bf16)
  --reduce-dtype bf16|f16|f32   gradient reduction dtype (default bf16)
  --data FILE             training text
  --config FILE, --set k=v      DeepSpeed-style config and overrides for every run
  --json F --csv F --svg F      write the figures
  --trace FILE            also run each configuration with the timeline recorded, then untraced
                          again (the traced step time against the mean of the untraced runs
                          around it is reported) and write it as
                          Chrome trace JSON: FILE with the configuration before the extension
                          (trace.json -> trace.stage3.json); open in https://ui.perfetto.dev
  --metrics FILE          one JSON line per rank per step: the engine's StepMetrics
  --hybrid G              also run every stage >= 1 (no offload) with hybrid sharding over groups
                          of G ranks (zero_optimization.hybrid_shard_size): per-rank memory, and
                          the bytes sent across groups per step beside their formula
  --quantized             also run stage 3 with ZeRO++'s int8 collectives (zero_quantized_weights
                          and zero_quantized_gradients; with --hybrid G, with and without it):
                          bytes per step beside the packed chunks' formula (for the default
                          reduce_bucket_size 0: a reduction per unit)
  --comm-debug            run each stage / checkpoint / offload configuration again right
                          after it with comm_debug detail (every collective's fingerprint
                          checked across the MPI / NCCL ranks of an mpirun launch; in-process
                          ranks always check): its step time beside the same one's without
  --no-progress           no progress on stderr (a terminal: a status line with the ETA;
                          otherwise one line as each configuration starts)
  --plan                  predictions only: with --params P --ranks N DESIGN.md's formulas;
                          with the model flags (and --vocab V) this engine's bytes per rank
  --help                  this text
)";

namespace {

[[noreturn]] void usage_error(const std::string& what) {
  ZERO_THROW(kInvalidArgument, what, " (run zero-bench --help)");
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, sep)) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

}  // namespace

Options parse(int argc, char** argv) {
  Options o;
  bool checkpoint_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(a + " needs a value");
      return argv[++i];
    };
    if (gpt::common_flag(a, value, o)) {
      continue;
    } else if (a == "--stages") {
      o.stages.clear();
      for (const auto& s : split(value(), ',')) o.stages.push_back(gpt::flag_int(a, s));
    } else if (a == "--checkpoint") {
      o.checkpoints = split(value(), ',');
      checkpoint_given = true;
    } else if (a == "--offload") {
      o.offloads = split(value(), ',');
    } else if (a == "--nvme-path") {
      o.nvme_path = value();
    } else if (a == "--vocab") {
      o.vocab = gpt::flag_int(a, value());
    } else if (a == "--dtype") {
      o.dtype = value();
    } else if (a == "--reduce-dtype") {
      o.reduce_dtype = value();
    } else if (a == "--json") {
      o.json = value();
    } else if (a == "--csv") {
      o.csv = value();
    } else if (a == "--svg") {
      o.svg = value();
    } else if (a == "--hybrid") {
      o.hybrid = gpt::flag_int(a, value());
    } else if (a == "--quantized") {
      o.quantized = true;
    } else if (a == "--comm-debug") {
      o.comm_debug = true;
    } else if (a == "--trace") {
      o.trace = value();
    } else if (a == "--metrics") {
      o.metrics = value();
    } else if (a == "--no-progress") {
      o.progress = false;
    } else if (a == "--plan") {
      o.plan = true;
    } else if (a == "--params") {
      try {
        o.params = std::stod(value());
      } catch (...) {
        usage_error("--params expects a number such as 7.5e9");
      }
    } else {
      usage_error("unknown argument '" + a + "'");
    }
  }
  if (o.ranks < 1) usage_error("--ranks must be >= 1");
  if (o.steps < 2) usage_error("--steps must be >= 2 (the first step warms up)");
  if (o.batch < 1) usage_error("--batch must be >= 1");
  for (int s : o.stages) {
    if (s < 0 || s > 3) usage_error("--stages takes stages 0..3, got " + std::to_string(s));
  }
  if (o.quantized && std::find(o.stages.begin(), o.stages.end(), 3) == o.stages.end()) {
    usage_error("--quantized runs stage 3 (ZeRO++ quantizes its collectives); --stages has no 3");
  }
  // The config's activation_checkpointing.number_checkpoints is the checkpointed run by default
  // (policy "config"); its cpu_checkpointing applies to every policy.
  if (!checkpoint_given &&
      make_config(o, 0, "none").activation_checkpointing.number_checkpoints > 0) {
    o.checkpoints = {"none", "config"};
  }
  for (const auto& c : o.checkpoints) {
    if (c != "config") (void)CheckpointSpec::parse(c);
  }
  for (const auto& f : o.offloads) (void)parse_offload(f);
  (void)parse_dtype(o.dtype);
  (void)parse_dtype(o.reduce_dtype);
  return o;
}

OffloadChoice parse_offload(const std::string& given) {
  OffloadChoice c;
  std::string item = given;
  constexpr std::string_view kOverlap = "+overlap";
  if (item.size() > kOverlap.size() &&
      item.compare(item.size() - kOverlap.size(), kOverlap.size(), kOverlap) == 0) {
    item.resize(item.size() - kOverlap.size());
    c.overlap_step = true;
  }
  const std::size_t colon = item.find(':');
  c.device = item.substr(0, colon);
  if (c.device != "none" && c.device != "cpu" && c.device != "nvme") {
    usage_error(
        "--offload takes none, cpu, nvme, cpu:R or nvme:R (each but none with an optional "
        "+overlap), got '" +
        given + "'");
  }
  if (c.device == "none" && c.overlap_step) {
    usage_error("--offload " + given + ": +overlap needs an optimizer offload (cpu or nvme)");
  }
  if (colon == std::string::npos) return c;
  const std::string r = item.substr(colon + 1);
  std::size_t used = 0;
  try {
    c.ratio = std::stod(r, &used);
  } catch (...) {
    used = 0;
  }
  if (c.device == "none" || used == 0 || used != r.size() || !(c.ratio >= 0.0 && c.ratio <= 1.0)) {
    usage_error("--offload " + item +
                ": R (offload_optimizer.ratio) must be a number in [0, 1] "
                "after cpu: or nvme:");
  }
  c.ratio_given = true;
  return c;
}

Config make_config(const Options& o, int stage, const std::string& offload_item, int hybrid,
                   bool quantized, bool comm_debug) {
  const OffloadChoice choice = parse_offload(offload_item);
  const std::string& offload = choice.device;
  ConfigBuilder b;
  // The harness's default: stage 3 prefetches one unit ahead (DeepSpeed's 5e7 elements would
  // prefetch the whole of a small model). --config / --set / the environment override it.
  if (stage == 3) b.set("zero_optimization.stage3_prefetch_bucket_size=1", "zero-bench");
  b.apply_env();
  std::vector<std::string> args = o.config_args;
  b.apply_args(args);
  b.set("zero_optimization.stage=" + std::to_string(stage), "zero-bench");
  const DType w = parse_dtype(o.dtype);
  b.set(std::string("bf16.enabled=") + (w == DType::kBF16 ? "true" : "false"), "zero-bench");
  b.set(std::string("fp16.enabled=") + (w == DType::kF16 ? "true" : "false"), "zero-bench");
  const std::string rd(to_string(parse_dtype(o.reduce_dtype)));
  b.set("communication_data_type=" + std::string(rd == "f32"   ? "fp32"
                                                 : rd == "f16" ? "fp16"
                                                               : "bf16"),
        "zero-bench");
  if (stage == 3) b.set("zero_optimization.stage3_param_persistence_threshold=0", "zero-bench");
  if (hybrid > 0) {
    b.set("zero_optimization.hybrid_shard_size=" + std::to_string(hybrid), "zero-bench");
  }
  if (quantized) {
    b.set("zero_optimization.zero_quantized_weights=true", "zero-bench");
    b.set("zero_optimization.zero_quantized_gradients=true", "zero-bench");
  }
  if (comm_debug) b.set("comm_debug=detail", "zero-bench");
  if (offload != "none") {
    b.set("zero_optimization.offload_optimizer.device=" + offload, "zero-bench");
    if (offload == "nvme") {
      b.set("zero_optimization.offload_optimizer.nvme_path=" + o.nvme_path, "zero-bench");
      b.set("zero_optimization.offload_optimizer.pipeline_read=true", "zero-bench");
      b.set("zero_optimization.offload_optimizer.pipeline_write=true", "zero-bench");
    }
    if (choice.ratio_given) {
      b.set("zero_optimization.offload_optimizer.ratio=" + std::to_string(choice.ratio),
            "zero-bench");
    }
    if (choice.overlap_step)
      b.set("zero_optimization.offload_optimizer.overlap_step=true", "zero-bench");
  }
  return b.build();
}

}  // namespace zero::bench
