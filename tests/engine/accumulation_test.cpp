// DeepSpeed's gradient-accumulation semantics against an independent float64 reference.
//
// The trainer writes, every micro-step, the gradient of its micro-batch's MEAN loss; the step's
// gradient, the reported grad_norm and the clipping must be those of the mean over N ranks x A
// micro-steps (DeepSpeed's engine scales the loss by 1/A in backward and averages over ranks).
// The reference is data-parallel AdamW in double on that mean gradient, written here from the
// papers' formulas (Kingma & Ba Algorithm 1 with PyTorch's eps placement, decoupled decay as
// Loshchilov & Hutter), not from the engine's code.
//
// The model: one linear least-squares regression over all features, its parameters split into
// units of odd sizes (a prime total, so N never divides a unit): loss = mean_i 0.5 (a_i . theta -
// y_i)^2, gradient = mean_i (a_i . theta - y_i) a_i. The trainer computes it in float from the
// engine's parameters, the reference in double from its own.
//
// Tolerance: the engine keeps f32 parameters and moments; one step changes a parameter by about
// lr, and f32 rounding of the gradient (~1e-7 relative) moves Adam's normalized step by about
// that fraction of lr, so after 10 steps the parameters are within ~1e-7 relative of the float64
// trajectory. Asserted: 1e-6 relative, with relative taken against max(|ref|, 1e-2) (parameters
// crossing zero have no meaningful relative error; their absolute error is ~1e-9). Norms: 1e-6
// relative.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "common/adamw_reference.hpp"
#include "common/least_squares.hpp"
#include "zero/comm/comm.hpp"
#include "zero/config/config.hpp"
#include "zero/engine/engine.hpp"

namespace zero {
namespace {

const std::vector<int> kUnits = {37, 101, 13, 211, 5};  // 367 parameters: prime
constexpr int kBatch = 3;                               // samples per micro-batch
constexpr int kSteps = 10;
constexpr double kLr = 1e-3, kWd = 0.01, kBeta1 = 0.9, kBeta2 = 0.999, kEps = 1e-8;
constexpr double kMaxNorm = 0.3;

int total_params() {
  int n = 0;
  for (int s : kUnits) n += s;
  return n;
}

using testing::least_squares::mean_loss_grad;
using testing::least_squares::trainer_grad;
std::vector<testing::least_squares::Sample> batch(int step, int micro, int rank) {
  return testing::least_squares::batch(total_params(), kBatch, step, micro, rank);
}
std::vector<float> initial_params() {
  return testing::least_squares::initial_params(total_params(), 7);
}

struct Reference {
  std::vector<double> params;
  std::vector<double> norms, coefs;  // per step
};

// Data-parallel AdamW in double on the mean gradient over N ranks x A micro-steps
// (tests/common/adamw_reference.hpp).
Reference reference(int ranks, int accumulation, bool clip) {
  Reference ref;
  testing::AdamW64State s(initial_params());
  for (int step = 0; step < kSteps; ++step) {
    const testing::MeanGradient g = testing::mean_gradient(
        s.p.size(), ranks, accumulation, clip ? kMaxNorm : 0.0,
        [&](int a, int r) { return mean_loss_grad<double>(batch(step, a, r), s.p); });
    ref.norms.push_back(g.norm);
    ref.coefs.push_back(g.coef);
    testing::adamw_step(s, g, step + 1, {kLr, kWd, kBeta1, kBeta2, kEps});
  }
  ref.params = s.p;
  return ref;
}

Config config_for(int stage, int accumulation, bool clip) {
  return parse_config(
      R"({"zero_optimization": {"stage": )" + std::to_string(stage) +
      (stage == 3 ? R"(, "stage3_param_persistence_threshold": 0)" : "") +
      R"(}, "gradient_accumulation_steps": )" + std::to_string(accumulation) +
      R"(, "gradient_clipping": )" + (clip ? std::to_string(kMaxNorm) : std::string("0")) +
      R"(, "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "weight_decay": 0.01,
          "betas": [0.9, 0.999], "eps": 1e-8}}})");
}

struct TrainedRun {
  std::vector<float> params;
  std::vector<StepResult> boundaries;
  bool boundary_pattern_ok = true;
};

// One rank of the managed engine: a unit per slice of theta.
TrainedRun train_managed(Communicator& comm, const Config& cfg, int accumulation) {
  TrainedRun run;
  Engine e(comm, cfg);
  for (std::size_t u = 0; u < kUnits.size(); ++u) {
    e.add_unit({"u" + std::to_string(u), {{"theta", {kUnits[u]}}}});
  }
  const std::vector<float> init = initial_params();
  for (std::size_t u = 0, at = 0; u < kUnits.size(); at += static_cast<std::size_t>(kUnits[u++])) {
    e.set_param(static_cast<UnitId>(u), 0, init.data() + at, static_cast<std::size_t>(kUnits[u]));
  }
  std::vector<float> theta(init.size());
  for (int step = 0; step < kSteps; ++step) {
    for (int a = 0; a < accumulation; ++a) {
      // Forward: the parameters of every unit, gathered (stage 3) while read.
      for (std::size_t u = 0, at = 0; u < kUnits.size();
           at += static_cast<std::size_t>(kUnits[u++])) {
        GatherGuard g = e.gather(static_cast<UnitId>(u));
        const auto* p = static_cast<const float*>(g.param(0).data);
        std::copy(p, p + kUnits[u], theta.begin() + static_cast<long>(at));
      }
      const std::vector<float> grad = trainer_grad(batch(step, a, comm.rank()), theta);
      // Backward, last unit first.
      std::size_t at = theta.size();
      for (std::size_t u = kUnits.size(); u-- > 0;) {
        at -= static_cast<std::size_t>(kUnits[u]);
        auto* g = static_cast<float*>(e.grad(static_cast<UnitId>(u), 0).data);
        std::copy(grad.begin() + static_cast<long>(at),
                  grad.begin() + static_cast<long>(at) + kUnits[u], g);
        e.grads_ready(static_cast<UnitId>(u));
      }
      const StepResult r = e.step();
      run.boundary_pattern_ok = run.boundary_pattern_ok && r.boundary == (a + 1 == accumulation);
      if (r.boundary) run.boundaries.push_back(r);
    }
  }
  run.params.resize(init.size());
  for (std::size_t u = 0, at = 0; u < kUnits.size(); at += static_cast<std::size_t>(kUnits[u++])) {
    e.read_param(static_cast<UnitId>(u), 0, run.params.data() + at,
                 static_cast<std::size_t>(kUnits[u]));
  }
  return run;
}

// One rank of attach mode: the trainer's own flat buffers.
TrainedRun train_attached(Communicator& comm, const Config& cfg, int accumulation) {
  TrainedRun run;
  const auto n = static_cast<std::size_t>(total_params());
  const std::size_t cap = attach_capacity(n, comm.size());
  std::vector<float> params(cap, 0.0f), grads(cap, 0.0f);
  const std::vector<float> init = initial_params();
  std::copy(init.begin(), init.end(), params.begin());
  auto e = Engine::attach(comm, cfg, params.data(), grads.data(), n, cap, DType::kF32);
  for (int step = 0; step < kSteps; ++step) {
    for (int a = 0; a < accumulation; ++a) {
      const std::vector<float> theta(params.begin(), params.begin() + static_cast<long>(n));
      const std::vector<float> g = trainer_grad(batch(step, a, comm.rank()), theta);
      std::fill(grads.begin(), grads.end(), 0.0f);  // the trainer zeroes, then writes
      std::copy(g.begin(), g.end(), grads.begin());
      const StepResult r = e->step();
      run.boundary_pattern_ok = run.boundary_pattern_ok && r.boundary == (a + 1 == accumulation);
      if (r.boundary) run.boundaries.push_back(r);
    }
  }
  run.params.assign(params.begin(), params.begin() + static_cast<long>(n));
  return run;
}

double rel(double got, double want, double floor) {
  return std::fabs(got - want) / std::max(std::fabs(want), floor);
}

TEST(EngineAccumulation, TheStepIsDeepSpeedsMeanOverRanksAndMicroStepsAgainstAFloat64Reference) {
  int runs = 0;
  double worst_param = 0, worst_norm = 0;
  for (bool clip : {false, true}) {
    for (int accumulation : {1, 2, 3, 4}) {
      for (int ranks : {1, 2, 3, 4}) {
        const Reference ref = reference(ranks, accumulation, clip);
        if (clip) {
          const bool engaged =
              std::any_of(ref.coefs.begin(), ref.coefs.end(), [](double c) { return c < 1.0; });
          ASSERT_TRUE(engaged) << "clipping never engaged: the clipped runs would test nothing";
        }
        for (int stage : {0, 1, 2, 3}) {
          for (bool attached : {false, true}) {
            if (attached && stage == 3) continue;  // attach runs stages 0-2
            const std::string what = std::string(attached ? "attach" : "managed") + " stage " +
                                     std::to_string(stage) + " N=" + std::to_string(ranks) +
                                     " A=" + std::to_string(accumulation) +
                                     (clip ? " clipping" : "");
            const Config cfg = config_for(stage, accumulation, clip);
            TrainedRun got;
            std::mutex mu;
            ThreadGroup::run(ranks, [&](Communicator& comm) {
              TrainedRun mine = attached ? train_attached(comm, cfg, accumulation)
                                         : train_managed(comm, cfg, accumulation);
              if (comm.rank() == 0) {
                std::lock_guard<std::mutex> lock(mu);
                got = std::move(mine);
              }
            });
            ++runs;
            EXPECT_TRUE(got.boundary_pattern_ok) << what << ": boundary not every A-th step()";
            ASSERT_EQ(got.boundaries.size(), static_cast<std::size_t>(kSteps)) << what;
            for (int s = 0; s < kSteps; ++s) {
              const StepResult& r = got.boundaries[static_cast<std::size_t>(s)];
              const double dn = rel(r.grad_norm, ref.norms[static_cast<std::size_t>(s)], 0.0);
              worst_norm = std::max(worst_norm, dn);
              EXPECT_LE(dn, 1e-6) << what << " step " << s << ": grad_norm " << r.grad_norm
                                  << ", reference " << ref.norms[static_cast<std::size_t>(s)];
              EXPECT_LE(rel(r.clip_coef, ref.coefs[static_cast<std::size_t>(s)], 0.0), 1e-6)
                  << what << " step " << s << ": clip_coef " << r.clip_coef;
              EXPECT_TRUE(r.applied) << what << " step " << s;
            }
            double d = 0;
            std::size_t at = 0;
            for (std::size_t j = 0; j < ref.params.size(); ++j) {
              const double dj = rel(got.params[j], ref.params[j], 1e-2);
              if (dj > d) {
                d = dj;
                at = j;
              }
            }
            worst_param = std::max(worst_param, d);
            EXPECT_LE(d, 1e-6) << what << ": parameter " << at << " = " << got.params[at]
                               << ", reference " << ref.params[at];
          }
        }
      }
    }
  }
  EXPECT_EQ(runs, 2 * 4 * 4 * 7);
  std::printf(
      "accumulation: %d runs, worst parameter error %.3g, worst norm error %.3g "
      "(relative to float64)\n",
      runs, worst_param, worst_norm);
}

// The semantics, stated as DeepSpeed users see them: the same micro-batches with A = 4 on one
// rank and with A = 1 on four ranks are the same mean gradient, so the same norm.
TEST(EngineAccumulation, FourMicroStepsOnOneRankReportTheNormOfFourRanksAtOnce) {
  auto first_norm = [](int ranks, int accumulation) {
    double norm = 0;
    ThreadGroup::run(ranks, [&](Communicator& comm) {
      const Config cfg = config_for(2, accumulation, false);
      Engine e(comm, cfg);
      e.add_unit({"all", {{"theta", {total_params()}}}});
      const std::vector<float> init = initial_params();
      e.set_param(0, 0, init.data(), init.size());
      for (int a = 0; a < accumulation; ++a) {
        // Micro-step a on one rank sees what rank a sees in one micro-step: the same data.
        const int source = ranks == 1 ? a : comm.rank();
        const std::vector<float> g = trainer_grad(batch(0, 0, source), init);
        auto* dst = static_cast<float*>(e.grad(0, 0).data);
        std::copy(g.begin(), g.end(), dst);
        e.grads_ready(0);
        const StepResult r = e.step();
        if (r.boundary && comm.rank() == 0) norm = r.grad_norm;
      }
    });
    return norm;
  };
  const double one_rank = first_norm(1, 4), four_ranks = first_norm(4, 1);
  EXPECT_GT(one_rank, 0.0);
  EXPECT_LE(rel(one_rank, four_ranks, 0.0), 1e-6)
      << "A = 4 on one rank: " << one_rank << "; four ranks: " << four_ranks;
}

}  // namespace
}  // namespace zero
