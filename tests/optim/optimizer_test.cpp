// CpuOptimizer against a float64 reference written from the published update rules (not from
// optim_math.hpp): every rule x gradient dtype x copy dtype x ISA, 10 steps of random data,
// odd sizes, misaligned starts, canaries around every array, poisoned copies. Every SIMD path
// must match the scalar path bit for bit (the stated bound: 0 ulp). grad_stats:
// grad_stats_test.cpp; the hyper-parameters and argument errors: optimizer_params_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "optim/isas.hpp"
#include "zero/config/config.hpp"
#include "zero/core/cpu_features.hpp"
#include "zero/core/dtype.hpp"
#include "zero/core/error.hpp"
#include "zero/optim/optimizer.hpp"

namespace zero {
namespace {

using testing::available_isas;

constexpr int kSteps = 10;
constexpr std::size_t kGuard = 16;           // canary elements before and after every array
constexpr std::uint16_t kPoison16 = 0xffff;  // NaN in bf16 and f16
constexpr float kCanaryF = -12345.0f;
constexpr std::uint16_t kCanary16 = 0x5a5a;

// [kGuard canaries][misalign][n elements][kGuard canaries]
template <typename T>
struct Guarded {
  std::vector<T> storage;
  std::size_t offset = 0;
  std::size_t n = 0;
  T canary{};

  Guarded() = default;
  // misalign: elements past the guard. align32: instead, start the elements on a 32-byte
  // boundary (the streaming-store path needs it).
  Guarded(std::size_t count, std::size_t misalign, T canary_value, bool align32 = false)
      : storage(count + 2 * kGuard + misalign + 32, canary_value),
        offset(kGuard + misalign),
        n(count),
        canary(canary_value) {
    if (align32) {
      const auto addr = reinterpret_cast<std::uintptr_t>(storage.data() + kGuard);
      offset = kGuard + ((32 - addr % 32) % 32) / sizeof(T);
    }
  }
  T* data() { return storage.data() + offset; }
  const T* data() const { return storage.data() + offset; }
  bool canaries_intact() const {
    for (std::size_t i = 0; i < storage.size(); ++i) {
      if (i >= offset && i < offset + n) continue;
      if (std::memcmp(&storage[i], &canary, sizeof(T)) != 0) return false;
    }
    return true;
  }
  bool same_elements(const Guarded& o) const {
    return n == o.n && (n == 0 || std::memcmp(data(), o.data(), n * sizeof(T)) == 0);
  }
};

struct Variant {
  std::string name;
  OptimizerParams params;
};

std::vector<Variant> variants() {
  std::vector<Variant> v;
  OptimizerParams p;
  p.type = OptimizerType::kAdamW;
  p.lr = 1e-3;
  p.weight_decay = 0.01;
  v.push_back({"AdamW", p});
  p.bias_correction = false;
  v.push_back({"AdamW_nobias", p});
  p.bias_correction = true;
  p.moment_dtype = MomentDType::kBF16;
  v.push_back({"AdamW_bf16moments", p});

  p = {};
  p.type = OptimizerType::kAdam;
  p.adam_w_mode = false;  // L2
  p.lr = 2e-3;
  p.beta1 = 0.8;  // optimizer.params.betas [0.8, 0.99] (the config's sample value)
  p.beta2 = 0.99;
  p.eps = 1e-6;
  p.weight_decay = 0.05;
  v.push_back({"Adam_L2", p});

  p = {};
  p.type = OptimizerType::kSgd;
  p.lr = 0.05;
  p.weight_decay = 0.01;
  v.push_back({"SGD", p});
  p.momentum = 0.9;
  p.dampening = 0.1;
  v.push_back({"SGD_momentum_dampening", p});
  p.dampening = 0.0;
  p.nesterov = true;
  v.push_back({"SGD_nesterov", p});

  p = {};
  p.type = OptimizerType::kLion;
  p.lr = 1e-4;
  p.beta1 = 0.9;
  p.beta2 = 0.99;
  p.weight_decay = 0.1;
  v.push_back({"Lion", p});

  p = {};
  p.type = OptimizerType::kAdagrad;
  p.lr = 1e-2;
  p.eps = 1e-10;
  p.weight_decay = 0.01;
  v.push_back({"Adagrad", p});
  return v;
}

double decode(std::uint16_t h, DType t) {
  return t == DType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h);
}
double round_bf16(double x) { return bf16_to_f32(f32_to_bf16(static_cast<float>(x))); }

// One shard's data: the initial values, identical for every path.
struct Problem {
  std::size_t n = 0;
  std::vector<float> p0, s00, s10;              // initial master and state (as f32)
  std::vector<std::vector<float>> g32;          // per step
  std::vector<std::vector<std::uint16_t>> g16;  // per step (bf16 or f16 bits)
  float grad_scale = 0.3f;
};

// Gradients are drawn in +-4 x 0.3 / grad_scale: the scaled gradient the step sees is in +-1.2
// for every grad_scale (the bounds of expect_matches_reference are written for that).
Problem make_problem(std::size_t n, DType gdt, const OptimizerParams& hp, std::uint32_t seed,
                     float grad_scale = 0.3f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_real_distribution<float> pos(0.01f, 1.0f);
  auto nonzero = [&](float scale) {
    float x = 0.0f;
    while (x == 0.0f) x = u(rng) * scale;
    return x;
  };
  Problem pr;
  pr.n = n;
  pr.grad_scale = grad_scale;
  pr.p0.resize(n);
  pr.s00.resize(n);
  pr.s10.resize(n);
  const bool bf16_state = hp.state_dtype() == MomentDType::kBF16;
  for (std::size_t i = 0; i < n; ++i) {
    pr.p0[i] = nonzero(1.0f);
    // Adam m; SGD buffer; Lion m: signed. Adam v, Adagrad sum: positive.
    float s0 = hp.type == OptimizerType::kAdagrad ? pos(rng) : nonzero(0.1f);
    float s1 = pos(rng) * 0.01f;
    if (bf16_state) {
      s0 = bf16_to_f32(f32_to_bf16(s0));
      s1 = bf16_to_f32(f32_to_bf16(s1));
    }
    pr.s00[i] = s0;
    pr.s10[i] = s1;
  }
  pr.g32.assign(kSteps, std::vector<float>(n));
  pr.g16.assign(kSteps, std::vector<std::uint16_t>(n));
  for (int s = 0; s < kSteps; ++s) {
    for (std::size_t i = 0; i < n; ++i) {
      const float g = nonzero(4.0f * (0.3f / grad_scale));
      pr.g32[s][i] = g;
      pr.g16[s][i] = gdt == DType::kF16 ? f32_to_f16(g) : f32_to_bf16(g);
      if (pr.g16[s][i] == 0 || pr.g16[s][i] == 0x8000) pr.g16[s][i] = 0x3c00;  // never zero
    }
  }
  return pr;
}

double grad_value(const Problem& pr, DType gdt, int step, std::size_t i) {
  return gdt == DType::kF32 ? pr.g32[step][i] : decode(pr.g16[step][i], gdt);
}

// Float64 reference of kSteps updates. Elements whose Lion sign is within rounding of 0 are
// marked ambiguous (f32 and f64 may legitimately disagree on them) and not compared.
struct Reference {
  std::vector<double> p, s0, s1;
  std::vector<char> ambiguous;
};

Reference run_reference(const Problem& pr, DType gdt, const OptimizerParams& hp) {
  Reference r;
  const std::size_t n = pr.n;
  r.p.assign(pr.p0.begin(), pr.p0.end());
  r.s0.assign(pr.s00.begin(), pr.s00.end());
  r.s1.assign(pr.s10.begin(), pr.s10.end());
  r.ambiguous.assign(n, 0);
  const bool bf16_state = hp.state_dtype() == MomentDType::kBF16;
  const double gs = pr.grad_scale;
  const double lr = hp.lr, wd = hp.weight_decay, b1 = hp.beta1, b2 = hp.beta2, eps = hp.eps;
  for (int s = 0; s < kSteps; ++s) {
    const double t = s + 1;
    for (std::size_t i = 0; i < n; ++i) {
      double g = grad_value(pr, gdt, s, i) * gs;
      double& p = r.p[i];
      switch (hp.type) {
        case OptimizerType::kAdam:
        case OptimizerType::kAdamW: {
          // Kingma & Ba, Algorithm 1; PyTorch eps placement; Loshchilov & Hutter decay.
          const bool decoupled = hp.type == OptimizerType::kAdamW || hp.adam_w_mode;
          if (!decoupled) g += wd * p;
          double m = b1 * r.s0[i] + (1 - b1) * g;
          double v = b2 * r.s1[i] + (1 - b2) * g * g;
          if (bf16_state) {
            m = round_bf16(m);
            v = round_bf16(v);
          }
          r.s0[i] = m;
          r.s1[i] = v;
          const double bc1 = hp.bias_correction ? 1 - std::pow(b1, t) : 1.0;
          const double bc2 = hp.bias_correction ? 1 - std::pow(b2, t) : 1.0;
          if (decoupled) p -= lr * wd * p;
          p -= (lr / bc1) * m / (std::sqrt(v) / std::sqrt(bc2) + eps);
          break;
        }
        case OptimizerType::kSgd: {
          g += wd * p;
          if (hp.momentum > 0) {
            double& buf = r.s0[i];
            buf = s == 0 ? g : hp.momentum * buf + (1 - hp.dampening) * g;
            g = hp.nesterov ? g + hp.momentum * buf : buf;
          }
          p -= lr * g;
          break;
        }
        case OptimizerType::kLion: {
          const double c = b1 * r.s0[i] + (1 - b1) * g;
          const double mag = std::abs(b1 * r.s0[i]) + std::abs((1 - b1) * g);
          if (std::abs(c) <= 1e-5 * mag) r.ambiguous[i] = 1;
          p -= lr * wd * p;
          p -= lr * (c > 0 ? 1.0 : (c < 0 ? -1.0 : 0.0));
          r.s0[i] = b2 * r.s0[i] + (1 - b2) * g;
          break;
        }
        case OptimizerType::kAdagrad: {
          g += wd * p;
          r.s0[i] += g * g;
          p -= lr * g / (std::sqrt(r.s0[i]) + eps);
          break;
        }
      }
    }
  }
  return r;
}

// ---- running our optimizer on guarded, misaligned copies of a problem
struct ShardRun {
  Guarded<float> master;
  Guarded<float> g32;
  Guarded<std::uint16_t> g16;
  Guarded<float> s32[2];
  Guarded<std::uint16_t> s16[2];
  Guarded<std::uint16_t> copy;
  std::string failure;  // empty when every check during the run passed
};

struct RunSpec {
  Isa isa = Isa::kScalar;
  std::optional<DType> copy;  // none, bf16 or f16
  int threads = 0;
  std::size_t block = 0;
  bool align_copy = false;  // 32-byte aligned copy (else misaligned by 7 elements)
};

ShardRun run_ours(const Problem& pr, DType gdt, const OptimizerParams& hp, const RunSpec& spec) {
  const std::size_t n = pr.n;
  ShardRun r;
  // Different misalignments (in elements) so no two arrays share an alignment pattern.
  r.master = Guarded<float>(n, 1, kCanaryF);
  std::copy(pr.p0.begin(), pr.p0.end(), r.master.data());
  r.g32 = Guarded<float>(n, 3, kCanaryF);
  r.g16 = Guarded<std::uint16_t>(n, 3, kCanary16);
  const bool bf16_state = hp.state_dtype() == MomentDType::kBF16;
  const std::size_t smis[2] = {5, 2};
  ShardRef shard;
  shard.count = n;
  shard.master = r.master.data();
  shard.grad_dtype = gdt;
  for (int k = 0; k < 2; ++k) {
    const std::vector<float>& init = k == 0 ? pr.s00 : pr.s10;
    if (bf16_state) {
      r.s16[k] = Guarded<std::uint16_t>(n, smis[k], kCanary16);
      for (std::size_t i = 0; i < n; ++i) r.s16[k].data()[i] = f32_to_bf16(init[i]);
      shard.state[k] = r.s16[k].data();
    } else {
      r.s32[k] = Guarded<float>(n, smis[k], kCanaryF);
      std::copy(init.begin(), init.end(), r.s32[k].data());
      shard.state[k] = r.s32[k].data();
    }
  }
  if (spec.copy) {
    r.copy = Guarded<std::uint16_t>(n, 7, kCanary16, spec.align_copy);
    shard.param_copy = r.copy.data();
    shard.param_copy_dtype = *spec.copy;
  }
  CpuExecOptions opts;
  opts.isa = spec.isa;
  opts.threads = spec.threads;
  opts.block_elems = spec.block;
  CpuOptimizer opt(opts);
  for (int s = 0; s < kSteps; ++s) {
    if (gdt == DType::kF32) {
      std::copy(pr.g32[s].begin(), pr.g32[s].end(), r.g32.data());
      shard.grad = r.g32.data();
    } else {
      std::copy(pr.g16[s].begin(), pr.g16[s].end(), r.g16.data());
      shard.grad = r.g16.data();
    }
    if (spec.copy) std::fill(r.copy.data(), r.copy.data() + n, kPoison16);
    opt.step(hp, shard, s + 1, pr.grad_scale);
    if (spec.copy) {
      // Written, and exactly the rounded master (bulk converters: tested bitwise against the
      // scalar conversions in tests/core).
      std::vector<std::uint16_t> want(n);
      convert(r.master.data(), DType::kF32, want.data(), *spec.copy, n);
      for (std::size_t i = 0; i < n; ++i) {
        if (r.copy.data()[i] != want[i]) {
          r.failure = "step " + std::to_string(s + 1) + ": copy[" + std::to_string(i) +
                      "] = " + std::to_string(r.copy.data()[i]) + ", want " +
                      std::to_string(want[i]) + " (poison 0xffff means not written)";
          return r;
        }
      }
    }
  }
  const bool intact = r.master.canaries_intact() && r.g32.canaries_intact() &&
                      r.g16.canaries_intact() && r.s32[0].canaries_intact() &&
                      r.s32[1].canaries_intact() && r.s16[0].canaries_intact() &&
                      r.s16[1].canaries_intact() && r.copy.canaries_intact();
  if (!intact) r.failure = "a write outside the shard (canary overwritten)";
  return r;
}

double state_value(const ShardRun& r, bool bf16_state, int k, std::size_t i) {
  return bf16_state ? bf16_to_f32(r.s16[k].data()[i]) : r.s32[k].data()[i];
}

// Compares a run with the float64 reference: |ours - ref| <= atol + rtol |ref|, per array.
// Bounds: p accumulates <= 1 rounding of ~|p| per step (rtol 2e-6 over 10 steps) plus the
// update's relative error (~1e-6 of lr per step); bf16 moments may round to the neighbouring
// bf16 value (2^-8 relative) where f32 and f64 straddle a rounding boundary, which moves p by
// up to ~1% of lr per step.
void expect_matches_reference(const ShardRun& r, const Reference& ref, const OptimizerParams& hp,
                              const std::string& what) {
  const std::size_t n = ref.p.size();
  const bool bf16_state = hp.state_dtype() == MomentDType::kBF16;
  const int ns = hp.num_states();
  const double lr_total = hp.lr * kSteps / (hp.bias_correction ? 1 - hp.beta1 : 1.0);
  const double p_atol = (bf16_state ? 2e-2 : 2e-5) * lr_total + 1e-7;
  const double p_rtol = 3e-6;
  const double s_rtol = bf16_state ? 2e-2 : 2e-5;
  const double s_atol = bf16_state ? 2e-3 : 1e-5;  // states that pass near 0 (m, SGD buffer)
  std::size_t ambiguous = 0, bad = 0;
  std::string first_bad;
  for (std::size_t i = 0; i < n; ++i) {
    if (ref.ambiguous[i]) {
      ++ambiguous;
      continue;
    }
    auto check = [&](const char* name, double ours, double want, double atol, double rtol) {
      if (!(std::abs(ours - want) <= atol + rtol * std::abs(want))) {
        if (bad++ == 0) {
          first_bad = std::string(name) + "[" + std::to_string(i) + "] = " + std::to_string(ours) +
                      ", reference " + std::to_string(want);
        }
      }
    };
    check("p", r.master.data()[i], ref.p[i], p_atol, p_rtol);
    for (int k = 0; k < ns; ++k) {
      const double want = k == 0 ? ref.s0[i] : ref.s1[i];
      check(k == 0 ? "state0" : "state1", state_value(r, bf16_state, k, i), want, s_atol, s_rtol);
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " elements off the reference; first: " << first_bad;
  EXPECT_LE(ambiguous, n / 1000 + 1) << what << ": too many ambiguous Lion signs";
}

void expect_bitwise_equal(const ShardRun& a, const ShardRun& b, const std::string& what) {
  EXPECT_TRUE(a.master.same_elements(b.master)) << what << ": master differs";
  for (int k = 0; k < 2; ++k) {
    EXPECT_TRUE(a.s32[k].same_elements(b.s32[k])) << what << ": f32 state " << k << " differs";
    EXPECT_TRUE(a.s16[k].same_elements(b.s16[k])) << what << ": bf16 state " << k << " differs";
  }
  EXPECT_TRUE(a.copy.same_elements(b.copy)) << what << ": 16-bit copy differs";
}

std::string copy_name(std::optional<DType> c) {
  return c ? std::string(to_string(*c)) : std::string("none");
}

// ---- the matrix: rule x grad dtype x size; inside, copy dtype x ISA
struct Case {
  Variant variant;
  DType grad;
};

class OptimizerMatrix : public ::testing::TestWithParam<Case> {};

TEST_P(OptimizerMatrix, MatchesFloat64ReferenceAndScalarBitwise) {
  const Case& c = GetParam();
  const OptimizerParams& hp = c.variant.params;
  std::uint32_t seed = 1;
  // grad_scale 1 (no loss scaling, no clipping) takes the SIMD loops' version without the
  // multiply: sizes with and without full vectors, and a large shard, for each.
  for (auto [n, grad_scale] :
       {std::pair{std::size_t{1}, 0.3f}, std::pair{std::size_t{7}, 1.0f},
        std::pair{std::size_t{15}, 0.3f}, std::pair{std::size_t{16}, 1.0f},
        std::pair{std::size_t{17}, 0.3f}, std::pair{std::size_t{33}, 1.0f},
        std::pair{std::size_t{1000003}, 0.3f}, std::pair{std::size_t{100003}, 1.0f}}) {
    const Problem pr = make_problem(n, c.grad, hp, seed++, grad_scale);
    const Reference ref = run_reference(pr, c.grad, hp);
    for (std::optional<DType> copy : {std::optional<DType>{}, std::optional<DType>{DType::kBF16},
                                      std::optional<DType>{DType::kF16}}) {
      ShardRun scalar;
      for (Isa isa : available_isas()) {
        const std::string what = c.variant.name + " grad " + std::string(to_string(c.grad)) +
                                 " copy " + copy_name(copy) + " isa " +
                                 std::string(to_string(isa)) + " n " + std::to_string(n) +
                                 " grad_scale " + std::to_string(grad_scale);
        RunSpec spec;
        spec.isa = isa;
        spec.copy = copy;
        ShardRun r = run_ours(pr, c.grad, hp, spec);
        ASSERT_TRUE(r.failure.empty()) << what << ": " << r.failure;
        if (isa == Isa::kScalar) {
          expect_matches_reference(r, ref, hp, what);
          scalar = std::move(r);
        } else {
          expect_bitwise_equal(r, scalar, what);
        }
      }
    }
  }
}

std::vector<Case> all_cases() {
  std::vector<Case> out;
  for (const Variant& v : variants()) {
    for (DType g : {DType::kF32, DType::kBF16, DType::kF16}) out.push_back({v, g});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(All, OptimizerMatrix, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.variant.name + "_" +
                                  std::string(to_string(info.param.grad));
                         });

// ---- the split into blocks and threads changes nothing
TEST(CpuOptimizer, ThreadsAndBlockSizesGiveIdenticalBits) {
  OptimizerParams hp;  // AdamW
  hp.weight_decay = 0.1;
  const Problem pr = make_problem(300001, DType::kBF16, hp, 99);
  RunSpec base;
  base.isa = best_isa();
  base.copy = DType::kBF16;
  base.threads = 1;
  const ShardRun one = run_ours(pr, DType::kBF16, hp, base);
  ASSERT_TRUE(one.failure.empty()) << one.failure;
  for (auto [threads, block] : {std::pair{2, std::size_t{0}}, std::pair{2, std::size_t{64}},
                                std::pair{0, std::size_t{4096}}, std::pair{1, std::size_t{192}}}) {
    RunSpec spec = base;
    spec.threads = threads;
    spec.block = block;
    const ShardRun r = run_ours(pr, DType::kBF16, hp, spec);
    ASSERT_TRUE(r.failure.empty()) << r.failure;
    expect_bitwise_equal(r, one,
                         "threads " + std::to_string(threads) + " block " + std::to_string(block));
  }
}

// ---- shards past the streaming threshold write the copy with non-temporal stores: same bits
TEST(CpuOptimizer, LargeShardCopyIsTheSameBitsOnEveryPath) {
  OptimizerParams hp;  // AdamW
  const std::size_t n = (std::size_t{1} << 20) + 37;
  const Problem pr = make_problem(n, DType::kF32, hp, 5);
  for (DType copy : {DType::kBF16, DType::kF16}) {
    for (bool aligned : {true, false}) {
      ShardRun scalar;
      for (Isa isa : available_isas()) {
        RunSpec spec;
        spec.isa = isa;
        spec.copy = copy;
        spec.align_copy = aligned;
        ShardRun r = run_ours(pr, DType::kF32, hp, spec);
        ASSERT_TRUE(r.failure.empty()) << to_string(isa) << ": " << r.failure;
        if (isa == Isa::kScalar) {
          scalar = std::move(r);
        } else {
          expect_bitwise_equal(
              r, scalar, std::string(to_string(isa)) + " copy " + std::string(to_string(copy)));
        }
      }
    }
  }
}

// ---- grad_scale 1 skips the multiply (the SIMD loops' unscaled version, the scalar branch) and
// must give the bits of the multiply: gradients 2g at grad_scale 0.5 reach the same scaled
// gradient g through it (exact: doubling and halving are), on every rule, gradient dtype, ISA.
Problem doubled_grads(Problem pr, DType gdt) {
  for (std::vector<float>& step : pr.g32) {
    for (float& g : step) g *= 2.0f;
  }
  for (std::vector<std::uint16_t>& step : pr.g16) {
    for (std::uint16_t& h : step) {
      const float g2 = 2.0f * static_cast<float>(decode(h, gdt));
      h = gdt == DType::kF16 ? f32_to_f16(g2) : f32_to_bf16(g2);
    }
  }
  pr.grad_scale *= 0.5f;
  return pr;
}

TEST(CpuOptimizer, GradScaleOneGivesTheBitsOfTheMultiply) {
  for (const Variant& v : variants()) {
    for (DType gdt : {DType::kF32, DType::kBF16, DType::kF16}) {
      const Problem one = make_problem(1037, gdt, v.params, 7, 1.0f);
      const Problem halved = doubled_grads(one, gdt);
      for (Isa isa : available_isas()) {
        const std::string what =
            v.name + " grad " + std::string(to_string(gdt)) + " isa " + std::string(to_string(isa));
        RunSpec spec;
        spec.isa = isa;
        spec.copy = DType::kBF16;
        const ShardRun a = run_ours(one, gdt, v.params, spec);
        const ShardRun b = run_ours(halved, gdt, v.params, spec);
        ASSERT_TRUE(a.failure.empty()) << what << ": " << a.failure;
        ASSERT_TRUE(b.failure.empty()) << what << ": " << b.failure;
        expect_bitwise_equal(a, b, what + ", grad_scale 1 against 2g x 0.5");
      }
    }
  }
}

// ---- special values: the update propagates them; it does not look at them
TEST(CpuOptimizer, NonFiniteGradientsPropagateOnEveryPath) {
  OptimizerParams hp;
  const std::size_t n = 40;
  for (Isa isa : available_isas()) {
    std::vector<float> p(n, 0.5f), m(n, 0.0f), v(n, 0.0f), g(n, 0.25f);
    g[3] = std::numeric_limits<float>::quiet_NaN();
    g[37] = std::numeric_limits<float>::infinity();
    ShardRef shard;
    shard.count = n;
    shard.master = p.data();
    shard.grad = g.data();
    shard.state[0] = m.data();
    shard.state[1] = v.data();
    CpuExecOptions o;
    o.isa = isa;
    CpuOptimizer(o).step(hp, shard, 1);
    EXPECT_TRUE(std::isnan(p[3])) << to_string(isa);
    EXPECT_TRUE(std::isnan(p[37])) << to_string(isa);
    EXPECT_TRUE(std::isfinite(p[0]) && p[0] < 0.5f) << to_string(isa);
  }
}

// ---- init_state
TEST(CpuOptimizer, InitStateZeroesEveryStateArray) {
  OptimizerParams hp;
  hp.moment_dtype = MomentDType::kBF16;
  const std::size_t n = 200003;
  std::vector<std::uint16_t> m(n, 0x1234), v(n, 0x4321);
  ShardRef shard;
  shard.count = n;
  shard.state[0] = m.data();
  shard.state[1] = v.data();
  CpuExecOptions o;
  o.threads = 2;
  o.block_elems = 1024;
  CpuOptimizer(o).init_state(hp, shard);
  EXPECT_TRUE(std::all_of(m.begin(), m.end(), [](std::uint16_t x) { return x == 0; }));
  EXPECT_TRUE(std::all_of(v.begin(), v.end(), [](std::uint16_t x) { return x == 0; }));
}

}  // namespace
}  // namespace zero
