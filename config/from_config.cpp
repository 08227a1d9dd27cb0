// The adapters from the config's blocks to what the lower layers take: the optimizer's
// hyper-parameters, the loss scaler, the learning-rate schedule, the NVMe queue's options, the
// working and reduce dtypes. Each
// names the config key it rejects (kConfig); the lower layers never see a Config.
#include <cmath>
#include <string>

#include "offload/aio.hpp"
#include "zero/config/config.hpp"
#include "zero/core/error.hpp"
#include "zero/optim/loss_scaler.hpp"
#include "zero/optim/lr_schedule.hpp"
#include "zero/optim/optimizer.hpp"

namespace zero {

namespace {
bool positive_finite(double x) { return std::isfinite(x) && x > 0.0; }
}  // namespace

OptimizerParams OptimizerParams::from_config(const OptimizerConfig& c) {
  OptimizerParams p;
  try {
    p.type = parse_optimizer_type(c.type);
  } catch (const Error& e) {
    ZERO_THROW(kConfig, "optimizer.type: ", e.message());
  }
  try {
    p.moment_dtype = parse_moment_dtype(c.moment_dtype);
  } catch (const Error& e) {
    ZERO_THROW(kConfig, "optimizer.params.moment_dtype: ", e.message());
  }
  p.lr = c.lr;
  p.beta1 = c.betas[0];
  p.beta2 = c.betas[1];
  p.eps = c.eps;
  p.weight_decay = c.weight_decay;
  p.bias_correction = c.bias_correction;
  p.adam_w_mode = c.adam_w_mode;
  p.momentum = c.momentum;
  p.dampening = c.dampening;
  p.nesterov = c.nesterov;
  try {
    p.validate();
  } catch (const Error& e) {
    ZERO_THROW(kConfig, "optimizer.params.", e.message());
  }
  return p;
}

LossScaler LossScaler::from_config(const Fp16Config& c) {
  if (!c.enabled) return fixed(1.0);
  ZERO_CHECK(std::isfinite(c.loss_scale) && c.loss_scale >= 0.0, kConfig,
             "fp16.loss_scale = ", c.loss_scale, " must be finite and >= 0 (0: dynamic)");
  if (c.loss_scale > 0.0) return fixed(c.loss_scale);
  ZERO_CHECK(c.initial_scale_power >= 0 && c.initial_scale_power <= 1000, kConfig,
             "fp16.initial_scale_power = ", c.initial_scale_power, " must be in [0, 1000]");
  ZERO_CHECK(c.loss_scale_window >= 1, kConfig, "fp16.loss_scale_window = ", c.loss_scale_window,
             " must be >= 1");
  ZERO_CHECK(c.hysteresis >= 1, kConfig, "fp16.hysteresis = ", c.hysteresis, " must be >= 1");
  ZERO_CHECK(positive_finite(c.min_loss_scale), kConfig, "fp16.min_loss_scale = ", c.min_loss_scale,
             " must be finite and > 0");
  return dynamic(std::ldexp(1.0, c.initial_scale_power), c.loss_scale_window, c.hysteresis,
                 c.consecutive_hysteresis, c.min_loss_scale);
}

LrSchedule LrSchedule::from_config(const SchedulerConfig& c, double optimizer_lr) {
  ZERO_CHECK(std::isfinite(optimizer_lr) && optimizer_lr >= 0.0, kConfig,
             "optimizer.params.lr = ", optimizer_lr, " must be finite and >= 0");
  LrSchedule s(optimizer_lr);
  s.c_ = c;
  if (c.type.empty()) return s;
  if (c.type == "WarmupLR") {
    s.type_ = LrScheduleType::kWarmupLR;
  } else if (c.type == "WarmupDecayLR") {
    s.type_ = LrScheduleType::kWarmupDecayLR;
  } else if (c.type == "WarmupCosineLR") {
    s.type_ = LrScheduleType::kWarmupCosineLR;
  } else if (c.type == "OneCycle") {
    s.type_ = LrScheduleType::kOneCycle;
  } else {
    ZERO_THROW(kConfig, "scheduler.type = '", c.type,
               "' is unknown (expected WarmupLR, WarmupDecayLR, WarmupCosineLR or OneCycle)");
  }
  auto finite_nonneg = [](double v, const char* key) {
    ZERO_CHECK(std::isfinite(v) && v >= 0.0, kConfig, "scheduler.params.", key, " = ", v,
               " must be finite and >= 0");
  };
  if (s.type_ == LrScheduleType::kOneCycle) {
    finite_nonneg(c.cycle_min_lr, "cycle_min_lr");
    finite_nonneg(c.cycle_max_lr, "cycle_max_lr");
    finite_nonneg(c.decay_lr_rate, "decay_lr_rate");
    finite_nonneg(c.decay_mom_rate, "decay_mom_rate");
    finite_nonneg(c.cycle_min_mom, "cycle_min_mom");
    finite_nonneg(c.cycle_max_mom, "cycle_max_mom");
    ZERO_CHECK(c.cycle_first_step_size >= 1, kConfig,
               "scheduler.params.cycle_first_step_size = ", c.cycle_first_step_size,
               " must be >= 1");
    ZERO_CHECK(c.cycle_second_step_size >= 0, kConfig,
               "scheduler.params.cycle_second_step_size = ", c.cycle_second_step_size,
               " must be >= 0 (0: same as cycle_first_step_size)");
    ZERO_CHECK(c.decay_step_size >= 0, kConfig,
               "scheduler.params.decay_step_size = ", c.decay_step_size,
               " must be >= 0 (0: no decay)");
    const double first = static_cast<double>(c.cycle_first_step_size);
    const double second =
        c.cycle_second_step_size == 0 ? first : static_cast<double>(c.cycle_second_step_size);
    s.total_size_ = first + second;
    s.step_ratio_ = first / s.total_size_;
    return s;
  }
  ZERO_CHECK(c.warmup_type == "log" || c.warmup_type == "linear", kConfig,
             "scheduler.params.warmup_type = '", c.warmup_type, "' must be log or linear");
  ZERO_CHECK(c.warmup_num_steps >= 0, kConfig,
             "scheduler.params.warmup_num_steps = ", c.warmup_num_steps, " must be >= 0");
  s.warmup_steps_ = std::max<std::int64_t>(2, c.warmup_num_steps);
  s.log_warmup_ = c.warmup_type == "log";
  if (s.type_ == LrScheduleType::kWarmupCosineLR) {
    finite_nonneg(c.warmup_min_ratio, "warmup_min_ratio");
    finite_nonneg(c.cos_min_ratio, "cos_min_ratio");
  } else {
    finite_nonneg(c.warmup_min_lr, "warmup_min_lr");
    finite_nonneg(c.warmup_max_lr, "warmup_max_lr");
  }
  if (s.type_ == LrScheduleType::kWarmupDecayLR || s.type_ == LrScheduleType::kWarmupCosineLR) {
    ZERO_CHECK(c.total_num_steps > s.warmup_steps_, kConfig,
               "scheduler.params.total_num_steps = ", c.total_num_steps, " must be > ",
               "warmup_num_steps (", s.warmup_steps_, ") for ", c.type);
  }
  return s;
}

offload::AioOptions offload::AioOptions::from_config(const AioConfig& c) {
  offload::AioOptions o;
  o.block_size = static_cast<std::size_t>(c.block_size);
  o.queue_depth = c.queue_depth;
  o.thread_count = c.thread_count;
  o.engine = c.engine;
  return o;
}

DType working_dtype(const Config& c) {
  return c.fp16.enabled ? DType::kF16 : (c.bf16.enabled ? DType::kBF16 : DType::kF32);
}

DType reduce_dtype_of(const Config& c) {
  return c.communication_data_type.empty() ? DType::kF32 : parse_dtype(c.communication_data_type);
}

}  // namespace zero
