// Config reading: the merged JSON document read into the structs and validated in one place
// (Reader), so every error names the full key path and the offending value. The sources are
// zero/config/config_builder.cpp's.
#include "zero/config.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <span>
#include <sstream>

#include "zero/config/config_keys.hpp"
#include "zero/config/config_reader.hpp"
#include "zero/config/stage_policy.hpp"
#include "zero/error.hpp"
#include "zero/log.hpp"

namespace zero {

using nlohmann::json;

namespace {

// ---- the reader: typed access to one JSON object, tracking which keys were consumed

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// A value as a message quotes it: JSON, truncated (the document is depth-bounded, so dump()
// cannot recurse far; `replace` keeps it from throwing on a string that is not UTF-8).
std::string show(const json& v) {
  return detail::printable(v.dump(-1, ' ', false, json::error_handler_t::replace));
}

// What one read_config shares among its readers: the keys asked for (detail::accepted_keys) and
// the keys already named, so each is named once per read.
struct ReadContext {
  std::set<std::string>* asked = nullptr;
  std::set<std::string> noted;
  // Logs `message` at warn level, the first time only for `path`.
  void note(const std::string& path, const std::string& message) {
    if (noted.insert(path).second) ZERO_LOG(kWarn, "config key '", path, "' ", message);
  }
};

class Reader {
 public:
  Reader(const json* obj, std::string path, ReadContext* ctx)
      : obj_(obj), path_(std::move(path)), ctx_(ctx) {
    if (obj_ != nullptr && !obj_->is_object()) {
      ZERO_THROW(kConfig, "config key '", path_, "' = ", show(*obj_), ": must be an object");
    }
  }

  std::string key_path(std::string_view key) const {
    return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
  }

  // Returns the value for key, or nullptr when absent (null counts as absent: DeepSpeed's
  // "not set").
  // A key given with a value that does nothing here is named once, at warn level, with what
  // DeepSpeed would do (its row in detail::config_keys()).
  // `leaf`: a key with a value (recorded in `asked`), not a block read through sub().
  const json* find(std::string_view key, bool leaf = true) {
    known_.insert(std::string(key));
    if (leaf && ctx_->asked != nullptr) ctx_->asked->insert(key_path(key));
    if (obj_ == nullptr) return nullptr;
    auto it = obj_->find(std::string(key));
    if (it == obj_->end() || it->is_null()) return nullptr;
    if (it->is_string() && it->get<std::string>() == "auto") {
      ZERO_THROW(kConfig, "config key '", key_path(key),
                 "' = \"auto\": 'auto' is filled in by the HuggingFace integration; give a value");
    }
    const std::string path = key_path(key);
    if (const detail::ConfigKey* row = detail::find_config_key(path);
        row != nullptr && row->handling == detail::KeyHandling::kNoEffect &&
        !detail::is_quiet(*row, *it)) {
      ctx_->note(path, "= " + show(*it) + " has no effect here: " + std::string(row->meaning));
    }
    return &*it;
  }
  bool has(std::string_view key) { return find(key) != nullptr; }
  // Whether the key is set, without taking it as read (finish() still reports it if unread).
  bool present(std::string_view key) const {
    if (obj_ == nullptr) return false;
    auto it = obj_->find(std::string(key));
    return it != obj_->end() && !it->is_null();
  }
  // Names `key` once (warn level) with `message` when it is given.
  void note(std::string_view key, const std::string& message) {
    if (find(key) != nullptr) ctx_->note(key_path(key), message);
  }
  // A key accepted for DeepSpeed compatibility that has no effect here: find() names it.
  void ignore(std::string_view key) { (void)find(key); }

  void get(std::string_view key, bool& out) {
    if (const json* v = find(key)) {
      if (!v->is_boolean()) fail(key, *v, "must be true or false");
      out = v->get<bool>();
    }
  }
  void get(std::string_view key, std::string& out, std::span<const std::string_view> allowed = {}) {
    if (const json* v = find(key)) {
      if (!v->is_string()) fail(key, *v, "must be a string");
      std::string s = v->get<std::string>();
      if (allowed.size() != 0) {
        bool ok = false;
        std::string list;
        for (std::string_view a : allowed) {
          ok = ok || s == a;
          if (!list.empty()) list += ", ";
          list += a;
        }
        if (!ok) fail(key, *v, "must be one of " + list);
      }
      out = std::move(s);
    }
  }
  void get(std::string_view key, std::string& out,
           std::initializer_list<std::string_view> allowed) {
    get(key, out, std::span<const std::string_view>(allowed.begin(), allowed.size()));
  }
  // Integers: JSON integers or integral floats (DeepSpeed files write 5e8), within [lo, hi].
  template <typename Int>
  void get_int(std::string_view key, Int& out, std::int64_t lo, std::int64_t hi) {
    if (const json* v = find(key)) {
      if (!v->is_number()) fail(key, *v, "must be an integer");
      std::int64_t x = 0;
      if (v->is_number_float()) {
        const double d = v->get<double>();
        if (!std::isfinite(d) || d != std::floor(d)) fail(key, *v, "must be an integer");
        // 2^63 is the first double past INT64_MAX; a JSON integer past 2^64 arrives as a double.
        if (std::fabs(d) >= 9.2233720368547758e18) fail(key, *v, range(lo, hi));
        x = static_cast<std::int64_t>(d);
      } else if (v->is_number_unsigned() &&
                 v->get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX)) {
        fail(key, *v, range(lo, hi));
      } else {
        x = v->get<std::int64_t>();
      }
      if (x < lo || x > hi) fail(key, *v, range(lo, hi));
      out = static_cast<Int>(x);
    }
  }
  void get_num(std::string_view key, double& out, double lo, double hi, bool lo_open = false) {
    if (const json* v = find(key)) {
      if (!v->is_number()) fail(key, *v, "must be a number");
      const double x = v->get<double>();
      if (!std::isfinite(x) || x < lo || x > hi || (lo_open && x == lo)) {
        std::ostringstream os;
        os << "must be in " << (lo_open ? "(" : "[") << lo << ", " << hi << "]";
        fail(key, *v, os.str());
      }
      out = x == 0.0 ? 0.0 : x;  // -0 reads as 0
    }
  }

  Reader sub(std::string_view key) { return Reader(find(key, false), key_path(key), ctx_); }
  bool has_block(std::string_view key) { return find(key, false) != nullptr; }

  [[noreturn]] void fail(std::string_view key, const json& v, const std::string& why) const {
    ZERO_THROW(kConfig, "config key '", key_path(key), "' = ", show(v), ": ", why);
  }
  [[noreturn]] void fail_msg(std::string_view key, const std::string& why) const {
    ZERO_THROW(kConfig, "config key '", key_path(key), "': ", why);
  }

  // Every key present must have been asked for: an unknown key is an error with a suggestion.
  void finish() const {
    if (obj_ == nullptr) return;
    for (auto it = obj_->begin(); it != obj_->end(); ++it) {
      if (known_.count(it.key()) != 0) continue;
      // The distance is at least the difference in length: only keys within 3 bytes of a known
      // one are compared, so a hostile key costs O(its length), not O(length x known keys).
      std::string best;
      std::size_t best_d = 4;
      const std::string& unknown = it.key();
      for (const std::string& k : known_) {
        const std::size_t gap =
            unknown.size() > k.size() ? unknown.size() - k.size() : k.size() - unknown.size();
        if (gap >= best_d) continue;
        const std::size_t d = edit_distance(unknown, k);
        if (d < best_d) {
          best_d = d;
          best = k;
        }
      }
      ZERO_THROW(kConfig, "config key '", detail::printable(key_path(unknown), 160),
                 "' is not known",
                 best.empty() ? std::string() : " (did you mean '" + key_path(best) + "'?)");
    }
  }

 private:
  static std::string range(std::int64_t lo, std::int64_t hi) {
    std::ostringstream os;
    os << "must be an integer in [" << lo << ", ";
    if (hi == INT64_MAX) {
      os << "inf)";
    } else {
      os << hi << "]";
    }
    return os.str();
  }

  const json* obj_;
  std::string path_;
  ReadContext* ctx_;
  std::set<std::string> known_;
};

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
    r.get_num("ratio", o.ratio, 0.0, 1.0, true);
    if (o.ratio != 1.0)
      r.fail_msg("ratio", "partial offload (ratio < 1) is not supported; use 1.0");
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
  if (const json* g = r.find("param_groups")) {
    o.param_groups = detail::read_param_group_rules(*g, "optimizer.param_groups");
  }
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

Config read_config(const json& doc, std::set<std::string>* asked) {
  Config c;
  ReadContext ctx;
  ctx.asked = asked;
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
