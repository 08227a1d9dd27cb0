// LrSchedule against DeepSpeed's formulas written out as closed forms at chosen iterations.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <numbers>
#include <string>

#include "zero/config/config.hpp"
#include "zero/core/error.hpp"
#include "zero/optim/lr_schedule.hpp"

namespace zero {
namespace {

constexpr double kTol = 1e-15;

TEST(LrSchedule, ConstantWhenNoScheduler) {
  LrSchedule s = LrSchedule::from_config(SchedulerConfig{}, 3e-4);
  EXPECT_EQ(s.type(), LrScheduleType::kConstant);
  EXPECT_EQ(s.lr(-1), 3e-4);
  EXPECT_EQ(s.lr(12345), 3e-4);
  EXPECT_FALSE(s.momentum(3).has_value());
}

TEST(LrSchedule, WarmupLRLogAndLinear) {
  SchedulerConfig c;
  c.type = "WarmupLR";
  c.warmup_min_lr = 0.1;
  c.warmup_max_lr = 1.1;
  c.warmup_num_steps = 10;
  LrSchedule s = LrSchedule::from_config(c, 1.0);
  EXPECT_NEAR(s.lr(-1), 0.1, kTol);
  EXPECT_NEAR(s.lr(0), 0.1, kTol);  // log(1) = 0
  EXPECT_NEAR(s.lr(4), 0.1 + std::log(5.0) / std::log(10.0), kTol);
  EXPECT_NEAR(s.lr(9), 1.1, kTol);
  EXPECT_NEAR(s.lr(10), 1.1, kTol);
  EXPECT_NEAR(s.lr(100000), 1.1, kTol);
  c.warmup_type = "linear";
  s = LrSchedule::from_config(c, 1.0);
  EXPECT_NEAR(s.lr(5), 0.6, kTol);
  EXPECT_NEAR(s.lr(9), 1.0, kTol);
  EXPECT_NEAR(s.lr(10), 1.1, kTol);
  // warmup_num_steps is at least 2 (DeepSpeed: max(2, n)).
  c.warmup_type = "log";
  c.warmup_num_steps = 0;
  s = LrSchedule::from_config(c, 1.0);
  EXPECT_NEAR(s.lr(0), 0.1, kTol);
  EXPECT_NEAR(s.lr(1), 1.1, kTol);
}

TEST(LrSchedule, WarmupDecayLR) {
  SchedulerConfig c;
  c.type = "WarmupDecayLR";
  c.warmup_min_lr = 0.0;
  c.warmup_max_lr = 2.0;
  c.warmup_num_steps = 10;
  c.total_num_steps = 110;
  const LrSchedule s = LrSchedule::from_config(c, 1.0);
  EXPECT_NEAR(s.lr(3), 2.0 * std::log(4.0) / std::log(10.0), kTol);
  EXPECT_NEAR(s.lr(10), 2.0, kTol);  // (110 - 10) / 100
  EXPECT_NEAR(s.lr(60), 1.0, kTol);  // (110 - 60) / 100
  EXPECT_NEAR(s.lr(109), 0.02, kTol);
  EXPECT_NEAR(s.lr(110), 0.0, kTol);
  EXPECT_NEAR(s.lr(500), 0.0, kTol);  // clamped at 0
}

TEST(LrSchedule, WarmupCosineLR) {
  SchedulerConfig c;
  c.type = "WarmupCosineLR";
  c.warmup_min_ratio = 0.1;
  c.cos_min_ratio = 0.01;
  c.warmup_num_steps = 10;
  c.total_num_steps = 110;
  c.warmup_type = "linear";
  const LrSchedule s = LrSchedule::from_config(c, 2.0);
  EXPECT_NEAR(s.lr(-1), 0.0, kTol);
  EXPECT_NEAR(s.lr(0), 2.0 * 0.1, kTol);
  EXPECT_NEAR(s.lr(5), 2.0 * (0.1 + 0.5 * 0.9), kTol);
  const auto cosine = [](double k) {
    return 2.0 * (0.01 + 0.99 * (1 + std::cos(std::numbers::pi * k / 100.0)) / 2);
  };
  EXPECT_NEAR(s.lr(10), cosine(1), kTol);  // real_last_step = i - W + 1
  EXPECT_NEAR(s.lr(59), 2.0 * (0.01 + 0.99 * 0.5), 1e-14);
  EXPECT_NEAR(s.lr(109), 2.0 * 0.01, kTol);   // cos(pi) = -1
  EXPECT_NEAR(s.lr(159), cosine(150), kTol);  // past the end: the cosine comes back up
}

TEST(LrSchedule, OneCycle) {
  SchedulerConfig c;
  c.type = "OneCycle";
  c.cycle_min_lr = 0.1;
  c.cycle_max_lr = 1.0;
  c.cycle_first_step_size = 10;
  c.cycle_second_step_size = 0;  // = first: S = 20, ratio 0.5
  c.decay_lr_rate = 0.5;
  c.decay_step_size = 10;
  c.cycle_min_mom = 0.8;
  c.cycle_max_mom = 0.9;
  c.decay_mom_rate = 0.1;
  const LrSchedule s = LrSchedule::from_config(c, 1.0);
  EXPECT_NEAR(s.lr(-1), 0.1, kTol);
  EXPECT_NEAR(s.lr(4), 0.55, kTol);                    // x = 5/20 = 0.25, f = 0.5
  EXPECT_NEAR(s.lr(9), 1.0, kTol);                     // x = 0.5, f = 1
  EXPECT_NEAR(s.lr(14), 0.55, kTol);                   // x = 0.75, f = (0.75 - 1) / (0.5 - 1)
  EXPECT_NEAR(s.lr(18), 0.19, 1e-15);                  // x = 0.95, f = 0.1
  EXPECT_NEAR(s.lr(19), 0.1, kTol);                    // x = 0
  EXPECT_NEAR(s.lr(20), 0.1 / (1 + 0.5 * 0.1), kTol);  // decay interval (20 - 20 + 1) / 10
  EXPECT_NEAR(s.lr(29), 0.1 / 1.5, kTol);
  EXPECT_NEAR(*s.momentum(9), 0.8, kTol);  // momentum runs inversely
  EXPECT_NEAR(*s.momentum(4), 0.85, kTol);
  EXPECT_NEAR(*s.momentum(29), 0.9 * 1.1, kTol);
  SchedulerConfig nodecay = c;
  nodecay.decay_step_size = 0;
  nodecay.cycle_momentum = false;
  const LrSchedule n = LrSchedule::from_config(nodecay, 1.0);
  EXPECT_NEAR(n.lr(1000), 0.1, kTol);
  EXPECT_FALSE(n.momentum(3).has_value());
}

// scales_group_lr() says what lr(i, group_lr) does with the group's lr: the constant schedule and
// WarmupCosineLR scale it (twice the group's lr, twice the lr), the others set one lr on every
// group.
TEST(LrSchedule, ScalesGroupLrIsWhatLrDoesWithTheGroupsLr) {
  for (const char* type : {"", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle"}) {
    SchedulerConfig c;
    c.type = type;
    c.warmup_num_steps = 4;
    c.total_num_steps = 20;
    c.cycle_min_lr = 0.01;
    c.cycle_max_lr = 0.1;
    c.cycle_first_step_size = 5;
    const LrSchedule s = LrSchedule::from_config(c, 0.5);
    const bool scales = c.type.empty() || c.type == "WarmupCosineLR";
    EXPECT_EQ(s.scales_group_lr(), scales) << to_string(s.type());
    for (std::int64_t i : {-1, 0, 2, 7, 19, 40}) {
      EXPECT_EQ(s.lr(i, 0.5), s.lr(i)) << to_string(s.type()) << " i=" << i;
      if (s.scales_group_lr()) {
        EXPECT_EQ(s.lr(i, 1.0), 2.0 * s.lr(i, 0.5)) << to_string(s.type()) << " i=" << i;
      } else {
        EXPECT_EQ(s.lr(i, 1.0), s.lr(i, 0.5)) << to_string(s.type()) << " i=" << i;
      }
    }
  }
}

TEST(LrSchedule, BadConfigNamesTheKey) {
  auto config_error = [](SchedulerConfig c, const std::string& key) {
    try {
      (void)LrSchedule::from_config(c, 1e-3);
      ADD_FAILURE() << "no error for " << key;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kConfig);
      EXPECT_NE(e.message().find(key), std::string::npos) << e.what();
    }
  };
  SchedulerConfig c;
  c.type = "StepLR";
  config_error(c, "scheduler.type");
  c.type = "WarmupDecayLR";
  c.total_num_steps = 0;
  config_error(c, "scheduler.params.total_num_steps");
  c.type = "WarmupLR";
  c.warmup_type = "exp";
  config_error(c, "scheduler.params.warmup_type");
  c = {};
  c.type = "OneCycle";
  c.cycle_first_step_size = 0;
  config_error(c, "scheduler.params.cycle_first_step_size");
  c = {};
  c.type = "WarmupLR";
  c.warmup_max_lr = std::nan("");
  config_error(c, "scheduler.params.warmup_max_lr");
  EXPECT_THROW((void)LrSchedule(1.0).lr(-2), Error);
}

}  // namespace
}  // namespace zero
