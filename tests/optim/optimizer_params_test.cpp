// The optimizer's hyper-parameters: the per-step scalars (bias correction, SGD's first step),
// OptimizerParams from the config's optimizer block, and CpuOptimizer's argument errors (each a
// zero::Error naming the problem, nothing written).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "zero/config/config.hpp"
#include "zero/core/dtype.hpp"
#include "zero/core/error.hpp"
#include "zero/optim/optimizer.hpp"

namespace zero {
namespace {

constexpr std::uint16_t kPoison16 = 0xffff;  // NaN in bf16 and f16

// ---- per-step scalars
TEST(StepScalars, SgdStartsTheBufferAtTheGradient) {
  OptimizerParams hp;
  hp.type = OptimizerType::kSgd;
  hp.momentum = 0.9;
  hp.dampening = 0.5;
  auto s1 = detail::optim::make_step_scalars(hp, 1, 1.0f);
  EXPECT_EQ(s1.beta1, 0.0f);
  EXPECT_EQ(s1.one_minus_beta1, 1.0f);
  auto s2 = detail::optim::make_step_scalars(hp, 2, 1.0f);
  EXPECT_EQ(s2.beta1, 0.9f);
  EXPECT_EQ(s2.one_minus_beta1, 0.5f);
}

TEST(StepScalars, AdamBiasCorrection) {
  OptimizerParams hp;  // AdamW, lr 1e-3, betas 0.9/0.999
  auto s = detail::optim::make_step_scalars(hp, 3, 0.5f);
  EXPECT_EQ(s.grad_scale, 0.5f);
  EXPECT_EQ(s.neg_step, static_cast<float>(-1e-3 / (1 - std::pow(0.9, 3))));
  EXPECT_EQ(s.inv_sqrt_bc2, static_cast<float>(1 / std::sqrt(1 - std::pow(0.999, 3))));
  hp.bias_correction = false;
  s = detail::optim::make_step_scalars(hp, 3, 0.5f);
  EXPECT_EQ(s.neg_step, -1e-3f);
  EXPECT_EQ(s.inv_sqrt_bc2, 1.0f);
}

// ---- configuration
TEST(OptimizerParams, FromConfig) {
  OptimizerConfig c;
  c.type = "adam";
  c.lr = 3e-4;
  c.betas = {0.8, 0.95};
  c.weight_decay = 0.1;
  c.adam_w_mode = false;
  c.moment_dtype = "bf16";
  const OptimizerParams p = OptimizerParams::from_config(c);
  EXPECT_EQ(p.type, OptimizerType::kAdam);
  EXPECT_EQ(p.lr, 3e-4);
  EXPECT_EQ(p.beta1, 0.8);
  EXPECT_EQ(p.beta2, 0.95);
  EXPECT_FALSE(p.adam_w_mode);
  EXPECT_EQ(p.moment_dtype, MomentDType::kBF16);
  EXPECT_EQ(p.num_states(), 2);

  auto config_error = [](OptimizerConfig bad, const std::string& key) {
    try {
      OptimizerParams::from_config(bad);
      ADD_FAILURE() << "no error for " << key;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kConfig) << e.what();
      EXPECT_NE(e.message().find(key), std::string::npos) << e.what();
    }
  };
  OptimizerConfig bad = c;
  bad.type = "RMSprop";
  config_error(bad, "optimizer.type");
  bad = c;
  bad.betas = {1.0, 0.9};
  config_error(bad, "optimizer.params.betas[0]");
  bad = c;
  bad.lr = -1;
  config_error(bad, "optimizer.params.lr");
  bad = c;
  bad.type = "SGD";
  bad.moment_dtype = "bf16";
  config_error(bad, "optimizer.params.moment_dtype");
  bad = c;
  bad.type = "SGD";
  bad.moment_dtype = "f32";
  bad.nesterov = true;
  config_error(bad, "optimizer.params.nesterov");
}

// ---- bad arguments: zero::Error naming the problem, nothing written
void expect_invalid(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(CpuOptimizer, BadArgumentsAreErrors) {
  OptimizerParams hp;
  std::vector<float> p(64, 1.0f), m(64, 0.0f), v(64, 0.0f), g(64, 1.0f);
  std::vector<std::uint16_t> copy(64, kPoison16);
  ShardRef ok;
  ok.count = 64;
  ok.master = p.data();
  ok.grad = g.data();
  ok.state[0] = m.data();
  ok.state[1] = v.data();
  CpuOptimizer opt;
  const std::vector<float> p_before = p;

  expect_invalid([&] { opt.step(hp, ok, 0); }, "step number 0");
  expect_invalid([&] { opt.step(hp, ok, 1, 0.0f); }, "grad_scale");
  expect_invalid([&] { opt.step(hp, ok, 1, std::numeric_limits<float>::infinity()); },
                 "grad_scale");
  expect_invalid([&] { opt.step(hp, ok, 1, std::numeric_limits<float>::quiet_NaN()); },
                 "grad_scale");
  ShardRef s = ok;
  s.master = nullptr;
  expect_invalid([&] { opt.step(hp, s, 1); }, "master is null");
  s = ok;
  s.grad = nullptr;
  expect_invalid([&] { opt.step(hp, s, 1); }, "grad is null");
  s = ok;
  s.state[1] = nullptr;
  expect_invalid([&] { opt.step(hp, s, 1); }, "state[1] is null");
  s = ok;
  s.master = reinterpret_cast<float*>(reinterpret_cast<char*>(p.data()) + 2);
  expect_invalid([&] { opt.step(hp, s, 1); }, "master");
  s = ok;
  s.param_copy = copy.data();
  s.param_copy_dtype = DType::kF32;
  expect_invalid([&] { opt.step(hp, s, 1); }, "param_copy_dtype");
  OptimizerParams bad = hp;
  bad.beta2 = 1.0;
  expect_invalid([&] { opt.step(bad, ok, 1); }, "betas[1]");
  bad = hp;
  bad.eps = -1;
  expect_invalid([&] { opt.step(bad, ok, 1); }, "eps");
  bad = hp;
  bad.type = OptimizerType::kLion;
  bad.moment_dtype = MomentDType::kBF16;
  expect_invalid([&] { opt.step(bad, ok, 1); }, "moment_dtype");
  bad = {};
  bad.type = OptimizerType::kSgd;
  bad.nesterov = true;
  expect_invalid([&] { opt.step(bad, ok, 1); }, "Nesterov");
  EXPECT_EQ(p, p_before) << "a failed step wrote the master";
  EXPECT_TRUE(
      std::all_of(copy.begin(), copy.end(), [](std::uint16_t x) { return x == kPoison16; }));

  CpuExecOptions o;
  o.threads = -1;
  expect_invalid([&] { CpuOptimizer x(o); }, "threads");
  o = {};
  o.block_elems = 100;
  expect_invalid([&] { CpuOptimizer x(o); }, "block_elems");
  expect_invalid([&] { (void)parse_optimizer_type("adamax"); }, "adamax");
  expect_invalid([&] { (void)opt.grad_stats(nullptr, DType::kF32, 3); }, "grad is null");
  // An empty shard is a no-op, null pointers and all.
  EXPECT_NO_THROW(opt.step(hp, ShardRef{}, 1));
}

}  // namespace
}  // namespace zero
