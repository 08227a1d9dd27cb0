// LossScaler against DeepSpeed's DynamicLossScaler.update_scale, step by step
// (deepspeed/runtime/fp16/loss_scaler.py), and its construction from the fp16 config block.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "zero/config/config.hpp"
#include "zero/core/error.hpp"
#include "zero/optim/loss_scaler.hpp"
#include "zero/optim/optimizer.hpp"

namespace zero {
namespace {

// One scripted step: the overflow flag fed in and the state DeepSpeed has afterwards.
struct Expect {
  bool overflow;
  double scale;
  int cur_hysteresis;
};

void run_script(LossScaler& s, const std::vector<Expect>& script) {
  for (std::size_t i = 0; i < script.size(); ++i) {
    const bool stepped = s.update(script[i].overflow);
    EXPECT_EQ(stepped, !script[i].overflow) << "iter " << i;
    EXPECT_EQ(s.scale(), script[i].scale) << "iter " << i;
    EXPECT_EQ(s.state().cur_hysteresis, script[i].cur_hysteresis) << "iter " << i;
    EXPECT_EQ(s.state().iter, static_cast<std::int64_t>(i + 1));
  }
}

TEST(LossScaler, GrowsAfterEachWindowOfGoodSteps) {
  // window 4, hysteresis 1: (iter - last_overflow_iter) % 4 == 0 at iters 3, 7 (last = -1).
  LossScaler s = LossScaler::dynamic(65536, 4, 1, false, 1);
  run_script(s, {{false, 65536, 1},
                 {false, 65536, 1},
                 {false, 65536, 1},
                 {false, 131072, 1},
                 {false, 131072, 1},
                 {false, 131072, 1},
                 {false, 131072, 1},
                 {false, 262144, 1},
                 // overflow at iter 8: halve; the window restarts from iter 8
                 {true, 131072, 1},
                 {false, 131072, 1},
                 {false, 131072, 1},
                 {false, 131072, 1},
                 {false, 262144, 1}});
  EXPECT_EQ(s.state().last_overflow_iter, 8);
}

TEST(LossScaler, HysteresisDelaysTheDecrease) {
  // hysteresis 2: the first overflow only spends hysteresis; later overflows halve while
  // cur_hysteresis stays 1, until a full window refills it (and doubles the scale).
  LossScaler s = LossScaler::dynamic(1024, 3, 2, false, 1);
  run_script(s, {{true, 1024, 1},    // iter 0: hysteresis 2 -> 1
                 {true, 512, 1},     // iter 1: halve
                 {false, 512, 1},    // iter 2: (2-1) % 3 != 0
                 {true, 256, 1},     // iter 3: halve (cur_hysteresis still 1)
                 {false, 256, 1},    // iter 4
                 {false, 256, 1},    // iter 5
                 {false, 512, 2},    // iter 6: (6-3) % 3 == 0: refill, double
                 {true, 512, 1},     // iter 7: spend hysteresis again
                 {false, 512, 1}});  // iter 8
}

TEST(LossScaler, ConsecutiveHysteresisRefillsAfterEveryGoodStep) {
  LossScaler s = LossScaler::dynamic(1024, 100, 2, true, 1);
  run_script(s, {{true, 1024, 1},   // spend
                 {false, 1024, 2},  // refilled by the good step
                 {true, 1024, 1},   // spend again: alternating overflows never halve
                 {false, 1024, 2},
                 {true, 1024, 1},
                 {true, 512, 1}});  // two in a row do
}

TEST(LossScaler, StopsAtMinimumThenFailsClearly) {
  LossScaler s = LossScaler::dynamic(8, 1000, 1, false, 3);
  run_script(s, {{true, 4, 1}, {true, 3, 1}});  // max(4 / 2, 3) = 3
  const LossScaler::State before = s.state();
  try {
    s.update(true);
    FAIL() << "no error at the minimum scale";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.message()).find("already at minimum"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s.state().scale, before.scale);
  EXPECT_EQ(s.state().iter, before.iter);  // unchanged, as DeepSpeed raises before any update
  // Without raise_error_at_min_scale the scale just stays there.
  LossScaler quiet = LossScaler::dynamic(2, 1000, 1, false, 1, 2.0, false);
  run_script(quiet, {{true, 1, 1}, {true, 1, 1}, {false, 1, 1}});
}

TEST(LossScaler, StaticScaleNeverChanges) {
  LossScaler s = LossScaler::fixed(128);
  EXPECT_FALSE(s.is_dynamic());
  EXPECT_FALSE(s.update(true));
  EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 128);
  EXPECT_EQ(s.grad_scale(0.5), static_cast<float>(0.5 / 128));
}

TEST(LossScaler, FromConfig) {
  Fp16Config c;
  EXPECT_EQ(LossScaler::from_config(c).scale(), 1.0);  // fp16 off
  EXPECT_FALSE(LossScaler::from_config(c).is_dynamic());
  c.enabled = true;
  LossScaler d = LossScaler::from_config(c);
  EXPECT_TRUE(d.is_dynamic());
  EXPECT_EQ(d.scale(), 65536.0);  // 2^16
  EXPECT_EQ(d.state().cur_hysteresis, 2);
  c.loss_scale = 512;
  EXPECT_EQ(LossScaler::from_config(c).scale(), 512);
  EXPECT_FALSE(LossScaler::from_config(c).is_dynamic());

  auto config_error = [](Fp16Config bad, const std::string& key) {
    try {
      (void)LossScaler::from_config(bad);
      ADD_FAILURE() << "no error for " << key;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kConfig);
      EXPECT_NE(e.message().find(key), std::string::npos) << e.what();
    }
  };
  Fp16Config bad;
  bad.enabled = true;
  bad.loss_scale_window = 0;
  config_error(bad, "fp16.loss_scale_window");
  bad = {};
  bad.enabled = true;
  bad.hysteresis = 0;
  config_error(bad, "fp16.hysteresis");
  bad = {};
  bad.enabled = true;
  bad.min_loss_scale = 0;
  config_error(bad, "fp16.min_loss_scale");
  bad = {};
  bad.enabled = true;
  bad.loss_scale = -1;
  config_error(bad, "fp16.loss_scale");
  EXPECT_THROW(LossScaler::fixed(0), Error);
  EXPECT_THROW(LossScaler::dynamic(1, 1, 1, false, 1, 1.0), Error);
}

TEST(LossScaler, StateRoundTrips) {
  LossScaler a = LossScaler::dynamic(1024, 3, 2, false, 1);
  a.update(true);
  a.update(false);
  LossScaler b = LossScaler::dynamic(1024, 3, 2, false, 1);
  b.load_state(a.state());
  for (bool o : {true, false, false, false, true}) {
    EXPECT_EQ(a.update(o), b.update(o));
    EXPECT_EQ(a.scale(), b.scale());
  }
  LossScaler::State bad = a.state();
  bad.cur_hysteresis = 0;
  EXPECT_THROW(b.load_state(bad), Error);
}

// The fp16 step as the engine runs it: one read of the gradients decides; an overflow skips the
// optimizer, so master parameters and moments keep their bits, and the scale drops.
TEST(LossScaler, OverflowSkipsTheStepAndTouchesNoState) {
  OptimizerParams hp;
  const std::size_t n = 1000;
  std::vector<float> p(n, 0.5f), m(n, 0.01f), v(n, 0.02f);
  std::vector<std::uint16_t> g(n, 0x3c00);  // f16 1.0
  g[777] = 0x7c00;                          // f16 +Inf
  ShardRef shard;
  shard.count = n;
  shard.master = p.data();
  shard.grad = g.data();
  shard.grad_dtype = DType::kF16;
  shard.state[0] = m.data();
  shard.state[1] = v.data();
  CpuOptimizer opt;
  LossScaler scaler = LossScaler::dynamic(65536, 1000, 1, false, 1);
  const auto p0 = p, m0 = m, v0 = v;
  const GradStats stats = opt.grad_stats(g.data(), DType::kF16, n);
  ASSERT_TRUE(stats.non_finite);
  if (scaler.update(stats.non_finite)) opt.step(hp, shard, 1, scaler.grad_scale());
  EXPECT_EQ(p, p0);
  EXPECT_EQ(m, m0);
  EXPECT_EQ(v, v0);
  EXPECT_EQ(scaler.scale(), 32768);
  g[777] = 0x3c00;
  ASSERT_FALSE(opt.grad_stats(g.data(), DType::kF16, n).non_finite);
  ASSERT_TRUE(scaler.update(false));
  opt.step(hp, shard, 1, scaler.grad_scale());
  EXPECT_NE(p, p0);
}

}  // namespace
}  // namespace zero
