// LrSchedule: DeepSpeed's WarmupLR, WarmupDecayLR, WarmupCosineLR and OneCycle formulas
// (deepspeed/runtime/lr_schedules.py), as closed forms of the iteration.
#include "zero/lr_schedule.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "zero/error.hpp"

namespace zero {

std::string_view to_string(LrScheduleType t) noexcept {
  switch (t) {
    case LrScheduleType::kConstant: return "constant";
    case LrScheduleType::kWarmupLR: return "WarmupLR";
    case LrScheduleType::kWarmupDecayLR: return "WarmupDecayLR";
    case LrScheduleType::kWarmupCosineLR: return "WarmupCosineLR";
    case LrScheduleType::kOneCycle: return "OneCycle";
  }
  return "unknown";
}

LrSchedule::LrSchedule(double lr) : base_lr_(lr) {
  ZERO_CHECK(std::isfinite(lr) && lr >= 0.0, kInvalidArgument, "constant learning rate ", lr,
             " must be finite and >= 0");
}

double LrSchedule::warmup_gamma(std::int64_t i) const {
  // WarmupLR._get_gamma for i < W
  const double it = static_cast<double>(i);
  if (log_warmup_) return std::log(it + 1.0) / std::log(static_cast<double>(warmup_steps_));
  return it / static_cast<double>(warmup_steps_);
}

double LrSchedule::one_cycle_fraction(std::int64_t i) const {
  // OneCycle._get_scale_factor
  const double batch = static_cast<double>(i + 1);
  const double cycle = std::floor(1.0 + batch / total_size_);
  const double x = 1.0 + batch / total_size_ - cycle;
  return x <= step_ratio_ ? x / step_ratio_ : (x - 1.0) / (step_ratio_ - 1.0);
}

double LrSchedule::lr(std::int64_t i) const { return lr(i, base_lr_); }

double LrSchedule::lr(std::int64_t i, double group_lr) const {
  ZERO_CHECK(i >= -1, kInvalidArgument, "LrSchedule::lr: iteration ", i, " must be >= -1");
  switch (type_) {
    case LrScheduleType::kConstant: return group_lr;
    case LrScheduleType::kWarmupLR:
    case LrScheduleType::kWarmupDecayLR: {
      if (i < 0) return c_.warmup_min_lr;
      double gamma = 1.0;
      if (i < warmup_steps_) {
        gamma = warmup_gamma(i);
      } else if (type_ == LrScheduleType::kWarmupDecayLR) {
        gamma = std::max(
            0.0, static_cast<double>(c_.total_num_steps - i) /
                     std::max(1.0, static_cast<double>(c_.total_num_steps - warmup_steps_)));
      }
      return c_.warmup_min_lr + (c_.warmup_max_lr - c_.warmup_min_lr) * gamma;
    }
    case LrScheduleType::kWarmupCosineLR: {
      if (i < 0) return 0.0;
      double ratio;
      if (i < warmup_steps_) {
        ratio = c_.warmup_min_ratio + warmup_gamma(i) * (1.0 - c_.warmup_min_ratio);
      } else {
        const double real_last = static_cast<double>(i - warmup_steps_ + 1);
        const double real_total = static_cast<double>(c_.total_num_steps - warmup_steps_);
        const double cos_part = (1.0 + std::cos(std::numbers::pi * real_last / real_total)) / 2.0;
        ratio = std::max(0.0, c_.cos_min_ratio + (1.0 - c_.cos_min_ratio) * cos_part);
      }
      return group_lr * ratio;
    }
    case LrScheduleType::kOneCycle: {
      if (i < 0) return c_.cycle_min_lr;
      if (static_cast<double>(i) < total_size_) {
        return c_.cycle_min_lr + (c_.cycle_max_lr - c_.cycle_min_lr) * one_cycle_fraction(i);
      }
      if (c_.decay_lr_rate == 0.0 || c_.decay_step_size == 0) return c_.cycle_min_lr;
      const double interval =
          (static_cast<double>(i) - total_size_ + 1.0) / static_cast<double>(c_.decay_step_size);
      return c_.cycle_min_lr / (1.0 + c_.decay_lr_rate * interval);
    }
  }
  return base_lr_;
}

std::optional<double> LrSchedule::momentum(std::int64_t i) const {
  ZERO_CHECK(i >= -1, kInvalidArgument, "LrSchedule::momentum: iteration ", i, " must be >= -1");
  if (type_ != LrScheduleType::kOneCycle || !c_.cycle_momentum) return std::nullopt;
  if (i < 0) return c_.cycle_min_mom;
  if (static_cast<double>(i) < total_size_) {
    return c_.cycle_max_mom - (c_.cycle_max_mom - c_.cycle_min_mom) * one_cycle_fraction(i);
  }
  if (c_.decay_mom_rate == 0.0 || c_.decay_step_size == 0) return c_.cycle_max_mom;
  const double interval =
      (static_cast<double>(i) - total_size_ + 1.0) / static_cast<double>(c_.decay_step_size);
  return c_.cycle_max_mom * (1.0 + c_.decay_mom_rate * interval);
}

}  // namespace zero
