// LrSchedule: DeepSpeed's WarmupLR, WarmupDecayLR, WarmupCosineLR and OneCycle formulas
// (deepspeed/runtime/lr_schedules.py), as closed forms of the iteration.
#include "zero/optim/lr_schedule.hpp"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <numbers>
#include <string>

#include "zero/core/error.hpp"

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

// ---- the schedule kinds: one row each, holding both whether the kind scales a group's own lr
// and the formula it computes, so the two cannot disagree

struct LrSchedule::Kind {
  LrScheduleType type;
  // true: `value` is a ratio of the group's own lr (the constant schedule; WarmupCosineLR, as
  // torch's LambdaLR: each group its own base); false: `value` is the lr set on every group
  // (WarmupLR, WarmupDecayLR, OneCycle: their warmup_*_lr / cycle_*_lr keys are given once).
  bool scales_group_lr;
  double (LrSchedule::*value)(std::int64_t i) const;
};

const LrSchedule::Kind& LrSchedule::kind() const noexcept {
  static constexpr Kind kKinds[] = {
      {LrScheduleType::kConstant, true, &LrSchedule::constant_ratio},
      {LrScheduleType::kWarmupLR, false, &LrSchedule::warmup_lr},
      {LrScheduleType::kWarmupDecayLR, false, &LrSchedule::warmup_lr},
      {LrScheduleType::kWarmupCosineLR, true, &LrSchedule::cosine_ratio},
      {LrScheduleType::kOneCycle, false, &LrSchedule::one_cycle_lr},
  };
  static_assert(
      [] {
        for (std::size_t t = 0; t < std::size(kKinds); ++t) {
          if (kKinds[t].type != static_cast<LrScheduleType>(t)) return false;
        }
        return std::size(kKinds) == static_cast<std::size_t>(LrScheduleType::kOneCycle) + 1;
      }(),
      "kKinds is indexed by LrScheduleType: one row per type, in the enum's order");
  return kKinds[static_cast<std::size_t>(type_)];
}

bool LrSchedule::scales_group_lr() const noexcept { return kind().scales_group_lr; }

double LrSchedule::lr(std::int64_t i) const { return lr(i, base_lr_); }

double LrSchedule::lr(std::int64_t i, double group_lr) const {
  ZERO_CHECK(i >= -1, kInvalidArgument, "LrSchedule::lr: iteration ", i, " must be >= -1");
  const Kind& k = kind();
  const double value = (this->*k.value)(i);
  return k.scales_group_lr ? group_lr * value : value;
}

double LrSchedule::constant_ratio(std::int64_t) const { return 1.0; }

// WarmupLR, and WarmupDecayLR's decay after the warmup.
double LrSchedule::warmup_lr(std::int64_t i) const {
  if (i < 0) return c_.warmup_min_lr;
  double gamma = 1.0;
  if (i < warmup_steps_) {
    gamma = warmup_gamma(i);
  } else if (type_ == LrScheduleType::kWarmupDecayLR) {
    gamma =
        std::max(0.0, static_cast<double>(c_.total_num_steps - i) /
                          std::max(1.0, static_cast<double>(c_.total_num_steps - warmup_steps_)));
  }
  return c_.warmup_min_lr + (c_.warmup_max_lr - c_.warmup_min_lr) * gamma;
}

double LrSchedule::cosine_ratio(std::int64_t i) const {
  if (i < 0) return 0.0;
  if (i < warmup_steps_) {
    return c_.warmup_min_ratio + warmup_gamma(i) * (1.0 - c_.warmup_min_ratio);
  }
  const double real_last = static_cast<double>(i - warmup_steps_ + 1);
  const double real_total = static_cast<double>(c_.total_num_steps - warmup_steps_);
  const double cos_part = (1.0 + std::cos(std::numbers::pi * real_last / real_total)) / 2.0;
  return std::max(0.0, c_.cos_min_ratio + (1.0 - c_.cos_min_ratio) * cos_part);
}

double LrSchedule::one_cycle_lr(std::int64_t i) const {
  if (i < 0) return c_.cycle_min_lr;
  if (static_cast<double>(i) < total_size_) {
    return c_.cycle_min_lr + (c_.cycle_max_lr - c_.cycle_min_lr) * one_cycle_fraction(i);
  }
  if (c_.decay_lr_rate == 0.0 || c_.decay_step_size == 0) return c_.cycle_min_lr;
  const double interval =
      (static_cast<double>(i) - total_size_ + 1.0) / static_cast<double>(c_.decay_step_size);
  return c_.cycle_min_lr / (1.0 + c_.decay_lr_rate * interval);
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
