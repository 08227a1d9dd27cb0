// tests/common/mlp_model.hpp — a small MLP trainer written the usual way (forward, hand-written
// backward) against the engine's managed hooks: one unit per layer (W, b), tanh hidden layers,
// mean-squared error. Shared by the engine, checkpoint and offload tests. Computation is in f32
// from the working-dtype parameters; the gradients are written in the working dtype.
// Thread safety: an Mlp is immutable after construction; each rank drives its own engine.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "zero/core/dtype.hpp"
#include "zero/engine/engine.hpp"

namespace zero::testing {

struct Batch {
  std::vector<float> x;  // B x in
  std::vector<float> t;  // B x out
  int rows = 0;
};

// Deterministic data: rank r's batch of micro-step m of step s. A single rank training on the
// concatenation of every rank's batch sees exactly the same samples.
inline Batch make_batch(int in, int out, int rows, std::uint64_t step, std::uint64_t micro,
                        int rank) {
  Batch b;
  b.rows = rows;
  std::mt19937_64 rng(0x9e3779b97f4a7c15ull ^ (step * 1000003ull + micro * 7919ull +
                                               static_cast<std::uint64_t>(rank) * 104729ull));
  std::normal_distribution<float> d(0.0f, 1.0f);
  b.x.resize(static_cast<std::size_t>(rows * in));
  b.t.resize(static_cast<std::size_t>(rows * out));
  for (float& v : b.x) v = d(rng);
  // A fixed teacher (the same on every rank and step) so that there is something to learn:
  // t = sin(sum_i a_oi x_i) with a_oi = cos(7 o + 3 i) / sqrt(in), plus a little noise.
  for (int r = 0; r < rows; ++r) {
    for (int o = 0; o < out; ++o) {
      float z = 0.0f;
      for (int i = 0; i < in; ++i) {
        z += std::cos(7.0f * o + 3.0f * i) / std::sqrt(static_cast<float>(in)) *
             b.x[static_cast<std::size_t>(r * in + i)];
      }
      b.t[static_cast<std::size_t>(r * out + o)] = std::sin(z) + 0.01f * d(rng);
    }
  }
  return b;
}

inline Batch concat(const std::vector<Batch>& parts) {
  Batch b;
  for (const Batch& p : parts) {
    b.x.insert(b.x.end(), p.x.begin(), p.x.end());
    b.t.insert(b.t.end(), p.t.begin(), p.t.end());
    b.rows += p.rows;
  }
  return b;
}

class Mlp {
 public:
  explicit Mlp(std::vector<int> dims) : dims_(std::move(dims)) {}

  // The engine's device when its memory is not host-accessible (views are then read and written
  // through it, as a GPU trainer would upload and download); null: plain host views.
  DeviceOps* device = nullptr;

  int in() const { return dims_.front(); }
  int out() const { return dims_.back(); }
  int layers() const { return static_cast<int>(dims_.size()) - 1; }

  // A unit per layer: W (out x in), b (out).
  std::vector<UnitSpec> unit_specs() const {
    std::vector<UnitSpec> out;
    for (int l = 0; l < layers(); ++l) {
      out.push_back(
          {"layer" + std::to_string(l), {{"W", {dims_[l + 1], dims_[l]}}, {"b", {dims_[l + 1]}}}});
    }
    return out;
  }
  void declare(Engine& e) const {
    for (UnitSpec& u : unit_specs()) e.add_unit(std::move(u));
  }

  // Same values on every rank (seeded).
  void init(Engine& e, std::uint64_t seed) const {
    std::mt19937_64 rng(seed);
    for (int l = 0; l < layers(); ++l) {
      const float scale = 1.0f / std::sqrt(static_cast<float>(dims_[l]));
      std::uniform_real_distribution<float> d(-scale, scale);
      std::vector<float> w(static_cast<std::size_t>(dims_[l + 1] * dims_[l]));
      std::vector<float> b(static_cast<std::size_t>(dims_[l + 1]));
      for (float& v : w) v = d(rng);
      for (float& v : b) v = 0.1f * d(rng);
      e.set_param(l, 0, w.data(), w.size());
      e.set_param(l, 1, b.data(), b.size());
    }
  }

  // One micro-step: forward and backward through the engine's hooks. `inject` (if finite is
  // false) writes an overflow into the first gradient. Returns the (unscaled) loss.
  float micro_step(Engine& e, const Batch& batch, bool inject_overflow = false) const {
    const int B = batch.rows;
    const int L = layers();
    std::vector<std::vector<float>> h(static_cast<std::size_t>(L + 1));
    h[0] = batch.x;
    // ---- forward
    for (int l = 0; l < L; ++l) {
      GatherGuard g = e.gather(l);
      const std::vector<float> W = to_f32(g.param(0));
      const std::vector<float> bias = to_f32(g.param(1));
      const int I = dims_[l], O = dims_[l + 1];
      auto& out = h[static_cast<std::size_t>(l + 1)];
      out.assign(static_cast<std::size_t>(B * O), 0.0f);
      for (int r = 0; r < B; ++r) {
        for (int o = 0; o < O; ++o) {
          float acc = bias[static_cast<std::size_t>(o)];
          for (int i = 0; i < I; ++i)
            acc += W[static_cast<std::size_t>(o * I + i)] *
                   h[static_cast<std::size_t>(l)][static_cast<std::size_t>(r * I + i)];
          out[static_cast<std::size_t>(r * O + o)] = l + 1 < L ? std::tanh(acc) : acc;
        }
      }
    }
    // ---- loss: 1/(2B) sum (y - t)^2, scaled for fp16
    const float scale = static_cast<float>(e.loss_scale());
    float loss = 0.0f;
    std::vector<float> delta(static_cast<std::size_t>(B * out()));
    for (std::size_t k = 0; k < delta.size(); ++k) {
      const float diff = h.back()[k] - batch.t[k];
      loss += 0.5f * diff * diff / static_cast<float>(B);
      delta[k] = diff / static_cast<float>(B) * scale;
    }
    // ---- backward
    for (int l = L - 1; l >= 0; --l) {
      GatherGuard g = e.gather(l);
      const std::vector<float> W = to_f32(g.param(0));
      const int I = dims_[l], O = dims_[l + 1];
      const auto& hin = h[static_cast<std::size_t>(l)];
      std::vector<float> dW(static_cast<std::size_t>(O * I), 0.0f),
          db(static_cast<std::size_t>(O), 0.0f);
      std::vector<float> dprev(static_cast<std::size_t>(B * I), 0.0f);
      for (int r = 0; r < B; ++r) {
        for (int o = 0; o < O; ++o) {
          const float d = delta[static_cast<std::size_t>(r * O + o)];
          db[static_cast<std::size_t>(o)] += d;
          for (int i = 0; i < I; ++i) {
            dW[static_cast<std::size_t>(o * I + i)] += d * hin[static_cast<std::size_t>(r * I + i)];
            dprev[static_cast<std::size_t>(r * I + i)] +=
                d * W[static_cast<std::size_t>(o * I + i)];
          }
        }
      }
      if (inject_overflow && l == 0) dW[0] = 1e30f;
      write(e.grad(l, 0), dW);
      write(e.grad(l, 1), db);
      e.grads_ready(l);
      if (l > 0) {
        for (std::size_t k = 0; k < dprev.size(); ++k) {
          const float a = hin[k];
          dprev[k] *= 1.0f - a * a;  // tanh'
        }
        delta = std::move(dprev);
      }
    }
    return loss;
  }

 private:
  std::vector<float> to_f32(const View& v) const {
    std::vector<float> out(v.count);
    const void* src = v.data;
    std::vector<char> host;
    if (device != nullptr) {
      host.resize(v.bytes());
      device->copy(host.data(), v.data, v.bytes());
      device->synchronize();
      src = host.data();
    }
    convert(src, v.dtype, out.data(), DType::kF32, v.count);
    return out;
  }
  void write(const View& v, const std::vector<float>& values) const {
    if (device == nullptr) {
      convert(values.data(), DType::kF32, v.data, v.dtype, v.count);
      return;
    }
    std::vector<char> host(v.bytes());
    convert(values.data(), DType::kF32, host.data(), v.dtype, v.count);
    device->copy(v.data, host.data(), v.bytes());
    device->synchronize();
  }

  std::vector<int> dims_;
};

}  // namespace zero::testing
