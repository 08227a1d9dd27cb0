// The effects of DeepSpeed keys the engine implements for issue 29's "no key silently ignored"
// (config/config_keys.cpp names this file for them):
// - zero_optimization.reduce_scatter = false: stages 1-2 reduce with an all-reduce of the whole
//   buffer and keep this rank's part. The in-process communicator sums in rank order either way,
//   so the run is bitwise the reduce-scatter run; the communicator counts all-reduces instead of
//   reduce-scatters.
// - scheduler OneCycle with cycle_momentum: Adam's beta1 follows the schedule's momentum and
//   beta2 is 0.99 (DeepSpeed's OneCycle), checked against a float64 Adam on one parameter.
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>
#include <string>
#include <vector>

#include "common/mlp_model.hpp"
#include "common/mlp_training.hpp"
#include "zero/comm/comm.hpp"
#include "zero/engine/engine.hpp"
#include "zero/optim/lr_schedule.hpp"

namespace zero {
namespace {

using testing::RunResult;
using testing::RunSpec;

struct Counted {
  RunResult result;
  std::uint64_t all_reduces = 0, reduce_scatters = 0;  // rank 0's calls
};

Counted train_counted(const RunSpec& s) {
  Counted c;
  std::mutex mu;
  ThreadGroup::run(s.ranks, [&](Communicator& comm) {
    RunResult mine = testing::train_rank(comm, s);
    if (comm.rank() == 0) {
      std::lock_guard<std::mutex> lock(mu);
      c.result = std::move(mine);
      const CommStats st = comm.stats();
      c.all_reduces = st[Collective::kAllReduce].calls;
      c.reduce_scatters = st[Collective::kReduceScatter].calls;
    }
  });
  return c;
}

TEST(ReduceScatterKey, FalseAllReducesStages1And2BitwiseTheReduceScatterRun) {
  for (int stage : {1, 2}) {
    for (int n : {2, 3}) {
      for (DType dt : {DType::kF32, DType::kBF16}) {
        for (long bucket : {0L, 1'000'000'000L}) {
          RunSpec s{
              .stage = stage, .ranks = n, .dtype = dt, .accumulation = 2, .clip = true, .steps = 4};
          s.reduce_bucket = bucket;
          const Counted ref = train_counted(s);
          s.reduce_scatter = false;
          const Counted got = train_counted(s);
          const std::string what = describe(s);
          EXPECT_TRUE(testing::bitwise_equal(got.result.params, ref.result.params)) << what;
          EXPECT_TRUE(testing::bitwise_equal(got.result.masters, ref.result.masters)) << what;
          ASSERT_EQ(got.result.steps.size(), ref.result.steps.size()) << what;
          for (std::size_t i = 0; i < ref.result.steps.size(); ++i) {
            EXPECT_EQ(got.result.steps[i].grad_norm, ref.result.steps[i].grad_norm) << what;
          }
          // The gradient reductions moved from reduce-scatter to all-reduce (the masters'
          // gather above and the engine's other collectives are the same in both runs).
          EXPECT_GT(ref.reduce_scatters, 0u) << what;
          EXPECT_EQ(got.reduce_scatters, 0u) << what;
          EXPECT_EQ(got.all_reduces - ref.all_reduces, ref.reduce_scatters) << what;
        }
      }
    }
  }
}

TEST(ReduceScatterKey, Stage3StillReduceScatters) {
  RunSpec s{.stage = 3, .ranks = 2, .steps = 2};
  s.reduce_scatter = false;
  const Counted got = train_counted(s);
  EXPECT_GT(got.reduce_scatters, 0u);
}

// One parameter, one rank, gradient g = x (loss x^2 / 2): Adam in float64 with the betas of
// each step, as the engine must apply them.
std::vector<double> reference_adam(const LrSchedule& sched, bool cycle, int steps, double x0) {
  std::vector<double> xs;
  double x = x0, m = 0, v = 0;
  double b1_pow = 1, b2_pow = 1;
  for (int k = 1; k <= steps; ++k) {
    const double lr = sched.lr(k - 2);
    double b1 = 0.9, b2 = 0.999;
    if (cycle) {
      b1 = *sched.momentum(k - 2);
      b2 = 0.99;
    }
    // Bias correction with the current betas' powers, as the kernels compute it (beta^k).
    b1_pow = std::pow(b1, k);
    b2_pow = std::pow(b2, k);
    const double g = x;
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;
    const double mh = m / (1 - b1_pow), vh = v / (1 - b2_pow);
    x -= lr * (mh / (std::sqrt(vh) + 1e-8));
    xs.push_back(x);
  }
  return xs;
}

std::vector<double> engine_adam(const std::string& scheduler_params, int steps, double x0) {
  const Config cfg = parse_config(
      R"({"optimizer": {"type": "Adam", "params": {"lr": 0.01, "betas": [0.9, 0.999],
          "eps": 1e-8}}, "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.01,
          "cycle_max_lr": 0.1, "cycle_first_step_size": 3, "cycle_min_mom": 0.5,
          "cycle_max_mom": 0.95)" +
      scheduler_params + "}}}");
  std::vector<double> xs;
  ThreadGroup::run(1, [&](Communicator& comm) {
    Engine e(comm, cfg);
    e.add_unit({"u", {{"x", {1}}}});
    const float init = static_cast<float>(x0);
    e.set_param(0, 0, &init, 1);
    for (int k = 0; k < steps; ++k) {
      float x = 0;
      e.read_param(0, 0, &x, 1);
      *e.grad(0, 0).as<float>() = x;
      e.grads_ready(0);
      e.step();
      e.read_param(0, 0, &x, 1);
      xs.push_back(x);
    }
  });
  return xs;
}

TEST(OneCycleMomentum, AdamBeta1FollowsTheScheduleAndBeta2Is099) {
  constexpr int kSteps = 8;
  const Config cfg = parse_config(
      R"({"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.01,
          "cycle_max_lr": 0.1, "cycle_first_step_size": 3, "cycle_min_mom": 0.5,
          "cycle_max_mom": 0.95}}})");
  const LrSchedule sched = LrSchedule::from_config(cfg.scheduler, 0.01);
  const std::vector<double> got = engine_adam("", kSteps, 1.0);
  const std::vector<double> want = reference_adam(sched, true, kSteps, 1.0);
  const std::vector<double> fixed = reference_adam(sched, false, kSteps, 1.0);
  ASSERT_EQ(got.size(), want.size());
  double sep = 0;
  for (int k = 0; k < kSteps; ++k) {
    EXPECT_NEAR(got[k], want[k], 1e-5 * std::max(1.0, std::fabs(want[k]))) << "step " << k + 1;
    sep = std::max(sep, std::fabs(want[k] - fixed[k]));
  }
  EXPECT_GT(sep, 1e-3) << "the momentum cycle must change the trajectory for the test to bite";
  // cycle_momentum false: the optimizer's own betas.
  const std::vector<double> off = engine_adam(R"(, "cycle_momentum": false)", kSteps, 1.0);
  for (int k = 0; k < kSteps; ++k) {
    EXPECT_NEAR(off[k], fixed[k], 1e-5 * std::max(1.0, std::fabs(fixed[k]))) << "step " << k + 1;
  }
}

}  // namespace
}  // namespace zero
