// zero/optim/lr_schedule.hpp — learning-rate schedules with DeepSpeed's names and formulas.
//
// A schedule is a pure function of the iteration: lr(i) is what DeepSpeed's scheduler of the
// same type sets after its i-th step(), i.e. its get_lr() with last_batch_iteration = i
// (deepspeed/runtime/lr_schedules.py). DeepSpeed's engine calls scheduler.step() after each
// optimizer step, so optimizer step k (1-based) runs with lr(k - 2), and lr(-1) is the value
// the scheduler's constructor sets (min lr; 0 for WarmupCosineLR). Formulas, with
// W = max(2, warmup_num_steps), T = total_num_steps:
//   warmup gamma(i) = log(i + 1) / log(W) ("log") or i / W ("linear") for i < W, else 1
//   WarmupLR        warmup_min_lr + (warmup_max_lr - warmup_min_lr) * gamma(i)
//   WarmupDecayLR   as WarmupLR, but for i >= W gamma = max(0, (T - i) / max(1, T - W))
//   WarmupCosineLR  lr * ratio; i < W: warmup_min_ratio + gamma(i) * (1 - warmup_min_ratio);
//                   else max(0, cos_min_ratio + (1 - cos_min_ratio) *
//                                (1 + cos(pi * (i - W + 1) / (T - W))) / 2)
//   OneCycle        (Smith 2018, arXiv:1803.09820) with S = first + second step size,
//                   x = frac((i + 1) / S): lr = min + (max - min) * f, f = x / r for x <= r,
//                   (x - 1) / (r - 1) otherwise, r = first / S, while i < S; then
//                   cycle_min_lr / (1 + decay_lr_rate * (i - S + 1) / decay_step_size) (no
//                   decay when decay_lr_rate or decay_step_size is 0). Momentum (beta1) runs
//                   inversely: max_mom - (max_mom - min_mom) * f, then
//                   max_mom * (1 + decay_mom_rate * (i - S + 1) / decay_step_size).
// The type "" is a constant schedule at the optimizer's lr.
//
// Thread safety: an LrSchedule is immutable; lr() and momentum() may be called concurrently.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace zero {

enum class LrScheduleType : std::uint8_t {
  kConstant,
  kWarmupLR,
  kWarmupDecayLR,
  kWarmupCosineLR,
  kOneCycle
};

// The config's scheduler block (DeepSpeed names; Config::scheduler); type "" = a constant lr
// from the optimizer block.
struct SchedulerConfig {
  std::string type;  // "" | WarmupLR | WarmupDecayLR | WarmupCosineLR | OneCycle
  // WarmupLR / WarmupDecayLR
  double warmup_min_lr = 0.0;
  double warmup_max_lr = 0.001;
  std::int64_t warmup_num_steps = 1000;
  std::string warmup_type = "log";   // log | linear
  std::int64_t total_num_steps = 0;  // WarmupDecayLR, WarmupCosineLR: required (> warmup)
  // WarmupCosineLR (ratios of the optimizer lr)
  double warmup_min_ratio = 0.0;
  double cos_min_ratio = 0.0001;
  // OneCycle
  double cycle_min_lr = 0.0;
  double cycle_max_lr = 0.0;
  double decay_lr_rate = 0.0;
  std::int64_t cycle_first_step_size = 2000;
  std::int64_t cycle_second_step_size = 0;  // 0: same as first
  std::int64_t cycle_first_stair_count = 0;
  std::int64_t cycle_second_stair_count = 0;
  std::int64_t decay_step_size = 0;
  bool cycle_momentum = true;
  double cycle_min_mom = 0.8;
  double cycle_max_mom = 0.9;
  double decay_mom_rate = 0.0;
};

// "constant", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle".
std::string_view to_string(LrScheduleType t) noexcept;

class LrSchedule {
 public:
  // A constant schedule at `lr`.
  explicit LrSchedule(double lr = 1e-3);
  // From the config's scheduler block; `optimizer_lr` is optimizer.params.lr (the constant
  // schedule's value and WarmupCosineLR's base). Throws zero::Error(kConfig) naming the
  // scheduler.* key when a value is unknown or out of range (e.g. WarmupDecayLR and
  // WarmupCosineLR require total_num_steps > warmup_num_steps; OneCycle cycle_max_lr > 0).
  static LrSchedule from_config(const SchedulerConfig& config, double optimizer_lr);

  LrScheduleType type() const noexcept { return type_; }

  // The learning rate after the scheduler's i-th step (see above). REQUIRES: i >= -1, else
  // zero::Error(kInvalidArgument).
  double lr(std::int64_t i) const;
  // The learning rate of a parameter group whose own lr is `group_lr` (the optimizer's group:
  // lr(i)), as DeepSpeed's schedulers set each group: the constant schedule keeps group_lr,
  // WarmupCosineLR scales it by its ratio (torch's LambdaLR way: each group its own base);
  // WarmupLR, WarmupDecayLR and OneCycle set their absolute lr on every group (their
  // warmup_*_lr / cycle_*_lr keys are given once, not per group).
  double lr(std::int64_t i, double group_lr) const;
  // Whether lr(i, group_lr) depends on group_lr (the same row of lr_schedule.cpp's table of
  // schedule kinds that lr(i, group_lr) computes by).
  bool scales_group_lr() const noexcept;
  // OneCycle with cycle_momentum: the beta1 (Adam) / momentum DeepSpeed sets at iteration i;
  // std::nullopt for every other schedule.
  std::optional<double> momentum(std::int64_t i) const;

 private:
  struct Kind;  // a row of the schedule kinds' table (lr_schedule.cpp)
  const Kind& kind() const noexcept;
  // The kinds' formulas: a ratio of the group's lr, or the lr itself (Kind::scales_group_lr).
  double constant_ratio(std::int64_t i) const;
  double warmup_lr(std::int64_t i) const;
  double cosine_ratio(std::int64_t i) const;
  double one_cycle_lr(std::int64_t i) const;
  double warmup_gamma(std::int64_t i) const;
  double one_cycle_fraction(std::int64_t i) const;

  LrScheduleType type_ = LrScheduleType::kConstant;
  double base_lr_ = 1e-3;
  SchedulerConfig c_{};
  std::int64_t warmup_steps_ = 2;  // max(2, warmup_num_steps)
  bool log_warmup_ = true;
  double total_size_ = 0.0;  // OneCycle: first + second step size
  double step_ratio_ = 0.0;  // OneCycle: first / total
};

}  // namespace zero
