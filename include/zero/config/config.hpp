// zero/config/config.hpp — the run configuration: a DeepSpeed-compatible JSON subset plus
// overrides.
//
// Field names, nesting and defaults mirror DeepSpeed's config so that a DeepSpeed user's file
// loads unchanged. Sources apply in this order, later winning: the JSON file (or string), the
// environment (ZERO_STAGE, ZERO_COMM_TIMEOUT_S, ZERO_SET), the command line (--config FILE,
// --zero-stage N, --set key.path=value). The merged document is validated in one place
// (validate()): an unknown key, a wrong type, an out-of-range value or a contradiction is a
// zero::Error(kConfig) whose message names the full key path and the value.
//
// Hostile input is refused, never trusted: every source is read with these bounds, and breaking
// one is a zero::Error(kConfig) naming the key path, or the source (file path, "--set",
// "ZERO_SET", the variable's name) and the byte offset:
//   - a file or JSON text of at most 16 MiB (a file is read to 16 MiB + 1 bytes, no further);
//     a path that is not a regular file (directory, FIFO, device) is kIO naming what it is;
//   - objects and arrays nested at most 64 deep (the top-level object counts; a --set key path
//     counts its components), enforced while parsing;
//   - keys at most 256 bytes, strings at most 4096 (PATH_MAX), well-formed UTF-8 (also --set
//     keys and values and the environment);
//   - numbers that fit a double (1e400 is refused; 1e-400 rounds to 0, as strtod does);
//   - no key twice in one JSON object (DeepSpeed refuses it too); a later source overriding an
//     earlier one is the layering above, not a duplicate.
// Messages quote at most 80 bytes of a key or value.
//
// Thread safety: Config is a plain value. ConfigBuilder is not synchronised.
#pragma once

#include <array>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "zero/core/dtype.hpp"
#include "zero/optim/lr_schedule.hpp"  // SchedulerConfig
#include "zero/optim/optimizer.hpp"    // ParamGroup

namespace zero {

// ---- zero_optimization.offload_optimizer / offload_param

// Where offloaded state lives: nowhere (kNone), pinned host memory (kCpu) or NVMe files (kNvme).
// Parsed once from the config's "none" | "cpu" | "nvme".
enum class OffloadDevice : std::uint8_t { kNone, kCpu, kNvme };
// "none", "cpu", "nvme".
std::string_view to_string(OffloadDevice d) noexcept;

struct OffloadConfig {
  OffloadDevice device = OffloadDevice::kNone;  // "none" | "cpu" | "nvme"
  std::string nvme_path;                        // required with device = nvme; a directory
  bool pin_memory = false;                      // stage state in page-locked host memory
  std::int64_t buffer_count = 4;                // staging buffers (DeepSpeed: 4 optimizer, 5 param)
  std::int64_t buffer_size = 100'000'000;       // elements per staging buffer (offload_param)
  bool pipeline_read = false;                   // nvme: read chunk i+1 while stepping chunk i
  bool pipeline_write = false;                  // nvme: write chunk i-1 while stepping chunk i
  // offload_optimizer: the fraction of each rank's optimizer state (and step) offloaded, in
  // [0, 1] (DeepSpeed's meaning): the trailing units whose stepped elements come closest to it;
  // the leading ones stay on the device (nvme: in pinned host memory). 1: all of it.
  double ratio = 1.0;
  // offload_optimizer (zero extension), stages 2-3: each offloaded unit's step starts on a worker
  // thread as soon as its reduced gradient shard is final in host memory during the boundary
  // micro-step's backward, with clip coefficient 1; the end of backward commits it (no clipping,
  // no overflow) or redoes it from the untouched state. Bitwise the step without it.
  bool overlap_step = false;
  std::int64_t max_in_cpu = 1'000'000'000;  // offload_param: elements kept in host memory
  bool fast_init = false;                   // accepted for compatibility; no effect
  bool enabled() const { return device != OffloadDevice::kNone; }
};

// DeepSpeed keeps 5 staging buffers for parameters, 4 for optimizer state.
inline OffloadConfig param_offload_defaults() {
  OffloadConfig o;
  o.buffer_count = 5;
  return o;
}

// ---- zero_optimization
struct ZeroOptimizationConfig {
  int stage = 0;  // 0..3
  bool contiguous_gradients = true;
  bool reduce_scatter = true;
  // Consecutive units whose gradients are reduced in one collective, up to this many elements
  // (DeepSpeed's meaning; its default is 5e8). 0 (the default here): one collective per unit,
  // which keeps stage 2's gradients in flight to one unit; set it to merge small units.
  std::int64_t reduce_bucket_size = 0;  // elements
  bool allgather_partitions = true;
  // Stages 1-2: consecutive units all-gathered after the step in one collective, up to this many
  // elements. 0 (the default here; DeepSpeed's is 5e8): one all-gather per unit.
  std::int64_t allgather_bucket_size = 0;  // elements
  bool overlap_comm = false;               // DeepSpeed turns it on for stage 3
  bool load_from_fp32_weights = true;
  bool round_robin_gradients = false;
  std::int64_t sub_group_size = 1'000'000'000;  // elements per optimizer sub-group
  // zero extension, hybrid sharding (FSDP's HSDP): shard over groups of this many consecutive
  // ranks and replicate across the groups — gradients reduce-scatter inside the group, then the
  // shard is all-reduced across groups; parameters are all-gathered inside the group. 0: shard
  // over all ranks. Stages 1-3, managed engine; must divide the world size. "node" (stored as
  // kHybridShardNode): the ranks of one node, as the launcher says (LOCAL_WORLD_SIZE,
  // OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS, SLURM_NTASKS_PER_NODE; consecutive ranks per
  // node); in-process ranks share one node. A number simulates nodes on one machine.
  static constexpr std::int64_t kHybridShardNode = -1;
  std::int64_t hybrid_shard_size = 0;
  // ZeRO++ (stage 3; DeepSpeed's keys and meaning): qwZ, the parameter all-gather carries
  // block-wise int8 values (zero/comm/quantized_comm.hpp); qgZ, the gradient reduce-scatter is an
  // all-to-all of int8 chunks reduced in f32 after reading them back (with hybrid sharding the
  // replicas' all-reduce is quantized too). DeepSpeed quantizes qgZ's intra-node hop to int4;
  // here both are int8. Below stage 3 they have no effect (logged), as in DeepSpeed.
  bool zero_quantized_weights = false;
  bool zero_quantized_gradients = false;
  // zero extension: elements per quantization block (one f32 scale each).
  std::int64_t quantization_block_size = 256;
  OffloadConfig offload_optimizer{};
  OffloadConfig offload_param = param_offload_defaults();
  // Valid only with stage 3.
  std::int64_t stage3_prefetch_bucket_size = 50'000'000;        // elements
  std::int64_t stage3_param_persistence_threshold = 100'000;    // elements
  std::int64_t stage3_model_persistence_threshold = INT64_MAX;  // elements
  std::int64_t stage3_max_live_parameters = 1'000'000'000;      // elements
  std::int64_t stage3_max_reuse_distance = 1'000'000'000;       // elements
  bool stage3_gather_16bit_weights_on_model_save = false;
};

// ---- optimizer
// A parameter-group rule of the config (optimizer.param_groups, a zero extension): a parameter
// joins the first rule it matches — it has at most max_dims dimensions (biases and norm gains:
// max_dims 1), or its name "<unit>.<param>" contains one of `names` — unless the trainer put it
// in a group of its own (ParamSpec::group, the LibTorch adapter's groups with options); the rest
// stay in group 0, the optimizer block. `group` holds the options the rule sets.
struct ParamGroupRule {
  ParamGroup group;
  std::vector<std::string> names;
  int max_dims = -1;  // -1: not by dimensions
  // `name` is "<unit>.<param>", `dims` the parameter's number of dimensions.
  bool matches(const std::string& name, std::size_t dims) const;
};

struct OptimizerConfig {
  std::string type = "AdamW";  // Adam | AdamW | SGD | Lion | Adagrad
  double lr = 1e-3;
  std::array<double, 2> betas{0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool bias_correction = true;       // Adam / AdamW
  bool adam_w_mode = true;           // Adam: decoupled decay (DeepSpeed's default); false: L2
  double momentum = 0.0;             // SGD
  double dampening = 0.0;            // SGD
  bool nesterov = false;             // SGD
  std::string moment_dtype = "f32";  // zero extension: f32 | bf16 | int8 moments
  // The keys the config set ("type", "lr", "betas", "eps", "weight_decay", "adam_w_mode",
  // "momentum", ...; params' keys by their own name): an adapter that takes the trainer's own
  // optimizer options (zero::torch) refuses a value given both ways differently.
  std::set<std::string> given;
  // optimizer.param_groups: the rules, in order (groups after the trainer's own).
  std::vector<ParamGroupRule> param_groups;
};

// ---- scheduler: SchedulerConfig (DeepSpeed names) is the schedule's own input, in
// zero/optim/lr_schedule.hpp.

// ---- fp16 (dynamic loss scaling, DeepSpeed semantics)
struct Fp16Config {
  bool enabled = false;
  bool auto_cast = false;
  double loss_scale = 0.0;              // 0: dynamic; > 0: static scale
  int initial_scale_power = 16;         // dynamic scale starts at 2^power
  int loss_scale_window = 1000;         // steps without overflow before the scale doubles
  int hysteresis = 2;                   // overflows tolerated before the scale halves
  bool consecutive_hysteresis = false;  // refill hysteresis after every good step
  double min_loss_scale = 1.0;
};

struct Bf16Config {
  bool enabled = false;
};

// ---- activation_checkpointing
struct ActivationCheckpointingConfig {
  bool partition_activations = false;
  bool contiguous_memory_optimization = false;
  bool cpu_checkpointing = false;
  std::int64_t number_checkpoints = 0;  // 0: not set
  bool synchronize_checkpoint_boundary = false;
  bool profile = false;
};

// ---- aio (NVMe offload I/O)
struct AioConfig {
  std::int64_t block_size = 1'048'576;  // bytes per request; multiple of 4096
  int queue_depth = 8;
  int thread_count = 1;
  bool single_submit = false;
  bool overlap_events = true;
  // zero extension: the I/O engine. io_uring where the kernel allows it (else, with a log
  // line, what "threads" is); threads: `thread_count` pread/pwrite threads.
  std::string engine = "io_uring";  // io_uring | threads
};

// ---- trace (zero extension: a timeline of the run, zero/core/trace.hpp)
struct TraceConfig {
  // The engine records a timeline into a tracer of its own (Engine::tracer()) when
  // EngineOptions::tracer gives none. zero-train / zero-bench --trace FILE set it.
  bool enabled = false;
  // Where zero-train and zero-bench write it (Chrome trace JSON; Engine::write_trace).
  std::string path = "zero-trace.json";
  // Events kept per rank (the newest; older ones are dropped and counted). >= 1.
  std::int64_t capacity = 1'048'576;
};

struct Config {
  // train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x world size,
  // checked at engine start (resolve_batch). 0: not set (nothing to check; it stays 0, so a
  // checkpoint's config does not pin the world size).
  std::int64_t train_batch_size = 0;
  std::int64_t train_micro_batch_size_per_gpu = 1;
  std::int64_t gradient_accumulation_steps = 1;
  // Whether a source gave the key (the reader sets these). With train_batch_size set, the one of
  // the two not given is derived, as DeepSpeed does; a value other than 1 counts as given, so a
  // Config filled in code needs not set them.
  bool micro_batch_given = false;
  bool accumulation_given = false;
  double gradient_clipping = 0.0;  // 0: off
  ZeroOptimizationConfig zero_optimization{};
  OptimizerConfig optimizer{};
  SchedulerConfig scheduler{};
  Fp16Config fp16{};
  Bf16Config bf16{};
  ActivationCheckpointingConfig activation_checkpointing{};
  AioConfig aio{};
  TraceConfig trace{};
  // zero extensions (top level)
  // Seconds, every collective wait; env ZERO_COMM_TIMEOUT_S; in [0.1, 1e7] (below 0.1 s a healthy
  // collective on a loaded machine times out). The default must equal kDefaultCommTimeoutS
  // (zero/comm/comm.hpp, not included here: the config does not depend on the communicator).
  double comm_timeout_s = 600.0;
  std::string comm_backend = "auto";  // auto | thread | mpi | nccl
  // Cross-rank checks of every collective (zero::CommDebug, zero/comm/comm.hpp): "off" | "detail";
  // env ZERO_COMM_DEBUG. detail: MPI / NCCL ranks that disagree on a collective fail at it, naming
  // both calls and their units, instead of at the timeout (one 48-byte all-gather more each).
  std::string comm_debug = "off";
  // The flight recorder (Communicator::set_flight_recorder): collectives kept per rank, in
  // [0, 1e6] (0: off), and the directory each rank writes flight_rank<r>.json to on a failure, on
  // SIGUSR1 and on SIGTERM ("": a summary to stderr on a failure only; env ZERO_COMM_FLIGHT_DIR).
  std::size_t comm_flight_recorder = 64;
  std::string comm_flight_dir;
  // Reduction dtype of gradients ("" = fp32 for 16-bit training, the gradient dtype otherwise).
  std::string communication_data_type;  // "" | fp32 | fp16 | bf16

  // The batch keys for `world_size` ranks, DeepSpeed's rules (runtime/config.py,
  // _set_batch_related_parameters and _batch_assertion): with train_batch_size and one of micro
  // batch / accumulation given, the other is derived (train / (given x world size)); with
  // neither given, accumulation is 1 and the micro batch train / world size; with both given,
  // train must equal micro x accumulation x world size. Throws zero::Error(kConfig) naming the
  // three numbers and the world size when no whole value fits. The engine calls it at start and
  // keeps the result (Engine::config()).
  Config resolve_batch(int world_size) const;
  // resolve_batch's check without the result.
  void validate_for_world_size(int world_size) const;
  // The merged configuration as JSON (every key, defaults included).
  std::string to_json() const;
};

// Builds a Config from layered sources; build() validates. Later calls override earlier ones.
class ConfigBuilder {
 public:
  ConfigBuilder();
  ~ConfigBuilder();
  ConfigBuilder(ConfigBuilder&&) noexcept;
  ConfigBuilder& operator=(ConfigBuilder&&) noexcept;

  // Merges a JSON object (deep merge: nested objects merge key by key). `source` names the
  // origin in error messages. Throws kConfig on a parse error (with the byte offset), a
  // non-object, or input past the bounds above (naming the key path).
  ConfigBuilder& merge_json(std::string_view text, std::string_view source = "<string>");
  // Reads and merges a file. Throws kIO if unreadable or not a regular file, kConfig if larger
  // than 16 MiB or not valid JSON.
  ConfigBuilder& merge_file(const std::string& path);
  // Sets one key: "zero_optimization.stage=2". The value is parsed as JSON when it parses
  // (numbers, true/false, null, arrays), else taken as a string; a value that starts with
  // '"', '[' or '{' must be valid JSON, and one that parses but breaks a bound (1e400, nesting)
  // is an error, not a string.
  ConfigBuilder& set(std::string_view assignment, std::string_view source = "--set");
  // Applies ZERO_CONFIG (a file, merged first), ZERO_STAGE, ZERO_COMM_TIMEOUT_S,
  // ZERO_COMM_BACKEND, ZERO_OFFLOAD_OPTIMIZER, ZERO_NVME_PATH and ZERO_SET ("k=v;k=v").
  ConfigBuilder& apply_env();
  // Consumes --config FILE, --zero-stage N, --set k=v (also --flag=value forms) from args and
  // returns the arguments it did not consume, in order. Throws kConfig on a flag without value.
  std::vector<std::string> apply_args(const std::vector<std::string>& args);

  // Validates the merged document and returns the Config.
  Config build() const;

 private:
  struct Impl;
  Impl* impl_;
};

// Shorthands. parse: one JSON string. load: a file. from_command_line: file given by
// --config (if any), then env, then the remaining flags; unconsumed args go to `rest`.
Config parse_config(std::string_view json_text);
Config load_config(const std::string& path);
Config config_from_command_line(int argc, const char* const* argv,
                                std::vector<std::string>* rest = nullptr);

// The working dtype a config trains in (fp16.enabled: f16, bf16.enabled: bf16, else f32) and
// the dtype gradients are reduced and accumulated in (communication_data_type; default f32).
DType working_dtype(const Config& config);
DType reduce_dtype_of(const Config& config);

}  // namespace zero
