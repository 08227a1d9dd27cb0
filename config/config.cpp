// Config reading: the merged JSON document read into the structs and validated in one place
// (detail::Reader, config/config_reader.cpp), so every error names the full key path and the
// offending value. The sources are config/config_builder.cpp's.
#include "zero/config/config.hpp"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "config/config_reader.hpp"
#include "config/stage_policy.hpp"
#include "zero/core/error.hpp"
#include "zero/core/log.hpp"

namespace zero {

using nlohmann::json;

namespace {

using detail::Reader;

constexpr std::int64_t kMax = INT64_MAX;
constexpr double kInf = std::numeric_limits<double>::infinity();
// Below 0.1 s a collective on a loaded machine times out in a healthy run (the smallest the
// tests configure is 0.25 s). Documented at Config::comm_timeout_s.
constexpr double kMinCommTimeoutS = 0.1;

}  // namespace

std::string_view to_string(OffloadDevice d) noexcept {
  switch (d) {
    case OffloadDevice::kCpu: return "cpu";
    case OffloadDevice::kNvme: return "nvme";
    case OffloadDevice::kNone: break;
  }
  return "none";
}

namespace {

void read_offload(Reader r, OffloadConfig& o, bool optimizer) {
  std::string device(to_string(o.device));
  r.get("device", device, {"none", "cpu", "nvme"});
  o.device = device == "cpu"    ? OffloadDevice::kCpu
             : device == "nvme" ? OffloadDevice::kNvme
                                : OffloadDevice::kNone;
  r.get("nvme_path", o.nvme_path);
  r.get("pin_memory", o.pin_memory);
  r.get_int("buffer_count", o.buffer_count, 1, 1024);
  r.get_int("buffer_size", o.buffer_size, 1, kMax);
  r.get("pipeline_read", o.pipeline_read);
  r.get("pipeline_write", o.pipeline_write);
  r.get("fast_init", o.fast_init);
  if (optimizer) {
    // DeepSpeed's partial offload (ZeRO-Offload++): the fraction of the optimizer state
    // offloaded (nvme: on NVMe, the rest in pinned host memory); the placement cuts it by unit.
    r.get_num("ratio", o.ratio, 0.0, 1.0);
    // Zero extension: the offloaded step during backward (the placement refuses it where it
    // cannot apply: it needs the gradient partition on the host, stages 2-3).
    r.get("overlap_step", o.overlap_step);
  } else {
    r.get_int("max_in_cpu", o.max_in_cpu, 0, kMax);
  }
  if (o.device == OffloadDevice::kNvme && o.nvme_path.empty()) {
    r.fail_msg("nvme_path", "required when device is \"nvme\"");
  }
  r.finish();
}

void read_zero(Reader r, ZeroOptimizationConfig& z) {
  r.get_int("stage", z.stage, 0, 3);
  r.get("contiguous_gradients", z.contiguous_gradients);
  r.get("reduce_scatter", z.reduce_scatter);
  r.get_int("reduce_bucket_size", z.reduce_bucket_size, 0, kMax);
  r.get("allgather_partitions", z.allgather_partitions);
  r.get_int("allgather_bucket_size", z.allgather_bucket_size, 0, kMax);
  const detail::StagePolicy policy = detail::StagePolicy::of(z.stage);
  if (policy.shard_params) z.overlap_comm = true;  // DeepSpeed's default for stage 3
  r.get("overlap_comm", z.overlap_comm);
  r.get("load_from_fp32_weights", z.load_from_fp32_weights);
  r.get("round_robin_gradients", z.round_robin_gradients);
  r.get_int("sub_group_size", z.sub_group_size, 1, kMax);
  if (const json* v = r.find("hybrid_shard_size"); v != nullptr && v->is_string()) {
    if (v->get<std::string>() != "node") {
      r.fail("hybrid_shard_size", *v, "must be a number of ranks or \"node\"");
    }
    z.hybrid_shard_size = ZeroOptimizationConfig::kHybridShardNode;
  } else {
    r.get_int("hybrid_shard_size", z.hybrid_shard_size, 0, 1 << 24);
  }
  if (z.hybrid_shard_size != 0 && z.stage == 0) {
    r.fail_msg("hybrid_shard_size", "needs stage 1-3 (stage 0 shards nothing)");
  }
  r.get("zero_quantized_weights", z.zero_quantized_weights);
  r.get("zero_quantized_gradients", z.zero_quantized_gradients);
  r.get_int("quantization_block_size", z.quantization_block_size, 1, 1 << 24);
  read_offload(r.sub("offload_optimizer"), z.offload_optimizer, true);
  read_offload(r.sub("offload_param"), z.offload_param, false);
  const char* stage3_keys[] = {"stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
                               "stage3_model_persistence_threshold", "stage3_max_live_parameters",
                               "stage3_max_reuse_distance"};
  r.get_int("stage3_prefetch_bucket_size", z.stage3_prefetch_bucket_size, 0, kMax);
  r.get_int("stage3_param_persistence_threshold", z.stage3_param_persistence_threshold, 0, kMax);
  r.get_int("stage3_model_persistence_threshold", z.stage3_model_persistence_threshold, 0, kMax);
  r.get_int("stage3_max_live_parameters", z.stage3_max_live_parameters, 1, kMax);
  r.get_int("stage3_max_reuse_distance", z.stage3_max_reuse_distance, 0, kMax);
  r.get("stage3_gather_16bit_weights_on_model_save", z.stage3_gather_16bit_weights_on_model_save);
  r.get("stage3_gather_fp16_weights_on_model_save", z.stage3_gather_16bit_weights_on_model_save);
  if (!policy.shard_params) {
    // DeepSpeed ignores stage-3 tuning keys below stage 3; say so rather than fail.
    for (const char* k : {"zero_quantized_weights", "zero_quantized_gradients"}) {
      r.note(k, "quantizes stage 3's collectives; it has no effect at stage " +
                    std::to_string(z.stage));
    }
    for (const char* k : stage3_keys) {
      r.note(k, "applies only with stage 3 (stage is " + std::to_string(z.stage) + ")");
    }
    if (z.offload_param.enabled()) {
      r.fail_msg("offload_param.device", "parameter offload (\"" +
                                             std::string(to_string(z.offload_param.device)) +
                                             "\") requires zero_optimization.stage = 3, stage is " +
                                             std::to_string(z.stage));
    }
  }
  if (policy.shard_params && !z.reduce_scatter) {
    r.note("reduce_scatter",
           "= false has no effect at stage 3: parameters are sharded, so each rank needs only its "
           "part of the reduced gradients (the reduce-scatter)");
  }
  if (!policy.shard_optimizer && z.offload_optimizer.enabled()) {
    r.fail_msg("offload_optimizer.device",
               "optimizer offload requires zero_optimization.stage >= 1");
  }
  if (r.has("cpu_offload")) {
    r.fail_msg("cpu_offload", "deprecated; use offload_optimizer: {\"device\": \"cpu\"}");
  }
  for (const char* k : {"elastic_checkpoint", "ignore_unused_parameters", "legacy_stage1",
                        "memory_efficient_linear", "use_multi_rank_bucket_allreduce"}) {
    r.ignore(k);
  }
  r.finish();
}

void read_optimizer(Reader r, OptimizerConfig& o) {
  if (r.present("type")) o.given.insert("type");
  r.get("type", o.type, detail::kOptimizerTypes);
  Reader p = r.sub("params");
  for (const char* k : {"lr", "betas", "eps", "weight_decay", "adam_w_mode", "bias_correction",
                        "momentum", "dampening", "nesterov"}) {
    if (p.present(k)) o.given.insert(k);
  }
  p.get_num("lr", o.lr, 0.0, kInf);
  if (o.lr > 1.0) {
    // No optimizer here trains at such a rate: the first updates overflow, and every step after
    // is skipped for non-finite gradients (zero-train then exits non-zero).
    ZERO_LOG(kWarn, "config key 'optimizer.params.lr' = ", o.lr,
             " is above 1: the updates will likely overflow and every step be skipped");
  }
  const bool adam = o.type == "Adam" || o.type == "AdamW";
  if (o.type == "AdamW") o.adam_w_mode = true;
  if (adam || o.type == "Lion") {
    if (const json* b = p.find("betas")) {
      if (!b->is_array() || b->size() != 2 || !(*b)[0].is_number() || !(*b)[1].is_number()) {
        p.fail("betas", *b, "must be an array of two numbers");
      }
      for (int i = 0; i < 2; ++i) {
        const double x = (*b)[i].get<double>();
        if (!(x >= 0.0 && x < 1.0)) p.fail("betas", *b, "each beta must be in [0, 1)");
        o.betas[i] = x;
      }
    }
  }
  if (adam || o.type == "Adagrad") p.get_num("eps", o.eps, 0.0, 1.0, true);
  p.get_num("weight_decay", o.weight_decay, 0.0, kInf);
  if (adam) {
    p.get("bias_correction", o.bias_correction);
    if (o.type == "Adam") {
      p.get("adam_w_mode", o.adam_w_mode);
    } else if (const json* v = p.find("adam_w_mode"); v != nullptr && *v == false) {
      p.fail("adam_w_mode", *v, "AdamW always decouples weight decay; use type \"Adam\" for L2");
    }
    p.ignore("torch_adam");
    if (const json* v = p.find("amsgrad"); v != nullptr && *v != false) {
      p.fail("amsgrad", *v, "AMSGrad is not supported");
    }
    p.get("moment_dtype", o.moment_dtype, {"f32", "bf16", "int8"});
  }
  if (o.type == "SGD") {
    p.get_num("momentum", o.momentum, 0.0, 1.0);
    p.get_num("dampening", o.dampening, 0.0, 1.0);
    p.get("nesterov", o.nesterov);
    if (o.nesterov && (o.momentum <= 0.0 || o.dampening != 0.0)) {
      p.fail_msg("nesterov", "Nesterov momentum requires momentum > 0 and dampening = 0");
    }
  }
  p.finish();
  o.param_groups = detail::read_param_group_rules(r);
  r.finish();
}

void read_scheduler(Reader r, SchedulerConfig& s) {
  r.get("type", s.type, detail::kSchedulerTypes);
  Reader p = r.sub("params");
  if (s.type == "WarmupLR" || s.type == "WarmupDecayLR") {
    p.get_num("warmup_min_lr", s.warmup_min_lr, 0.0, kInf);
    p.get_num("warmup_max_lr", s.warmup_max_lr, 0.0, kInf);
    p.get_int("warmup_num_steps", s.warmup_num_steps, 0, kMax);
    p.get("warmup_type", s.warmup_type, {"log", "linear"});
    if (s.warmup_max_lr < s.warmup_min_lr) {
      p.fail_msg("warmup_max_lr", "must be >= warmup_min_lr");
    }
    p.ignore("last_batch_iteration");
  }
  if (s.type == "WarmupDecayLR" || s.type == "WarmupCosineLR") {
    p.get_int("total_num_steps", s.total_num_steps, 1, kMax);
    if (!p.has("total_num_steps")) p.fail_msg("total_num_steps", "required by " + s.type);
  }
  if (s.type == "WarmupDecayLR" && s.total_num_steps <= s.warmup_num_steps) {
    p.fail_msg("total_num_steps", "must be greater than warmup_num_steps (" +
                                      std::to_string(s.warmup_num_steps) + ")");
  }
  if (s.type == "WarmupCosineLR") {
    p.get_int("warmup_num_steps", s.warmup_num_steps, 0, kMax);
    p.get_num("warmup_min_ratio", s.warmup_min_ratio, 0.0, 1.0);
    p.get_num("cos_min_ratio", s.cos_min_ratio, 0.0, 1.0);
    p.get("warmup_type", s.warmup_type, {"log", "linear"});
    if (s.total_num_steps <= s.warmup_num_steps) {
      p.fail_msg("total_num_steps", "must be greater than warmup_num_steps (" +
                                        std::to_string(s.warmup_num_steps) + ")");
    }
    p.ignore("last_batch_iteration");
  }
  if (s.type == "OneCycle") {
    p.get_num("cycle_min_lr", s.cycle_min_lr, 0.0, kInf);
    p.get_num("cycle_max_lr", s.cycle_max_lr, 0.0, kInf);
    p.get_num("decay_lr_rate", s.decay_lr_rate, 0.0, kInf);
    p.get_int("cycle_first_step_size", s.cycle_first_step_size, 1, kMax);
    p.get_int("cycle_second_step_size", s.cycle_second_step_size, 0, kMax);
    p.get_int("cycle_first_stair_count", s.cycle_first_stair_count, 0, kMax);
    p.get_int("cycle_second_stair_count", s.cycle_second_stair_count, 0, kMax);
    p.get_int("decay_step_size", s.decay_step_size, 0, kMax);
    p.get("cycle_momentum", s.cycle_momentum);
    p.get_num("cycle_min_mom", s.cycle_min_mom, 0.0, 1.0);
    p.get_num("cycle_max_mom", s.cycle_max_mom, 0.0, 1.0);
    p.get_num("decay_mom_rate", s.decay_mom_rate, 0.0, kInf);
    if (!p.has("cycle_min_lr") || !p.has("cycle_max_lr")) {
      p.fail_msg(p.has("cycle_min_lr") ? "cycle_max_lr" : "cycle_min_lr", "required by OneCycle");
    }
    if (s.cycle_max_lr < s.cycle_min_lr) p.fail_msg("cycle_max_lr", "must be >= cycle_min_lr");
    if (s.cycle_max_mom < s.cycle_min_mom) p.fail_msg("cycle_max_mom", "must be >= cycle_min_mom");
    p.ignore("last_batch_iteration");
  }
  p.finish();
  r.finish();
}

void read_fp16(Reader r, Fp16Config& f) {
  r.get("enabled", f.enabled);
  r.get("auto_cast", f.auto_cast);
  r.get_num("loss_scale", f.loss_scale, 0.0, kInf);
  r.get_int("initial_scale_power", f.initial_scale_power, 0, 63);
  r.get_int("loss_scale_window", f.loss_scale_window, 1, INT32_MAX);
  r.get_int("hysteresis", f.hysteresis, 1, INT32_MAX);
  r.get("consecutive_hysteresis", f.consecutive_hysteresis);
  r.get_num("min_loss_scale", f.min_loss_scale, 0.0, kInf, true);
  if (f.loss_scale == 0.0 && f.min_loss_scale > std::ldexp(1.0, f.initial_scale_power)) {
    r.fail_msg("min_loss_scale", "is above the initial scale 2^initial_scale_power");
  }
  if (const json* v = r.find("fp16_master_weights_and_grads"); v != nullptr && *v != false) {
    r.fail("fp16_master_weights_and_grads", *v, "not supported: master weights are fp32");
  }
  r.finish();
}

void read_checkpointing(Reader r, ActivationCheckpointingConfig& a) {
  r.get("partition_activations", a.partition_activations);
  r.get("contiguous_memory_optimization", a.contiguous_memory_optimization);
  r.get("cpu_checkpointing", a.cpu_checkpointing);
  r.get_int("number_checkpoints", a.number_checkpoints, 0, kMax);
  r.get("synchronize_checkpoint_boundary", a.synchronize_checkpoint_boundary);
  r.get("profile", a.profile);
  r.finish();
}

void read_aio(Reader r, AioConfig& a) {
  r.get_int("block_size", a.block_size, 4096, std::int64_t{1} << 30);
  if (a.block_size % 4096 != 0) {
    r.fail_msg("block_size", "must be a multiple of 4096 (O_DIRECT alignment), is " +
                                 std::to_string(a.block_size));
  }
  r.get_int("queue_depth", a.queue_depth, 1, 4096);
  r.get_int("thread_count", a.thread_count, 1, 1024);
  r.get("single_submit", a.single_submit);
  r.get("overlap_events", a.overlap_events);
  r.get("engine", a.engine, {"io_uring", "threads"});
  r.ignore("intra_op_parallelism");
  r.ignore("use_gds");
  r.finish();
}

void read_trace(Reader r, TraceConfig& t) {
  r.get("enabled", t.enabled);
  r.get("path", t.path);
  if (t.path.empty()) r.fail_msg("path", "must name a file");
  r.get_int("capacity", t.capacity, 1, std::int64_t{1} << 32);
  r.finish();
}

}  // namespace

namespace detail {

Config read_config(const json& doc, std::set<std::string>* asked, bool quiet) {
  Config c;
  detail::ReadContext ctx;
  ctx.asked = asked;
  ctx.quiet = quiet;
  Reader r(&doc, "", &ctx);
  r.get_int("train_batch_size", c.train_batch_size, 1, kMax);
  r.get_int("train_micro_batch_size_per_gpu", c.train_micro_batch_size_per_gpu, 1, kMax);
  r.get_int("gradient_accumulation_steps", c.gradient_accumulation_steps, 1, kMax);
  c.micro_batch_given = r.has("train_micro_batch_size_per_gpu");
  c.accumulation_given = r.has("gradient_accumulation_steps");
  r.get_num("gradient_clipping", c.gradient_clipping, 0.0, kInf);
  read_zero(r.sub("zero_optimization"), c.zero_optimization);
  read_optimizer(r.sub("optimizer"), c.optimizer);
  read_scheduler(r.sub("scheduler"), c.scheduler);
  read_fp16(r.sub("fp16"), c.fp16);
  // DeepSpeed's OneCycle cycles the momentum of optimizers with betas only (its
  // _initialize_momentum: "cycle_momentum is disabled because optimizer ... no betas").
  if (c.scheduler.type == "OneCycle" && c.scheduler.cycle_momentum &&
      !(c.optimizer.type == "Adam" || c.optimizer.type == "AdamW" || c.optimizer.type == "Lion")) {
    c.scheduler.cycle_momentum = false;
    ctx.note("scheduler.params.cycle_momentum",
             "is disabled for optimizer " + c.optimizer.type +
                 ", as DeepSpeed does: OneCycle cycles beta1 of optimizers with betas (Adam, "
                 "AdamW, Lion) only");
  }
  {
    Reader b = r.sub("bf16");
    b.get("enabled", c.bf16.enabled);
    b.ignore("immediate_grad_update");
    b.finish();
  }
  if (r.has_block("bfloat16")) {  // DeepSpeed's older spelling of the bf16 block
    Reader b = r.sub("bfloat16");
    b.get("enabled", c.bf16.enabled);
    b.finish();
  }
  read_checkpointing(r.sub("activation_checkpointing"), c.activation_checkpointing);
  read_aio(r.sub("aio"), c.aio);
  read_trace(r.sub("trace"), c.trace);
  r.get_num("comm_timeout_s", c.comm_timeout_s, kMinCommTimeoutS, 1e7);
  r.get("comm_backend", c.comm_backend, {"auto", "thread", "mpi", "nccl"});
  r.get("comm_debug", c.comm_debug, {"off", "detail"});
  r.get_int("comm_flight_recorder", c.comm_flight_recorder, 0, 1000000);
  r.get("comm_flight_dir", c.comm_flight_dir);
  r.get("communication_data_type", c.communication_data_type, {"fp32", "fp16", "bf16"});
  for (const char* k :
       {"steps_per_print", "wall_clock_breakdown", "dump_state", "prescale_gradients",
        "gradient_predivide_factor", "zero_allow_untested_optimizer", "tensorboard", "wandb",
        "csv_monitor", "comms_logger", "flops_profiler", "memory_breakdown",
        "zero_force_ds_cpu_optimizer"}) {
    r.ignore(k);
  }
  if (c.fp16.enabled && c.bf16.enabled) {
    ZERO_THROW(kConfig, "config keys 'fp16.enabled' and 'bf16.enabled' are both true: choose one");
  }
  if (c.communication_data_type == "fp16" && c.bf16.enabled) {
    r.fail_msg("communication_data_type",
               "\"fp16\" with bf16 training loses range; use bf16 or fp32");
  }
  r.finish();
  return c;
}

}  // namespace detail

}  // namespace zero
