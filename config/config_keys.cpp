// The table of accepted config keys (see config/config_keys.hpp). One row per key; the
// meanings of no-effect rows are the messages the reader logs.
#include "config/config_keys.hpp"

#include <array>

namespace zero::detail {

namespace {

constexpr ConfigKey I(std::string_view path, std::string_view sample, std::string_view test,
                      std::string_view meaning, std::string_view context = "") {
  return {path, KeyHandling::kImplemented, "", sample, test, meaning, context};
}
constexpr ConfigKey N(std::string_view path, std::string_view quiet, std::string_view sample,
                      std::string_view meaning) {
  return {path, KeyHandling::kNoEffect, quiet, sample, "", meaning};
}
constexpr ConfigKey R(std::string_view path, std::string_view quiet, std::string_view sample,
                      std::string_view meaning) {
  return {path, KeyHandling::kRefused, quiet, sample, "", meaning};
}

constexpr std::string_view kCfg = "tests/config/config_test.cpp";
constexpr std::string_view kKeys = "tests/config/config_keys_test.cpp";
constexpr std::string_view kEng = "tests/engine/engine_test.cpp";
constexpr std::string_view kOpt = "tests/optim/optimizer_test.cpp";
constexpr std::string_view kSched = "tests/optim/lr_schedule_test.cpp";
constexpr std::string_view kScaler = "tests/optim/loss_scaler_test.cpp";
constexpr std::string_view kOffload = "tests/offload/offload_test.cpp";

// clang-format off
constexpr std::array kKeysTable = {
// ---- batch, clipping, precision
I("train_batch_size", "8", kCfg, "checked against micro x accumulation x ranks; derives the one not given (DeepSpeed's rules)"),
I("train_micro_batch_size_per_gpu", "2", kCfg, "sequences per rank per micro-step (the trainer's; the batch rules)"),
I("gradient_accumulation_steps", "2", "tests/engine/accumulation_test.cpp", "micro-steps per step; the step's gradient is the mean over N x A micro-batches"),
I("gradient_clipping", "1.0", kEng, "clips the step's global norm (max_norm / (norm + 1e-6))"),
I("communication_data_type", "\"fp16\"", kCfg, "dtype gradients are reduced and accumulated in"),
I("fp16.enabled", "true", "tests/engine/gpt_model_test.cpp", "f16 working parameters and gradients, fp32 master, loss scaling"),
N("fp16.auto_cast", "false", "true", "DeepSpeed casts the module's floating inputs to fp16 in forward; here the trainer's forward is its own code and takes the dtype the engine hands out"),
I("fp16.loss_scale", "128.0", kScaler, "0: dynamic loss scaling; > 0: this static scale"),
I("fp16.initial_scale_power", "8", "tests/engine/gpt_model_test.cpp", "the dynamic scale starts at 2^power"),
I("fp16.loss_scale_window", "100", kScaler, "steps without overflow before the scale doubles"),
I("fp16.hysteresis", "3", kScaler, "overflows tolerated before the scale halves"),
I("fp16.consecutive_hysteresis", "true", kCfg, "refill hysteresis after every good step"),
I("fp16.min_loss_scale", "2.0", kScaler, "the dynamic scale's floor"),
R("fp16.fp16_master_weights_and_grads", "false", "true", "master weights are fp32 here; true is refused"),
I("bf16.enabled", "true", "tests/engine/gpt_model_test.cpp", "bf16 working parameters and gradients, fp32 master"),
N("bf16.immediate_grad_update", "", "true", "DeepSpeed's bf16 optimizer then accumulates each gradient into its fp32 buffer as backward produces it; here gradients are accumulated in the reduce dtype (communication_data_type) as each unit is ready, whatever the value"),
I("bfloat16.enabled", "true", kKeys, "DeepSpeed's older spelling of bf16.enabled"),
// ---- zero_optimization
I("zero_optimization.stage", "2", kEng, "0: DDP; 1: optimizer state sharded; 2: + gradients; 3: + parameters"),
N("zero_optimization.contiguous_gradients", "true", "false", "DeepSpeed then leaves gradients in separate tensors instead of copying them into one contiguous buffer (a fragmentation trade-off); here every unit's gradients are one flat buffer by design"),
I("zero_optimization.reduce_scatter", "false", "tests/engine/config_keys_effect_test.cpp", "false: stages 1-2 reduce gradients with an all-reduce and keep this rank's part (bitwise the reduce-scatter in process); stage 3 always reduce-scatters (named)", R"({"zero_optimization": {"stage": 2}})"),
I("zero_optimization.reduce_bucket_size", "1000", "tests/engine/bucket_test.cpp", "consecutive units reduced in one collective, up to this many elements (0: one per unit)"),
N("zero_optimization.allgather_partitions", "true", "false", "DeepSpeed then broadcasts each rank's updated partition instead of one all-gather; the result is the same, and the all-gather is what runs here"),
I("zero_optimization.allgather_bucket_size", "1000", "tests/engine/bucket_test.cpp", "stages 1-2: consecutive units all-gathered after the step in one collective"),
I("zero_optimization.overlap_comm", "false", "tests/engine/overlap_test.cpp", "reductions stay in flight while the trainer computes (default true at stage 3)"),
N("zero_optimization.load_from_fp32_weights", "true", "false", "DeepSpeed then rebuilds the fp32 master from the 16-bit weights on checkpoint load; checkpoints here always restore the fp32 master they saved"),
N("zero_optimization.round_robin_gradients", "false", "true", "DeepSpeed then spreads the copy of gradients to the offloaded partition over ranks round-robin (a load balance of CPU offload); here each rank copies only its own shards, which is already balanced"),
N("zero_optimization.sub_group_size", "1000000000", "1000", "DeepSpeed's stage 3 then steps the optimizer in sub-groups of this many elements to bound its fp32 staging; here the device step needs no staging and the offloaded step runs in chunks of offload_optimizer.buffer_size"),
I("zero_optimization.hybrid_shard_size", "2", "tests/engine/hybrid_test.cpp", "zero extension: shard over groups of this many ranks, replicate across groups (HSDP)"),
I("zero_optimization.zero_quantized_weights", "true", "tests/engine/quantized_test.cpp", "ZeRO++ qwZ: stage 3's parameter all-gather in block-wise int8"),
I("zero_optimization.zero_quantized_gradients", "true", "tests/engine/quantized_test.cpp", "ZeRO++ qgZ: stage 3's gradient reduce-scatter as int8 all-to-all"),
I("zero_optimization.quantization_block_size", "128", "tests/engine/quantized_test.cpp", "zero extension: elements per quantization block"),
I("zero_optimization.stage3_prefetch_bucket_size", "1", kEng, "stage 3: elements of the next units prefetched while the current one runs"),
I("zero_optimization.stage3_param_persistence_threshold", "0", "tests/engine/accumulation_test.cpp", "stage 3: units at most this large are kept whole"),
N("zero_optimization.stage3_model_persistence_threshold", "9223372036854775807", "1000", "DeepSpeed caps the total size of persistent (unpartitioned) parameters at this; here every unit at most stage3_param_persistence_threshold is kept whole, without a cap"),
I("zero_optimization.stage3_max_live_parameters", "1000", kEng, "stage 3: at most this many gathered elements alive at once"),
N("zero_optimization.stage3_max_reuse_distance", "1000000000", "1000", "DeepSpeed's stage 3 then keeps a gathered parameter whose next use is within this many elements instead of releasing it; here a unit stays gathered while the trainer holds it and the prefetch coordinator brings the next units in, bounded by stage3_max_live_parameters"),
N("zero_optimization.stage3_gather_16bit_weights_on_model_save", "false", "true", "DeepSpeed's save_16bit_model() then gathers stage 3's weights into one file; here full weights are always available at every stage (Engine::read_param, ckpt export, zero-ckpt consolidate to safetensors)"),
N("zero_optimization.stage3_gather_fp16_weights_on_model_save", "false", "true", "older spelling of stage3_gather_16bit_weights_on_model_save: full weights are always available here (ckpt export, zero-ckpt consolidate)"),
R("zero_optimization.cpu_offload", "", "true", "deprecated in DeepSpeed; refused, naming offload_optimizer"),
N("zero_optimization.elastic_checkpoint", "true", "false", "DeepSpeed then saves stage 1-2 checkpoints that load only at the same world size; checkpoints here load at any world size"),
N("zero_optimization.ignore_unused_parameters", "true", "false", "DeepSpeed's stage 3 then fails for parameters that get no gradient; here a unit without gradients counts as zero"),
N("zero_optimization.legacy_stage1", "false", "true", "DeepSpeed's deprecated stage-1 implementation; stage 1 here is the one engine's policy"),
N("zero_optimization.memory_efficient_linear", "true", "false", "DeepSpeed's stage 3 swaps torch.nn.functional.linear for its own autograd function; the trainer's layers here are its own code"),
N("zero_optimization.use_multi_rank_bucket_allreduce", "true", "false", "DeepSpeed's MiCS/hybrid bucket all-reduce variant; hybrid sharding here reduces per bucket across the replicas"),
// ---- zero_optimization.offload_optimizer / offload_param
I("zero_optimization.offload_optimizer.device", "\"cpu\"", kOffload, "none | cpu (pinned host memory) | nvme (swap files): master and optimizer state, stepped there"),
I("zero_optimization.offload_optimizer.nvme_path", "\"/tmp/zero-keys\"", kOffload, "directory of the optimizer swap files (device nvme)"),
N("zero_optimization.offload_optimizer.pin_memory", "true", "false", "DeepSpeed then keeps offloaded state in pageable memory; it is always page-locked here (faster copies, the same values)"),
I("zero_optimization.offload_optimizer.buffer_count", "2", kOffload, "staging buffers of the offloaded step's chunk pipeline"),
I("zero_optimization.offload_optimizer.buffer_size", "4096", kOffload, "elements per chunk of the offloaded step"),
I("zero_optimization.offload_optimizer.pipeline_read", "true", kOffload, "nvme: read chunk i+1 while stepping chunk i"),
I("zero_optimization.offload_optimizer.pipeline_write", "true", kOffload, "nvme: write chunk i-1 while stepping chunk i"),
N("zero_optimization.offload_optimizer.fast_init", "false", "true", "DeepSpeed then skips initialising the swap files through the aio pipeline; here they are written once at start either way"),
I("zero_optimization.offload_optimizer.ratio", "0.5", "tests/offload/partial_offload_test.cpp", "the fraction of each rank's optimizer state and step offloaded (DeepSpeed's partial offload): the trailing units whose stepped elements come closest to it; the leading ones stay on the device (nvme: the fraction in the swap file, the rest in pinned host memory)"),
I("zero_optimization.offload_optimizer.overlap_step", "true", "tests/offload/overlap_step_test.cpp", "zero extension: stages 2-3, the offloaded step of each unit starts speculatively (clip coefficient 1) when its reduced gradient shard lands in host memory during the boundary micro-step's backward; the end of backward commits it, or redoes it when clipping engages (skipped on overflow): bitwise the step without it. Held results: pinned units in a window of offload_optimizer.buffer_count chunks, NVMe units in a second slot of the swap file"),
I("zero_optimization.offload_param.device", "\"cpu\"", "tests/offload/offload_observe_test.cpp", "stage 3: parameter shards in pinned host memory or an NVMe swap file"),
I("zero_optimization.offload_param.nvme_path", "\"/tmp/zero-keys\"", kOffload, "directory of the parameter swap file"),
N("zero_optimization.offload_param.pin_memory", "true", "false", "DeepSpeed then keeps offloaded parameters in pageable memory; they are always page-locked here"),
N("zero_optimization.offload_param.buffer_count", "", "3", "DeepSpeed's count of parameter swap buffers; here the gatherer's window of gathered units is the only buffer (stage3_max_live_parameters bounds it)"),
N("zero_optimization.offload_param.buffer_size", "", "1000", "DeepSpeed's size of parameter swap buffers; here parameters move a unit at a time into the gatherer's window"),
N("zero_optimization.offload_param.pipeline_read", "", "true", "DeepSpeed's option for the optimizer swapper, read but unused for parameters; the parameter file is prefetched by the gatherer"),
N("zero_optimization.offload_param.pipeline_write", "", "true", "DeepSpeed's option for the optimizer swapper, read but unused for parameters; updated shards reach the file through the offloaded step"),
N("zero_optimization.offload_param.fast_init", "false", "true", "DeepSpeed then skips initialising the swap file through the aio pipeline; here it is written once at start either way"),
N("zero_optimization.offload_param.max_in_cpu", "", "1000", "DeepSpeed keeps up to this many parameter elements in CPU memory with nvme offload; here nvme keeps them all in the file and only gathered units in memory"),
// ---- optimizer
I("optimizer.type", "\"SGD\"", kOpt, "Adam | AdamW | SGD | Lion | Adagrad"),
I("optimizer.params.lr", "0.01", kEng, "learning rate (the schedule's base)"),
I("optimizer.params.betas", "[0.8, 0.99]", kOpt, "Adam / AdamW: moment decays; Lion: interpolation and decay"),
I("optimizer.params.eps", "1e-6", kOpt, "Adam / AdamW / Adagrad denominator term"),
I("optimizer.params.weight_decay", "0.1", kOpt, "AdamW / Lion / Adam with adam_w_mode: decoupled; SGD / Adagrad: L2"),
I("optimizer.params.bias_correction", "false", kOpt, "Adam / AdamW bias correction"),
I("optimizer.params.adam_w_mode", "false", kOpt, "Adam: decoupled decay (default) or L2; AdamW refuses false"),
N("optimizer.params.torch_adam", "false", "true", "DeepSpeed then runs torch.optim.Adam instead of its fused kernel; the update here is the same rule in zero's own kernels"),
R("optimizer.params.amsgrad", "false", "true", "AMSGrad is refused"),
I("optimizer.params.moment_dtype", "\"bf16\"", kOpt, "zero extension: f32, bf16 or int8 (block-wise 8-bit, as bitsandbytes) Adam moments"),
I("optimizer.params.momentum", "0.5", kOpt, "SGD momentum"),
I("optimizer.params.dampening", "0.1", kOpt, "SGD dampening"),
I("optimizer.params.nesterov", "true", kOpt, "SGD Nesterov momentum"),
I("optimizer.param_groups", R"([{"name": "no_decay", "match": {"max_dims": 1}, "params": {"weight_decay": 0.0}}])", "tests/engine/param_groups_test.cpp", "zero extension: parameter-group rules, in order: a parameter joins the first whose match it meets (max_dims: at most that many dimensions; names: \"<unit>.<param>\" contains one), with the options it sets over the optimizer block's (lr, betas, eps, weight_decay, momentum, dampening, nesterov, bias_correction); the schedule sets each group's lr"),
// ---- scheduler
I("scheduler.type", "\"WarmupLR\"", kSched, "WarmupLR | WarmupDecayLR | WarmupCosineLR | OneCycle (none: constant lr)"),
I("scheduler.params.warmup_min_lr", "0.0001", kSched, "WarmupLR / WarmupDecayLR start lr"),
I("scheduler.params.warmup_max_lr", "0.002", kSched, "WarmupLR / WarmupDecayLR peak lr"),
I("scheduler.params.warmup_num_steps", "10", kSched, "warmup steps"),
I("scheduler.params.warmup_type", "\"linear\"", kSched, "log | linear warmup"),
N("scheduler.params.last_batch_iteration", "-1", "5", "DeepSpeed starts the schedule at this iteration when resuming by hand; here a resumed run continues the schedule from the checkpoint's step"),
I("scheduler.params.total_num_steps", "2000", kSched, "WarmupDecayLR / WarmupCosineLR length"),
I("scheduler.params.warmup_min_ratio", "0.1", kSched, "WarmupCosineLR start ratio of the optimizer lr"),
I("scheduler.params.cos_min_ratio", "0.01", kSched, "WarmupCosineLR floor ratio"),
I("scheduler.params.cycle_min_lr", "0.0001", kSched, "OneCycle low lr"),
I("scheduler.params.cycle_max_lr", "0.02", kSched, "OneCycle peak lr"),
I("scheduler.params.decay_lr_rate", "0.1", kSched, "OneCycle post-cycle lr decay"),
I("scheduler.params.cycle_first_step_size", "10", kSched, "OneCycle steps of the rising half"),
I("scheduler.params.cycle_second_step_size", "20", kSched, "OneCycle steps of the falling half (0: as the first)"),
N("scheduler.params.cycle_first_stair_count", "0", "2", "DeepSpeed's OneCycle stores it but never reads it (no staircase); the same here"),
N("scheduler.params.cycle_second_stair_count", "0", "2", "DeepSpeed's OneCycle stores it but never reads it (no staircase); the same here"),
I("scheduler.params.decay_step_size", "5", kSched, "OneCycle post-cycle decay interval"),
I("scheduler.params.cycle_momentum", "false", "tests/engine/config_keys_effect_test.cpp", "OneCycle cycles Adam / AdamW / Lion beta1 (and sets beta2 = 0.99, as DeepSpeed); SGD / Adagrad: disabled with a message, as DeepSpeed"),
I("scheduler.params.cycle_min_mom", "0.85", "tests/engine/config_keys_effect_test.cpp", "OneCycle low beta1"),
I("scheduler.params.cycle_max_mom", "0.95", "tests/engine/config_keys_effect_test.cpp", "OneCycle high beta1"),
I("scheduler.params.decay_mom_rate", "0.1", kSched, "OneCycle post-cycle beta1 growth"),
// ---- activation_checkpointing
N("activation_checkpointing.partition_activations", "false", "true", "DeepSpeed then splits kept activations across model-parallel ranks; zero has no model parallelism (every rank holds whole activations of its own batch)"),
N("activation_checkpointing.contiguous_memory_optimization", "false", "true", "DeepSpeed then copies kept activations into one preallocated buffer against fragmentation; here each kept input is one buffer allocated once and reused every step"),
I("activation_checkpointing.cpu_checkpointing", "true", "tests/engine/checkpointing_test.cpp", "kept inputs in pinned host memory (Checkpointer, zero::torch, zero-train, zero-bench)"),
I("activation_checkpointing.number_checkpoints", "2", "tests/engine/checkpointing_test.cpp", "segments spread evenly over the layers (Checkpointer, zero::torch, zero-train, zero-bench)"),
N("activation_checkpointing.synchronize_checkpoint_boundary", "false", "true", "DeepSpeed then synchronises the CUDA device at each checkpoint boundary (for profiling); here the timeline (trace.enabled) shows the boundaries without a synchronisation"),
N("activation_checkpointing.profile", "false", "true", "DeepSpeed then times each checkpointed forward; here the timeline (trace.enabled) records them"),
// ---- aio
I("aio.block_size", "8192", "tests/offload/offload_observe_test.cpp", "bytes per I/O request (multiple of 4096)"),
I("aio.queue_depth", "4", kOffload, "requests in flight"),
I("aio.thread_count", "2", kOffload, "workers of the threads engine"),
N("aio.single_submit", "false", "true", "DeepSpeed then submits requests one by one; the queue here submits what fits the queue depth at once"),
N("aio.overlap_events", "true", "false", "DeepSpeed then waits for each batch before submitting the next; completions here are reaped while requests are submitted"),
I("aio.engine", "\"threads\"", kOffload, "zero extension: io_uring or a thread pool"),
N("aio.intra_op_parallelism", "", "2", "DeepSpeed's threads per I/O operation; here aio.thread_count sets the threads engine's workers (io_uring needs none)"),
N("aio.use_gds", "false", "true", "DeepSpeed then reads NVMe straight into GPU memory (GPUDirect Storage); here swap files go through pinned host memory"),
// ---- zero extensions
I("trace.enabled", "true", "tests/core/trace_test.cpp", "zero extension: record a timeline"),
I("trace.path", "\"t.json\"", "tests/core/trace_test.cpp", "zero extension: where zero-train / zero-bench write it"),
I("trace.capacity", "100", kEng, "zero extension: events kept per rank"),
I("comm_timeout_s", "5.0", "tests/fault/thread_rank_test.cpp", "zero extension: seconds every collective wait may take"),
I("comm_backend", "\"thread\"", "tests/comm/comm_config_test.cpp", "zero extension: auto | thread | mpi | nccl"),
I("comm_debug", "\"detail\"", "tests/comm/comm_config_test.cpp", "zero extension: off | detail (MPI / NCCL ranks check each collective's fingerprint)"),
I("comm_flight_recorder", "16", "tests/comm/comm_config_test.cpp", "zero extension: collectives the flight recorder keeps per rank (0: off)"),
I("comm_flight_dir", "\"flight\"", "tests/comm/comm_config_test.cpp", "zero extension: where each rank writes its flight record (on a failure, SIGUSR1, SIGTERM)"),
// ---- DeepSpeed engine features outside ZeRO
N("steps_per_print", "", "10", "DeepSpeed's engine logs every this many steps; here Engine::step() returns StepMetrics and zero-train prints its own progress"),
N("wall_clock_breakdown", "false", "true", "DeepSpeed then times forward / backward / step; here StepMetrics carries the phases and trace.enabled the timeline"),
N("dump_state", "false", "true", "DeepSpeed then prints its engine state at start; zero-env prints the resolved config"),
N("prescale_gradients", "false", "true", "DeepSpeed then divides gradients before the all-reduce (fp16 range); reductions here average in the reduce dtype (fp32 by default), which keeps the range"),
N("gradient_predivide_factor", "1.0", "2.0", "DeepSpeed then divides by this before and the rest after the reduction (fp16 range); reductions here average in the reduce dtype (fp32 by default)"),
N("zero_allow_untested_optimizer", "", "true", "DeepSpeed's guard for client optimizers; every optimizer here is zero's own"),
N("tensorboard", "", "{\"enabled\": true}", "DeepSpeed's monitor; here StepMetrics (zero-train --metrics) and the trace are the records"),
N("wandb", "", "{\"enabled\": true}", "DeepSpeed's monitor; here StepMetrics (zero-train --metrics) and the trace are the records"),
N("csv_monitor", "", "{\"enabled\": true}", "DeepSpeed's monitor; here StepMetrics (zero-train --metrics) and the trace are the records"),
N("comms_logger", "", "{\"enabled\": true}", "DeepSpeed's collective logger; here the communicator counts bytes per collective (StepMetrics) and the trace times them"),
N("flops_profiler", "", "{\"enabled\": true}", "DeepSpeed's FLOPs profiler needs its torch module hooks; the trainer's model here is its own code"),
N("memory_breakdown", "false", "true", "DeepSpeed then prints memory use; here the MemoryTracker reports every byte by category (zero-bench, StepMetrics)"),
N("zero_force_ds_cpu_optimizer", "", "false", "DeepSpeed's guard that offload uses its CPU Adam; the offloaded step here is always zero's own CPU optimizer"),
};
// clang-format on

}  // namespace

std::span<const ConfigKey> config_keys() { return kKeysTable; }

const ConfigKey* find_config_key(std::string_view path) {
  for (const ConfigKey& k : kKeysTable) {
    if (k.path == path) return &k;
  }
  return nullptr;
}

bool is_quiet(const ConfigKey& row, const nlohmann::json& value) {
  if (value.is_object()) {
    auto it = value.find("enabled");
    if (it != value.end() && *it == false) return true;
  }
  if (row.quiet.empty()) return false;
  return nlohmann::json::parse(row.quiet) == value;
}

}  // namespace zero::detail
