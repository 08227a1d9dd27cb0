// Config::to_json: the configuration written back as the JSON the reader (config.cpp) takes.
#include <nlohmann/json.hpp>

#include "config/config_reader.hpp"
#include "zero/config/config.hpp"

namespace zero {

using nlohmann::json;

// Every key the reader takes for this configuration (the keys that apply to its optimizer,
// scheduler and stage), so that parse_config(to_json()) is the same configuration.
std::string Config::to_json() const {
  const auto& z = zero_optimization;
  auto off = [](const OffloadConfig& o, bool optimizer) {
    json j = {{"device", std::string(to_string(o.device))},
              {"nvme_path", o.nvme_path},
              {"pin_memory", o.pin_memory},
              {"buffer_count", o.buffer_count},
              {"buffer_size", o.buffer_size},
              {"pipeline_read", o.pipeline_read},
              {"pipeline_write", o.pipeline_write},
              {"fast_init", o.fast_init}};
    if (optimizer) {
      j["ratio"] = o.ratio;
      j["overlap_step"] = o.overlap_step;
    } else {
      j["max_in_cpu"] = o.max_in_cpu;
    }
    return j;
  };
  json zj = {
      {"stage", z.stage},
      {"contiguous_gradients", z.contiguous_gradients},
      {"reduce_scatter", z.reduce_scatter},
      {"reduce_bucket_size", z.reduce_bucket_size},
      {"allgather_partitions", z.allgather_partitions},
      {"allgather_bucket_size", z.allgather_bucket_size},
      {"overlap_comm", z.overlap_comm},
      {"load_from_fp32_weights", z.load_from_fp32_weights},
      {"round_robin_gradients", z.round_robin_gradients},
      {"sub_group_size", z.sub_group_size},
      {"hybrid_shard_size", z.hybrid_shard_size == ZeroOptimizationConfig::kHybridShardNode
                                ? json("node")
                                : json(z.hybrid_shard_size)},
      {"zero_quantized_weights", z.zero_quantized_weights},
      {"zero_quantized_gradients", z.zero_quantized_gradients},
      {"quantization_block_size", z.quantization_block_size},
      {"offload_optimizer", off(z.offload_optimizer, true)},
      {"offload_param", off(z.offload_param, false)},
      {"stage3_gather_16bit_weights_on_model_save", z.stage3_gather_16bit_weights_on_model_save}};
  if (z.stage == 3) {
    zj["stage3_prefetch_bucket_size"] = z.stage3_prefetch_bucket_size;
    zj["stage3_param_persistence_threshold"] = z.stage3_param_persistence_threshold;
    zj["stage3_model_persistence_threshold"] = z.stage3_model_persistence_threshold;
    zj["stage3_max_live_parameters"] = z.stage3_max_live_parameters;
    zj["stage3_max_reuse_distance"] = z.stage3_max_reuse_distance;
  }
  const auto& o = optimizer;
  const bool adam = o.type == "Adam" || o.type == "AdamW";
  json op = {{"lr", o.lr}, {"weight_decay", o.weight_decay}};
  if (adam || o.type == "Lion") op["betas"] = o.betas;
  if (adam || o.type == "Adagrad") op["eps"] = o.eps;
  if (adam) {
    op["bias_correction"] = o.bias_correction;
    op["moment_dtype"] = o.moment_dtype;
    if (o.type == "Adam") op["adam_w_mode"] = o.adam_w_mode;
  }
  if (o.type == "SGD") {
    op["momentum"] = o.momentum;
    op["dampening"] = o.dampening;
    op["nesterov"] = o.nesterov;
  }
  json oj = {{"type", o.type}, {"params", op}};
  if (!o.param_groups.empty()) oj["param_groups"] = detail::param_group_rules_json(o.param_groups);
  const auto& a = activation_checkpointing;
  json j = {
      {"train_micro_batch_size_per_gpu", train_micro_batch_size_per_gpu},
      {"gradient_accumulation_steps", gradient_accumulation_steps},
      {"gradient_clipping", gradient_clipping},
      {"zero_optimization", zj},
      {"optimizer", oj},
      {"fp16",
       {{"enabled", fp16.enabled},
        {"auto_cast", fp16.auto_cast},
        {"loss_scale", fp16.loss_scale},
        {"initial_scale_power", fp16.initial_scale_power},
        {"loss_scale_window", fp16.loss_scale_window},
        {"hysteresis", fp16.hysteresis},
        {"consecutive_hysteresis", fp16.consecutive_hysteresis},
        {"min_loss_scale", fp16.min_loss_scale}}},
      {"bf16", {{"enabled", bf16.enabled}}},
      {"activation_checkpointing",
       {{"partition_activations", a.partition_activations},
        {"contiguous_memory_optimization", a.contiguous_memory_optimization},
        {"cpu_checkpointing", a.cpu_checkpointing},
        {"number_checkpoints", a.number_checkpoints},
        {"synchronize_checkpoint_boundary", a.synchronize_checkpoint_boundary},
        {"profile", a.profile}}},
      {"aio",
       {{"block_size", aio.block_size},
        {"queue_depth", aio.queue_depth},
        {"thread_count", aio.thread_count},
        {"single_submit", aio.single_submit},
        {"overlap_events", aio.overlap_events},
        {"engine", aio.engine}}},
      {"trace", {{"enabled", trace.enabled}, {"path", trace.path}, {"capacity", trace.capacity}}},
      {"comm_timeout_s", comm_timeout_s}};
  // "auto" (the default) is not accepted as a value (HuggingFace's placeholder): left out.
  if (comm_backend != "auto") j["comm_backend"] = comm_backend;
  j["comm_debug"] = comm_debug;
  j["comm_flight_recorder"] = comm_flight_recorder;
  if (!comm_flight_dir.empty()) j["comm_flight_dir"] = comm_flight_dir;
  if (train_batch_size != 0) j["train_batch_size"] = train_batch_size;
  if (!communication_data_type.empty()) j["communication_data_type"] = communication_data_type;
  const auto& sc = scheduler;
  if (!sc.type.empty()) {
    json sp = json::object();
    if (sc.type == "WarmupLR" || sc.type == "WarmupDecayLR") {
      sp["warmup_min_lr"] = sc.warmup_min_lr;
      sp["warmup_max_lr"] = sc.warmup_max_lr;
      sp["warmup_num_steps"] = sc.warmup_num_steps;
      sp["warmup_type"] = sc.warmup_type;
    }
    if (sc.type == "WarmupDecayLR" || sc.type == "WarmupCosineLR") {
      sp["total_num_steps"] = sc.total_num_steps;
    }
    if (sc.type == "WarmupCosineLR") {
      sp["warmup_num_steps"] = sc.warmup_num_steps;
      sp["warmup_min_ratio"] = sc.warmup_min_ratio;
      sp["cos_min_ratio"] = sc.cos_min_ratio;
      sp["warmup_type"] = sc.warmup_type;
    }
    if (sc.type == "OneCycle") {
      sp["cycle_min_lr"] = sc.cycle_min_lr;
      sp["cycle_max_lr"] = sc.cycle_max_lr;
      sp["decay_lr_rate"] = sc.decay_lr_rate;
      sp["cycle_first_step_size"] = sc.cycle_first_step_size;
      sp["cycle_second_step_size"] = sc.cycle_second_step_size;
      sp["cycle_first_stair_count"] = sc.cycle_first_stair_count;
      sp["cycle_second_stair_count"] = sc.cycle_second_stair_count;
      sp["decay_step_size"] = sc.decay_step_size;
      sp["cycle_momentum"] = sc.cycle_momentum;
      sp["cycle_min_mom"] = sc.cycle_min_mom;
      sp["cycle_max_mom"] = sc.cycle_max_mom;
      sp["decay_mom_rate"] = sc.decay_mom_rate;
    }
    j["scheduler"] = {{"type", sc.type}, {"params", sp}};
  }
  return j.dump();
}

}  // namespace zero
