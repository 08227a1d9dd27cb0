// tests/common/adamw_reference.hpp — the float64 reference of data-parallel AdamW that the engine
// tests hold a training run to (accumulation_test, accumulation_mlp_test, param_groups_test),
// written from the papers' formulas, not from the engine's code:
//   - the step's gradient with DeepSpeed's meaning: the mean over N ranks x A micro-batches of
//     each micro-batch's mean-loss gradient; its L2 norm; the clipping coefficient
//     min(1, max_norm / (norm + 1e-6)) of DeepSpeed's clip_grad_norm_ (torch's too);
//   - AdamW: Kingma & Ba, Algorithm 1, with PyTorch's eps placement; the decay decoupled
//     (Loshchilov & Hutter) and applied to the parameter before the step, as torch.optim.AdamW.
// The model, its gradient and the tolerance stay with each test.
//
// Thread safety: pure functions of their arguments; an AdamW64State belongs to its caller.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace zero::testing {

// One step's gradient before clipping, its norm and the clipping coefficient (1: no clipping).
struct MeanGradient {
  std::vector<double> g;
  double norm = 0.0;
  double coef = 1.0;
};

// The mean over `ranks` x `accumulation` micro-batches of grad(micro, rank), a std::vector<double>
// of n elements each; clipped at max_norm (<= 0: not clipped). Summed rank by rank, micro-batch
// by micro-batch, then divided: the reference's order, whatever the engine's.
template <typename Grad>
MeanGradient mean_gradient(std::size_t n, int ranks, int accumulation, double max_norm,
                           Grad&& grad) {
  MeanGradient out;
  out.g.assign(n, 0.0);
  for (int r = 0; r < ranks; ++r) {
    for (int a = 0; a < accumulation; ++a) {
      const std::vector<double> gi = grad(a, r);
      for (std::size_t j = 0; j < n; ++j) out.g[j] += gi[j];
    }
  }
  double sq = 0.0;
  for (double& x : out.g) {
    x /= static_cast<double>(ranks * accumulation);
    sq += x * x;
  }
  out.norm = std::sqrt(sq);
  out.coef = max_norm > 0.0 ? std::min(1.0, max_norm / (out.norm + 1e-6)) : 1.0;
  return out;
}

// One parameter group's options (lr already scaled by a schedule, if any).
struct AdamW64 {
  double lr, weight_decay, beta1, beta2, eps;
};

// Which of two equal formulas the division takes (they differ in the last bits):
//   kPaper:     p -= lr * m_hat / (sqrt(v_hat) + eps), m_hat = m / (1 - b1^t), v_hat likewise;
//   kOptimMath: p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps), the operation order
//               of include/zero/optim/detail/optim_math.hpp (adam_update) and DeepSpeed's cpu_adam.
enum class AdamWForm { kPaper, kOptimMath };

// One AdamW update of one element at step t (1-based) with gradient g (already clipped).
inline void adamw_update(double& p, double& m, double& v, double g, const AdamW64& o, double t,
                         AdamWForm form = AdamWForm::kPaper) {
  m = o.beta1 * m + (1.0 - o.beta1) * g;
  v = o.beta2 * v + (1.0 - o.beta2) * g * g;
  p -= o.lr * o.weight_decay * p;
  const double bc1 = 1.0 - std::pow(o.beta1, t), bc2 = 1.0 - std::pow(o.beta2, t);
  if (form == AdamWForm::kPaper) {
    p -= o.lr * (m / bc1) / (std::sqrt(v / bc2) + o.eps);
  } else {
    p -= o.lr / bc1 * m / (std::sqrt(v) / std::sqrt(bc2) + o.eps);
  }
}

// The parameters and both moments of a whole model, in double.
struct AdamW64State {
  std::vector<double> p, m, v;
  // Starts at `init` (the engine's f32 initial values, widened), moments zero.
  template <typename T>
  explicit AdamW64State(const std::vector<T>& init)
      : p(init.begin(), init.end()), m(p.size(), 0.0), v(p.size(), 0.0) {}
};

// One step of every element with the clipped mean gradient; options_of(j) -> AdamW64 gives
// element j's group options.
template <typename OptionsOf>
void adamw_step(AdamW64State& s, const MeanGradient& g, double t, OptionsOf&& options_of,
                AdamWForm form = AdamWForm::kPaper) {
  for (std::size_t j = 0; j < s.p.size(); ++j) {
    adamw_update(s.p[j], s.m[j], s.v[j], g.g[j] * g.coef, options_of(j), t, form);
  }
}

// The same with one set of options for every element.
inline void adamw_step(AdamW64State& s, const MeanGradient& g, double t, const AdamW64& o,
                       AdamWForm form = AdamWForm::kPaper) {
  adamw_step(
      s, g, t, [&](std::size_t) -> const AdamW64& { return o; }, form);
}

}  // namespace zero::testing
