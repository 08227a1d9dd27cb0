// Activation checkpointing: gradients bitwise equal to the plain run for every policy, and the
// activation bytes measured by the tracker within the predicted bound.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/discrete_device.hpp"
#include "zero/core/error.hpp"
#include "zero/engine/activation_checkpointing.hpp"

namespace zero {
namespace {

constexpr std::size_t kWidth = 64;  // activation elements between layers

// y = tanh(W_l x + b_l); saves x and y (charged to the tracker) for backward; accumulates dW.
class TanhLayers : public CheckpointedLayers {
 public:
  TanhLayers(int n, MemoryTracker& t) : t_(t), saved_(static_cast<std::size_t>(n)) {
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.0f, 0.2f);
    w_.resize(static_cast<std::size_t>(n) * kWidth * kWidth);
    for (float& v : w_) v = nd(rng);
    dw_.assign(w_.size(), 0.0f);
  }
  // The layers run "on the device": a discrete device's memory is reached through untag (what a
  // kernel does); host memory is unchanged by it.
  void forward(int l, const float* in_any, float* out_any) override {
    const float* in = testing::untag(in_any);
    float* out = testing::untag(out_any);
    ++forwards;
    Buffer& s = saved_[static_cast<std::size_t>(l)];
    ASSERT_TRUE(s.empty()) << "layer " << l << " ran forward twice without drop";
    s = Buffer::host(t_, MemCategory::kActivations, 2 * kWidth * sizeof(float));
    float* x = s.as<float>();
    float* y = x + kWidth;
    std::memcpy(x, in, kWidth * sizeof(float));
    const float* w = &w_[static_cast<std::size_t>(l) * kWidth * kWidth];
    for (std::size_t o = 0; o < kWidth; ++o) {
      float a = 0.01f * static_cast<float>(o);
      for (std::size_t i = 0; i < kWidth; ++i) a += w[o * kWidth + i] * x[i];
      y[o] = std::tanh(a);
      out[o] = y[o];
    }
  }
  void backward(int l, const float* gout_any, float* gin_any) override {
    const float* gout = testing::untag(gout_any);
    float* gin = testing::untag(gin_any);
    Buffer& s = saved_[static_cast<std::size_t>(l)];
    ASSERT_FALSE(s.empty()) << "layer " << l << " backward without its activations";
    const float* x = s.as<float>();
    const float* y = x + kWidth;
    const float* w = &w_[static_cast<std::size_t>(l) * kWidth * kWidth];
    float* dw = &dw_[static_cast<std::size_t>(l) * kWidth * kWidth];
    std::fill(gin, gin + kWidth, 0.0f);
    for (std::size_t o = 0; o < kWidth; ++o) {
      const float da = gout[o] * (1.0f - y[o] * y[o]);
      for (std::size_t i = 0; i < kWidth; ++i) {
        dw[o * kWidth + i] += da * x[i];
        gin[i] += da * w[o * kWidth + i];
      }
    }
  }
  void drop(int l) override { saved_[static_cast<std::size_t>(l)].reset(); }

  std::vector<float> dw_;
  int forwards = 0;

 private:
  MemoryTracker& t_;
  std::vector<float> w_;
  std::vector<Buffer> saved_;
};

struct Outcome {
  std::vector<float> dw, dx, out;
  std::size_t peak_activation_bytes = 0;
  int forwards = 0;
};

// `device`: the layers' activations live in its memory (x, y, g, dx copied in and out).
Outcome run(int n, const CheckpointSpec& spec, DeviceOps* device = nullptr) {
  MemoryTracker t;
  TanhLayers layers(n, t);
  Checkpointer ck(n, kWidth, spec, t, device);
  std::vector<float> x(kWidth), y(kWidth), g(kWidth), dx(kWidth);
  std::mt19937 rng(9);
  std::normal_distribution<float> nd;
  for (float& v : x) v = nd(rng);
  for (float& v : g) v = nd(rng);
  std::vector<Buffer> on_device;
  float *px = x.data(), *py = y.data(), *pg = g.data(), *pdx = dx.data();
  if (device != nullptr) {
    for (float** p : {&px, &py, &pg, &pdx}) {
      on_device.push_back(device->alloc(t, MemCategory::kOther, kWidth * sizeof(float)));
      device->copy(on_device.back().data(), *p, kWidth * sizeof(float));
      *p = on_device.back().as<float>();
    }
  }
  t.reset_peaks();
  for (int rep = 0; rep < 2; ++rep) {  // twice: buffers are reused, gradients accumulate
    ck.forward(layers, px, py);
    ck.backward(layers, pg, pdx);
  }
  if (device != nullptr) {
    device->copy(y.data(), py, kWidth * sizeof(float));
    device->copy(dx.data(), pdx, kWidth * sizeof(float));
    device->synchronize();
  }
  Outcome o{layers.dw_, dx, y,
            t.peak(MemCategory::kActivations, MemTier::kHost) +
                t.peak(MemCategory::kActivations, MemTier::kPinned) +
                t.peak(MemCategory::kActivations, MemTier::kDevice),
            layers.forwards};
  EXPECT_EQ(t.current(MemCategory::kActivations, MemTier::kPinned), 0u) << "kept inputs leaked";
  return o;
}

TEST(Checkpointing, GradientsAreBitwiseThoseOfThePlainRunForEveryPolicy) {
  for (int n : {1, 2, 7, 16, 25}) {
    const Outcome plain = run(n, CheckpointSpec{});
    for (const std::string p : {"every:1", "every:2", "every:3", "sqrt", "list:0,1", "list:3"}) {
      CheckpointSpec spec = CheckpointSpec::parse(p);
      if (spec.policy == CheckpointPolicy::kExplicit && spec.boundaries.back() >= n) continue;
      for (bool cpu : {false, true}) {
        spec.cpu_checkpointing = cpu;
        const Outcome c = run(n, spec);
        EXPECT_EQ(std::memcmp(c.dw.data(), plain.dw.data(), plain.dw.size() * 4), 0)
            << p << " n=" << n;
        EXPECT_EQ(std::memcmp(c.dx.data(), plain.dx.data(), plain.dx.size() * 4), 0) << p;
        EXPECT_EQ(std::memcmp(c.out.data(), plain.out.data(), plain.out.size() * 4), 0) << p;
        EXPECT_EQ(c.forwards, 2 * 2 * n) << p << ": every layer recomputed exactly once";
      }
    }
  }
}

// On a device the host cannot address (a GPU's; here the discrete CPU device, whose memory a
// host access would crash on), kept inputs stay on the device or, with cpu_checkpointing, go to
// pinned memory and back on the copy lane: gradients bitwise those of the plain host run.
TEST(Checkpointing, OnADiscreteDeviceGradientsAreBitwiseThoseOfThePlainRun) {
  for (int n : {1, 7, 16}) {
    const Outcome plain = run(n, CheckpointSpec{});
    for (const std::string p : {"none", "every:2", "sqrt", "list:3"}) {
      CheckpointSpec spec = CheckpointSpec::parse(p);
      if (spec.policy == CheckpointPolicy::kExplicit && spec.boundaries.back() >= n) continue;
      for (bool cpu : {false, true}) {
        spec.cpu_checkpointing = cpu;
        testing::DiscreteCpuDevice device;
        const Outcome c = run(n, spec, &device);
        EXPECT_EQ(std::memcmp(c.dw.data(), plain.dw.data(), plain.dw.size() * 4), 0)
            << p << " n=" << n << (cpu ? " cpu_checkpointing" : "");
        EXPECT_EQ(std::memcmp(c.dx.data(), plain.dx.data(), plain.dx.size() * 4), 0) << p;
        EXPECT_EQ(std::memcmp(c.out.data(), plain.out.data(), plain.out.size() * 4), 0) << p;
        if (cpu && spec.policy != CheckpointPolicy::kNone) {
          EXPECT_GT(device.copies, 0) << p << ": the kept inputs never moved";
        }
      }
    }
  }
}

TEST(Checkpointing, SqrtPolicyActivationBytesStayWithinThePredictedBound) {
  const std::size_t act = kWidth * sizeof(float);
  const std::size_t per_layer = 2 * act;  // what TanhLayers keeps per layer
  for (int n : {4, 9, 16, 30, 64}) {
    const Outcome plain = run(n, CheckpointSpec{});
    const Outcome sq = run(n, CheckpointSpec::parse("sqrt"));
    const int segs = static_cast<int>(std::ceil(std::sqrt(n)));
    const int longest = (n + segs - 1) / segs;
    // Kept segment inputs + one segment's layer activations + the two activation and the two
    // gradient buffers between layers.
    const std::size_t bound = static_cast<std::size_t>(segs) * act +
                              static_cast<std::size_t>(longest) * per_layer + 4 * act;
    EXPECT_LE(sq.peak_activation_bytes, bound) << "n=" << n;
    // Plain: every layer's activations at once.
    EXPECT_EQ(plain.peak_activation_bytes, static_cast<std::size_t>(n) * per_layer + 4 * act);
    if (n >= 16) {
      EXPECT_LT(sq.peak_activation_bytes * 2, plain.peak_activation_bytes) << "n=" << n;
    }
    std::printf("n=%2d  plain %6zu B  sqrt %6zu B  (bound %zu B)\n", n, plain.peak_activation_bytes,
                sq.peak_activation_bytes, bound);
  }
}

TEST(Checkpointing, PoliciesParseAndBadOnesAreErrors) {
  EXPECT_EQ(segment_starts(10, CheckpointSpec::parse("every:3")), (std::vector<int>{0, 3, 6, 9}));
  EXPECT_EQ(segment_starts(9, CheckpointSpec::parse("sqrt")), (std::vector<int>{0, 3, 6}));
  EXPECT_EQ(segment_starts(8, CheckpointSpec::parse("list:2,5")), (std::vector<int>{0, 2, 5}));
  ActivationCheckpointingConfig ds;
  ds.number_checkpoints = 4;
  EXPECT_EQ(segment_starts(8, CheckpointSpec::from_config(ds)), (std::vector<int>{0, 2, 4, 6}));
  EXPECT_THROW(CheckpointSpec::parse("every:0"), Error);
  EXPECT_THROW(CheckpointSpec::parse("cubic"), Error);
  EXPECT_THROW(CheckpointSpec::parse("list:a"), Error);
  EXPECT_THROW(segment_starts(4, CheckpointSpec::parse("list:5")), Error);
  EXPECT_THROW(segment_starts(4, CheckpointSpec::parse("list:3,1")), Error);
  EXPECT_THROW(segment_starts(0, CheckpointSpec{}), Error);
}

}  // namespace
}  // namespace zero
