// tests/common/least_squares.hpp — the model the float64-reference engine tests train
// (accumulation_test.cpp, param_groups_test.cpp, and the LoRA model of lora_training.hpp): one
// linear least-squares regression over n features, loss = mean_i 0.5 (a_i . theta - y_i)^2,
// gradient = mean_i (a_i . theta - y_i) a_i. Samples are made from a seed per (step, micro-step,
// rank), so the trainer's and the reference's data are the same floats; the trainer computes the
// gradient in float from the engine's parameters, the reference in double from its own
// (tests/common/adamw_reference.hpp). Thread safety: pure functions.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace zero::testing::least_squares {

struct Sample {
  std::vector<float> a;
  float y = 0;
};

// `count` samples of n features (scaled so that the gradient norm is O(1)) and targets.
inline std::vector<Sample> batch(int n, int count, int step, int micro, int rank) {
  std::mt19937_64 rng(1000003ULL * static_cast<std::uint64_t>(step) +
                      1009ULL * static_cast<std::uint64_t>(micro) +
                      static_cast<std::uint64_t>(rank));
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<Sample> out(static_cast<std::size_t>(count));
  const float scale = 1.0f / std::sqrt(static_cast<float>(n));
  for (Sample& s : out) {
    s.a.resize(static_cast<std::size_t>(n));
    for (float& v : s.a) v = scale * d(rng);
    s.y = 2.0f * d(rng);
  }
  return out;
}

// n parameters uniform in [-1, 1) from `seed`.
inline std::vector<float> initial_params(int n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> p(static_cast<std::size_t>(n));
  for (float& v : p) v = d(rng);
  return p;
}

// The gradient of the batch's mean loss at theta, in T.
template <typename T, typename P>
std::vector<T> mean_loss_grad(const std::vector<Sample>& b, const std::vector<P>& theta) {
  std::vector<T> g(theta.size(), T(0));
  for (const Sample& s : b) {
    T e = -static_cast<T>(s.y);
    for (std::size_t j = 0; j < theta.size(); ++j) e += static_cast<T>(s.a[j]) * theta[j];
    for (std::size_t j = 0; j < theta.size(); ++j) g[j] += e * static_cast<T>(s.a[j]);
  }
  for (T& v : g) v /= static_cast<T>(b.size());
  return g;
}

// The trainer's gradient: computed in double at the engine's f32 parameters and written in f32,
// so that what differs from the reference is the engine's arithmetic, not the trainer's.
inline std::vector<float> trainer_grad(const std::vector<Sample>& b,
                                       const std::vector<float>& theta) {
  const std::vector<double> g = mean_loss_grad<double>(b, theta);
  return std::vector<float>(g.begin(), g.end());
}

}  // namespace zero::testing::least_squares
