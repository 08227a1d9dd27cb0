// Gradient accumulation with DeepSpeed's semantics, against an independent float64 reference of
// data-parallel AdamW.
//
// Each micro-step the trainer writes the gradient of its micro-batch's MEAN loss, as a DeepSpeed
// user's backward does. The step's gradient is the mean over N ranks x A micro-steps
// (A = gradient_accumulation_steps); StepResult::grad_norm is that mean gradient's L2 norm, and
// gradient_clipping scales it by clip_coef = min(1, max_norm / (norm + 1e-6)) (DeepSpeed's
// clip_grad_norm_, torch.nn.utils.clip_grad_norm_). The reference below computes exactly that in
// double; the engine (f32) must follow it within 1e-6 relative:
//   - managed mode, stages 0-3: three units (63, 45 and 5 parameters; 113 in all, a prime, so no
//     N divides a unit or the model), the trainer writing grad(u, i) and calling step() after
//     every micro-step;
//   - attach mode, stages 0-2: the trainer's flat buffers of attach_capacity(113, N) elements;
//     it writes its micro-batch gradient into its gradient buffer, calls step() after every
//     micro-step and zeroes the buffer after each call (its content is then unspecified);
// for N in {1, 2, 3, 4} ranks (in-process communicator), A in {1, 2, 3, 4}, clipping off and on
// (on: max_norm well below every step's norm, so clipping acts at every step).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "common/adamw_reference.hpp"
#include "common/compare.hpp"
#include "common/mlp_model.hpp"
#include "zero/comm/comm.hpp"
#include "zero/config/config.hpp"
#include "zero/engine/engine.hpp"

namespace zero {
namespace {

using testing::Batch;
using testing::make_batch;

// ---- the model: y = W2 tanh(W1 x + b1) + b2, loss = 1/(2B) sum_rows |y - t|^2 (a mean)

constexpr int kIn = 6;
constexpr int kHidden = 9;
constexpr int kOut = 5;
constexpr int kRows = 3;    // samples per rank per micro-step
constexpr int kSteps = 10;  // optimizer steps per run

// The parameters as one flat vector (the attach-mode trainer's buffer): W1 (kHidden x kIn),
// b1, W2 (kOut x kHidden), b2. Managed mode declares them as units {W1, b1}, {W2}, {b2}.
constexpr std::size_t kW1 = 0;
constexpr std::size_t kB1 = kW1 + kHidden * kIn;
constexpr std::size_t kW2 = kB1 + kHidden;
constexpr std::size_t kB2 = kW2 + kOut * kHidden;
constexpr std::size_t kNumel = kB2 + kOut;
static_assert(kNumel == 113, "the parameter count must stay a prime (no N divides it)");

struct Slot {
  UnitId unit;
  int param;
  std::size_t offset;
  std::size_t numel;
  const char* name;
};
const Slot kSlots[] = {{0, 0, kW1, kB1 - kW1, "W1"},
                       {0, 1, kB1, kW2 - kB1, "b1"},
                       {1, 0, kW2, kB2 - kW2, "W2"},
                       {2, 0, kB2, kNumel - kB2, "b2"}};

void declare(Engine& e) {
  e.add_unit({"hidden", {{"W1", {kHidden, kIn}}, {"b1", {kHidden}}}});  // 63
  e.add_unit({"out", {{"W2", {kOut, kHidden}}}});                       // 45
  e.add_unit({"out_bias", {{"b2", {kOut}}}});                           // 5
}

// The same initial parameters for the engine (f32) and the reference (these values, widened).
std::vector<float> initial_params() {
  std::mt19937_64 rng(42);
  std::vector<float> p(kNumel);
  std::uniform_real_distribution<float> in_layer(-1.0f / std::sqrt(float{kIn}),
                                                 1.0f / std::sqrt(float{kIn}));
  std::uniform_real_distribution<float> out_layer(-1.0f / std::sqrt(float{kHidden}),
                                                  1.0f / std::sqrt(float{kHidden}));
  for (std::size_t i = kW1; i < kB1; ++i) p[i] = in_layer(rng);
  for (std::size_t i = kB1; i < kW2; ++i) p[i] = 0.1f * in_layer(rng);
  for (std::size_t i = kW2; i < kB2; ++i) p[i] = out_layer(rng);
  for (std::size_t i = kB2; i < kNumel; ++i) p[i] = 0.1f * out_layer(rng);
  return p;
}

// Rank r's micro-batch of micro-step m of step s (the shared deterministic generator).
Batch batch_of(int step, int micro, int rank) {
  return make_batch(kIn, kOut, kRows, static_cast<std::uint64_t>(step),
                    static_cast<std::uint64_t>(micro), rank);
}

// The gradient of the batch's mean loss, closed-form backward, in T (float for the trainer,
// double for the reference).
template <typename T>
std::vector<T> mean_loss_gradient(const std::vector<T>& p, const Batch& b) {
  std::vector<T> g(kNumel, T{0});
  const T inv_rows = T{1} / static_cast<T>(b.rows);
  for (int r = 0; r < b.rows; ++r) {
    const float* x = &b.x[static_cast<std::size_t>(r * kIn)];
    const float* t = &b.t[static_cast<std::size_t>(r * kOut)];
    T h[kHidden];
    for (int j = 0; j < kHidden; ++j) {
      T z = p[kB1 + j];
      for (int i = 0; i < kIn; ++i) z += p[kW1 + j * kIn + i] * static_cast<T>(x[i]);
      h[j] = std::tanh(z);
    }
    T dh[kHidden] = {};
    for (int o = 0; o < kOut; ++o) {
      T y = p[kB2 + o];
      for (int j = 0; j < kHidden; ++j) y += p[kW2 + o * kHidden + j] * h[j];
      const T delta = (y - static_cast<T>(t[o])) * inv_rows;  // d loss / d y
      g[kB2 + o] += delta;
      for (int j = 0; j < kHidden; ++j) {
        g[kW2 + o * kHidden + j] += delta * h[j];
        dh[j] += delta * p[kW2 + o * kHidden + j];
      }
    }
    for (int j = 0; j < kHidden; ++j) {
      const T dz = dh[j] * (T{1} - h[j] * h[j]);  // tanh'
      g[kB1 + j] += dz;
      for (int i = 0; i < kIn; ++i) g[kW1 + j * kIn + i] += dz * static_cast<T>(x[i]);
    }
  }
  return g;
}

// ---- the configurations

enum class Mode { kManaged, kAttach };

struct Case {
  Mode mode = Mode::kManaged;
  int stage = 0;
  int ranks = 1;
  int accumulation = 1;
  bool clip = false;
};

std::string describe(const Case& c) {
  return std::string(c.mode == Mode::kManaged ? "managed" : "attach") + " stage " +
         std::to_string(c.stage) + ", N=" + std::to_string(c.ranks) +
         ", A=" + std::to_string(c.accumulation) + (c.clip ? ", clipping" : ", no clipping");
}

// AdamW with eps = 1e-3: comparable to sqrt(v) here (gradient elements ~1e-2..1e-1), so the
// update depends on the gradient's scale. With a tiny eps Adam is invariant to it, and a step
// gradient off by a factor (summed instead of averaged micro-steps) would show only in grad_norm.
Config make_config(const Case& c, double max_norm) {
  char clip[64];
  std::snprintf(clip, sizeof clip, "%.17g", max_norm);  // round-trips the double exactly
  return parse_config(
      R"({"zero_optimization": {"stage": )" + std::to_string(c.stage) +
      (c.stage == 3 ? R"(, "stage3_param_persistence_threshold": 0)" : "") +
      R"(}, "gradient_accumulation_steps": )" + std::to_string(c.accumulation) +
      R"(, "gradient_clipping": )" + clip +
      R"(, "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "betas": [0.9, 0.999],
          "eps": 1e-3, "weight_decay": 0.01}}})");
}

// ---- the float64 reference: data-parallel AdamW on the mean gradient

struct Reference {
  std::vector<double> params;             // after kSteps steps
  std::vector<double> norms, clip_coefs;  // per step
  double lr = 0.0;                        // the (constant) learning rate
};

// Per step t = 1..kSteps:
//   g = 1/(N A) sum_{r < N, m < A} grad of the mean loss of batch (t, m, r)
//   norm = |g|_2;  coef = min(1, max_norm / (norm + 1e-6)) when clipping, else 1;  g *= coef
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   p = p - lr wd p;  p = p - lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)
// i.e. p -= lr (m_hat / (sqrt(v_hat) + eps) + wd p): PyTorch's AdamW, decay applied to the
// parameter before the step, in the operation order of include/zero/optim/detail/optim_math.hpp
// (adam_update) and DeepSpeed's cpu_adam.
Reference reference_run(const Config& cfg, int ranks, int accumulation) {
  const OptimizerConfig& o = cfg.optimizer;
  const double lr = o.lr, b1 = o.betas[0], b2 = o.betas[1], eps = o.eps, wd = o.weight_decay;
  Reference ref;
  ref.lr = lr;
  testing::AdamW64State s(initial_params());
  for (int step = 0; step < kSteps; ++step) {
    const testing::MeanGradient g = testing::mean_gradient(
        kNumel, ranks, accumulation, cfg.gradient_clipping,
        [&](int micro, int r) { return mean_loss_gradient(s.p, batch_of(step, micro, r)); });
    ref.norms.push_back(g.norm);
    ref.clip_coefs.push_back(g.coef);
    testing::adamw_step(s, g, step + 1, {lr, wd, b1, b2, eps}, testing::AdamWForm::kOptimMath);
  }
  ref.params = s.p;
  return ref;
}

// ---- the engine runs

struct Observed {
  std::vector<float> params;        // after the run, flat
  std::vector<bool> boundary;       // per step() call
  std::vector<StepResult> updates;  // the results of the boundary calls
};

// Reads every parameter (managed: through the engine, a collective in stage 3) into flat order.
std::vector<float> read_flat(Engine& e) {
  const testing::Tensors tensors = testing::read_params(e);
  std::vector<float> flat(kNumel);
  for (std::size_t s = 0; s < std::size(kSlots); ++s) {
    std::copy(tensors[s].begin(), tensors[s].end(), flat.begin() + kSlots[s].offset);
  }
  return flat;
}

// One managed-mode micro-step: gather every unit for the forward, then in backward order gather
// again, write the unit's gradients and hand them over.
void managed_micro_step(Engine& e, const Batch& batch) {
  std::vector<float> p(kNumel);
  for (UnitId u = 0; u < e.num_units(); ++u) {
    GatherGuard g = e.gather(u);
    for (const Slot& s : kSlots) {
      if (s.unit != u) continue;
      const View view = g.param(s.param);
      const float* values = static_cast<const float*>(view.data);
      std::copy(values, values + s.numel, p.begin() + s.offset);
    }
  }
  const std::vector<float> grad = mean_loss_gradient(p, batch);
  for (UnitId u = e.num_units() - 1; u >= 0; --u) {
    GatherGuard g = e.gather(u);
    for (const Slot& s : kSlots) {
      if (s.unit != u) continue;
      const View view = e.grad(u, s.param);
      std::copy(grad.begin() + s.offset, grad.begin() + s.offset + s.numel,
                static_cast<float*>(view.data));
    }
    e.grads_ready(u);
  }
}

// Runs the case on `ranks` threads; every rank's observations (index: rank).
std::vector<Observed> run_engine(const Case& c, const Config& cfg) {
  std::vector<Observed> out(static_cast<std::size_t>(c.ranks));
  ThreadGroup::run(c.ranks, [&](Communicator& comm) {
    Observed& mine = out[static_cast<std::size_t>(comm.rank())];
    const std::vector<float> p0 = initial_params();
    const int calls = kSteps * c.accumulation;
    const auto record = [&](const StepResult& r) {
      mine.boundary.push_back(r.boundary);
      if (r.boundary) mine.updates.push_back(r);
    };
    if (c.mode == Mode::kManaged) {
      Engine e(comm, cfg);
      declare(e);
      for (const Slot& s : kSlots) e.set_param(s.unit, s.param, p0.data() + s.offset, s.numel);
      for (int k = 0; k < calls; ++k) {
        managed_micro_step(e, batch_of(k / c.accumulation, k % c.accumulation, comm.rank()));
        record(e.step());
      }
      mine.params = read_flat(e);
      return;
    }
    const std::size_t capacity = attach_capacity(kNumel, comm.size());
    std::vector<float> params(capacity, 0.0f), grads(capacity, 0.0f);
    std::copy(p0.begin(), p0.end(), params.begin());
    auto e = Engine::attach(comm, cfg, params.data(), grads.data(), kNumel, capacity, DType::kF32);
    for (int k = 0; k < calls; ++k) {
      const std::vector<float> p(params.begin(), params.begin() + kNumel);
      const std::vector<float> grad =
          mean_loss_gradient(p, batch_of(k / c.accumulation, k % c.accumulation, comm.rank()));
      std::copy(grad.begin(), grad.end(), grads.begin());
      record(e->step());
      std::fill(grads.begin(), grads.end(), 0.0f);  // unspecified after step(): the trainer zeroes
    }
    mine.params.assign(params.begin(), params.begin() + kNumel);
  });
  return out;
}

// ---- the comparison
//
// Tolerance: 1e-6 relative, an element x against its reference value ref passing when
//   |x - ref| <= 1e-6 * max(|ref|, lr * kSteps).
// The engine's parameters are f32, rounded twice per step (decay, Adam step): at most 2^-24
// relative each, 20 roundings in all, ~1e-7 typically (random signs). The f32 gradients (the
// trainer's sums of O(1) terms, the engine's mean over N x A of them) carry an absolute error of
// ~1e-8, which the update m_hat / (sqrt(v_hat) + eps) divides by sqrt(v_hat) + eps >= eps: a
// few 1e-7 of the update's size, |update| <= ~lr. That error does not shrink with the element,
// so an element near zero is measured against the distance AdamW can move a parameter in the
// run, lr * kSteps = 0.1 (each |m_hat / (sqrt(v_hat) + eps)| is ~1 at most). Observed: <= 4.5e-7
// over every case (A > 1 with the engine of the mean emulated by writing gradient / A).
// grad_norm and clip_coef: the norm of an f32 gradient that agrees with the reference to ~1e-7;
// observed <= 7e-8. A step gradient summed over A micro-steps (norm off by A), a missing rank's
// contribution, a lost micro-step or clipping on another norm are all far outside 1e-6.
constexpr double kRelTol = 1e-6;

std::string param_name(std::size_t i) {
  for (const Slot& s : kSlots) {
    if (i >= s.offset && i < s.offset + s.numel) {
      return std::string(s.name) + "[" + std::to_string(i - s.offset) + "]";
    }
  }
  return "?";
}

void check(const Case& c, const Reference& ref, const std::vector<Observed>& ranks) {
  const std::string what = describe(c);
  const double floor = ref.lr * kSteps;  // see "Tolerance" above
  for (std::size_t rank = 0; rank < ranks.size(); ++rank) {
    const Observed& o = ranks[rank];
    const std::string where = what + ", rank " + std::to_string(rank);
    // Boundaries: exactly every A-th call.
    ASSERT_EQ(o.boundary.size(), static_cast<std::size_t>(kSteps * c.accumulation)) << where;
    for (std::size_t k = 0; k < o.boundary.size(); ++k) {
      const bool want = (k + 1) % static_cast<std::size_t>(c.accumulation) == 0;
      if (o.boundary[k] != want) {
        ADD_FAILURE() << where << ": step() call " << k + 1 << " returned boundary "
                      << o.boundary[k] << ", want " << want << " (every A-th call)";
        break;
      }
    }
    ASSERT_EQ(o.updates.size(), static_cast<std::size_t>(kSteps)) << where;
    // grad_norm and clip_coef at every boundary; the first mismatch reported with its ratio.
    for (int s = 0; s < kSteps; ++s) {
      const StepResult& r = o.updates[static_cast<std::size_t>(s)];
      EXPECT_TRUE(r.applied) << where << ": update " << s + 1 << " not applied";
      const double norm_ref = ref.norms[static_cast<std::size_t>(s)];
      const double coef_ref = ref.clip_coefs[static_cast<std::size_t>(s)];
      if (std::fabs(r.grad_norm - norm_ref) > kRelTol * norm_ref) {
        ADD_FAILURE() << where << ": grad_norm at update " << s + 1 << " is " << r.grad_norm
                      << ", the reference (mean over N x A micro-batches) " << norm_ref
                      << ", ratio " << r.grad_norm / norm_ref;
        break;
      }
      if (std::fabs(r.clip_coef - coef_ref) > kRelTol * coef_ref) {
        ADD_FAILURE() << where << ": clip_coef at update " << s + 1 << " is " << r.clip_coef
                      << ", the reference " << coef_ref << ", ratio " << r.clip_coef / coef_ref;
        break;
      }
      if (c.clip) {
        EXPECT_LT(r.clip_coef, 1.0) << where << ": clipping did not act at update " << s + 1;
      }
    }
    // The parameters: the worst element, and how many are out of tolerance.
    ASSERT_EQ(o.params.size(), kNumel) << where;
    std::size_t worst = 0, bad = 0;
    double worst_err = 0.0;
    for (std::size_t i = 0; i < kNumel; ++i) {
      const double err =
          std::fabs(o.params[i] - ref.params[i]) / std::max(std::fabs(ref.params[i]), floor);
      if (!(err <= kRelTol)) ++bad;
      if (!(err <= worst_err)) {
        worst_err = err;
        worst = i;
      }
    }
    EXPECT_EQ(bad, 0u) << where << ": " << bad << " of " << kNumel
                       << " parameters off the float64 reference by more than " << kRelTol
                       << " relative; worst " << param_name(worst) << " = " << o.params[worst]
                       << ", reference " << ref.params[worst] << " (relative error " << worst_err
                       << ")";
  }
}

class Accumulation : public ::testing::TestWithParam<Case> {};

TEST_P(Accumulation, MatchesFloat64DataParallelAdamWOnTheMeanGradient) {
  const Case c = GetParam();
  SCOPED_TRACE(describe(c));
  double max_norm = 0.0;
  if (c.clip) {
    // Well below every step's norm (a quarter of the smallest unclipped one), so clipping acts
    // at every update and the test cannot pass with clipping ignored.
    const Reference unclipped = reference_run(make_config(c, 0.0), c.ranks, c.accumulation);
    max_norm = 0.25 * *std::min_element(unclipped.norms.begin(), unclipped.norms.end());
  }
  const Config cfg = make_config(c, max_norm);
  const Reference ref = reference_run(cfg, c.ranks, c.accumulation);
  if (c.clip) {
    for (double coef : ref.clip_coefs) ASSERT_LT(coef, 0.9) << "clipping too weak to be tested";
  }
  std::vector<Observed> observed;
  try {
    observed = run_engine(c, cfg);
  } catch (const std::exception& e) {
    FAIL() << describe(c) << ": the engine threw: " << e.what();
  }
  check(c, ref, observed);
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (Mode mode : {Mode::kManaged, Mode::kAttach}) {
    for (int stage = 0; stage <= (mode == Mode::kManaged ? 3 : 2); ++stage) {
      for (int ranks = 1; ranks <= 4; ++ranks) {
        for (int accumulation = 1; accumulation <= 4; ++accumulation) {
          for (bool clip : {false, true}) cases.push_back({mode, stage, ranks, accumulation, clip});
        }
      }
    }
  }
  return cases;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return std::string(c.mode == Mode::kManaged ? "Managed" : "Attach") + "Stage" +
         std::to_string(c.stage) + "N" + std::to_string(c.ranks) + "A" +
         std::to_string(c.accumulation) + (c.clip ? "Clip" : "NoClip");
}

INSTANTIATE_TEST_SUITE_P(Engine, Accumulation, ::testing::ValuesIn(all_cases()), case_name);

}  // namespace
}  // namespace zero
