// int8 Adam moments (moment_dtype = int8, zero/optim/detail/moment_quant.hpp); the code maps
// themselves: moment_codes_test.cpp.
// - one step's quantize / dequantize error in float64 on adversarial blocks (zeros, one outlier
//   per block, constant blocks, subnormals, mixed magnitudes), every ISA: each stored moment
//   within A (g / 2) (1 + 2^-20) + A 2^-20 + 2^-146 of the float64 moment (A the block's absmax,
//   g the code gap around it), constant and zero blocks exact;
// - random shards over 8 steps, every grad dtype x copy dtype x ISA, odd sizes, canaries,
//   poisoned copies, parameter-group runs that cut blocks: every SIMD path bitwise the scalar
//   path, and each step (from the state before it) against a float64 reference of the same
//   quantized algorithm: p within 2e-6 |p| + 2e-5 lr_t, absmax within 1e-6 relative, every code
//   the float64 nearest code or (where the float64 value lies within 2^-13 of a gap, plus what
//   f32 arithmetic may be off by, of the midpoint between two codes) its neighbour (the f32
//   error of every check: 2^-21 of the magnitudes of the terms summed, plus underflow);
// - threads, task sizes and how runs are split change no bit; argument errors.
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
#include "zero/core/cpu_features.hpp"
#include "zero/core/dtype.hpp"
#include "zero/core/error.hpp"
#include "zero/optim/detail/moment_quant.hpp"
#include "zero/optim/optimizer.hpp"

namespace zero {
namespace {

using detail::optim::kMCodes;
using detail::optim::kMomentBlock;
using detail::optim::kMomentCodes;
using detail::optim::kMomentRecord;
using detail::optim::kVCodes;

constexpr std::size_t B = kMomentBlock;

using testing::available_isas;

// ---- shards with int8 moments

// Bytes of records with guard bytes around them.
struct Records {
  static constexpr std::size_t kGuard = 64;
  std::vector<std::uint8_t> storage;
  std::size_t n = 0;
  explicit Records(std::size_t count = 0)
      : storage(detail::optim::moment_bytes(count) + 2 * kGuard, 0xa5), n(count) {
    std::fill(data(), data() + detail::optim::moment_bytes(n), 0);
  }
  std::uint8_t* data() { return storage.data() + kGuard; }
  const std::uint8_t* data() const { return storage.data() + kGuard; }
  std::size_t bytes() const { return detail::optim::moment_bytes(n); }
  bool guards_intact() const {
    for (std::size_t i = 0; i < kGuard; ++i) {
      if (storage[i] != 0xa5 || storage[storage.size() - 1 - i] != 0xa5) return false;
    }
    return true;
  }
  float absmax(std::size_t block) const {
    return detail::optim::load_absmax(data() + block * kMomentRecord);
  }
  std::uint8_t code(std::size_t i) const { return data()[(i / B) * kMomentRecord + 4 + i % B]; }
  double m_value(std::size_t i) const {
    const std::uint8_t c = code(i);
    const double mag = kMomentCodes.m[c & 0x7f];
    return (c & 0x80 ? -mag : mag) * static_cast<double>(absmax(i / B));
  }
  double v_value(std::size_t i) const {
    return kMomentCodes.v[code(i)] * static_cast<double>(absmax(i / B));
  }
  // Writes value x (a block's absmax a) as the nearest code, from double (for initial states).
  void set_block(std::size_t block, float a) {
    const std::uint32_t u = f32_bits(a);
    std::memcpy(data() + block * kMomentRecord, &u, 4);
  }
  void set_code(std::size_t i, std::uint8_t c) { data()[(i / B) * kMomentRecord + 4 + i % B] = c; }
  bool operator==(const Records& o) const {
    return n == o.n && std::memcmp(data(), o.data(), bytes()) == 0;
  }
};

struct Shard8 {
  std::size_t n = 0;
  std::vector<float> p;
  std::vector<float> g32;
  std::vector<std::uint16_t> g16;
  DType gdt = DType::kF32;
  Records m, v;
  std::vector<std::uint16_t> copy;  // with 8 canaries each side
  std::optional<DType> copy_dtype;

  ShardRef ref() {
    ShardRef s;
    s.count = n;
    s.master = p.data();
    s.grad = gdt == DType::kF32 ? static_cast<const void*>(g32.data()) : g16.data();
    s.grad_dtype = gdt;
    s.state[0] = m.data();
    s.state[1] = v.data();
    if (copy_dtype) {
      s.param_copy = copy.data() + 8;
      s.param_copy_dtype = *copy_dtype;
    }
    return s;
  }
  double grad(std::size_t i) const {
    if (gdt == DType::kF32) return g32[i];
    return gdt == DType::kBF16 ? bf16_to_f32(g16[i]) : f16_to_f32(g16[i]);
  }
  void set_grads(const std::vector<float>& g) {
    g32 = g;
    g16.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      g16[i] = gdt == DType::kF16 ? f32_to_f16(g[i]) : f32_to_bf16(g[i]);
    }
  }
};

Shard8 make_shard(std::size_t n, DType gdt, std::optional<DType> copy) {
  Shard8 s;
  s.n = n;
  s.gdt = gdt;
  s.p.resize(n);
  s.m = Records(n);
  s.v = Records(n);
  s.copy_dtype = copy;
  if (copy) s.copy.assign(n + 16, 0x5a5a);
  return s;
}

// The parameter group of each element and its hyper-parameters.
struct Groups {
  std::vector<OptimizerParams> params;
  std::vector<StepRun> runs;
  int group_of(std::size_t i) const {
    for (const StepRun& r : runs) {
      if (i >= r.at && i < r.at + r.count) return r.group;
    }
    return 0;
  }
};

Groups one_group(const OptimizerParams& hp, std::size_t n) { return {{hp}, {{0, n, 0}}}; }

// ---- the float64 reference of one step from the state before it

// err_m / err_v: what f32 arithmetic may be off by on the way to m and v (2^-21 of the terms'
// magnitudes, which the f32 sum may cancel, plus underflow); err_am / err_av their block maxima;
// err_p: the same carried into the update of p.
struct StepRef {
  std::vector<double> p, m, v, err_m, err_v, err_p;
  std::vector<double> am, av, err_am, err_av;  // per block
};

StepRef reference_step(const Shard8& s, const Groups& gr, std::int64_t t, double grad_scale) {
  StepRef r;
  const std::size_t n = s.n, nb = (n + B - 1) / B;
  r.p.resize(n);
  r.m.resize(n);
  r.v.resize(n);
  r.err_m.resize(n);
  r.err_v.resize(n);
  r.err_p.resize(n);
  r.am.assign(nb, 0.0);
  r.av.assign(nb, 0.0);
  r.err_am.assign(nb, 0.0);
  r.err_av.assign(nb, 0.0);
  const double ulp = std::ldexp(1.0, -21), tiny = std::ldexp(1.0, -147);
  for (std::size_t i = 0; i < n; ++i) {
    const OptimizerParams& hp = gr.params[static_cast<std::size_t>(gr.group_of(i))];
    // Kingma & Ba, Algorithm 1; PyTorch's eps placement; Loshchilov & Hutter's decay.
    const bool decoupled = hp.type == OptimizerType::kAdamW || hp.adam_w_mode;
    double g = s.grad(i) * grad_scale;
    double p = s.p[i];
    const double g_mag = std::abs(g) + (decoupled ? 0.0 : std::abs(hp.weight_decay * p));
    if (!decoupled) g += hp.weight_decay * p;
    const double m = hp.beta1 * s.m.m_value(i) + (1 - hp.beta1) * g;
    const double v = hp.beta2 * s.v.v_value(i) + (1 - hp.beta2) * g * g;
    r.err_m[i] = ulp * (std::abs(hp.beta1 * s.m.m_value(i)) + (1 - hp.beta1) * g_mag) + tiny;
    r.err_v[i] = ulp * (hp.beta2 * s.v.v_value(i) + (1 - hp.beta2) * g_mag * g_mag) + tiny;
    const double bc1 = hp.bias_correction ? 1 - std::pow(hp.beta1, static_cast<double>(t)) : 1.0;
    const double bc2 = hp.bias_correction ? 1 - std::pow(hp.beta2, static_cast<double>(t)) : 1.0;
    if (decoupled) p -= hp.lr * hp.weight_decay * p;
    const double denom = std::sqrt(v) / std::sqrt(bc2) + hp.eps;
    p -= (hp.lr / bc1) * m / denom;
    const double err_sqrt = std::sqrt(r.err_v[i]) / std::sqrt(bc2);  // sqrt(v + e) - sqrt(v)
    r.err_p[i] =
        2 * (hp.lr / bc1) * (r.err_m[i] / denom + std::abs(m) * err_sqrt / (denom * denom));
    r.p[i] = p;
    r.m[i] = m;
    r.v[i] = v;
    r.am[i / B] = std::max(r.am[i / B], std::abs(m));
    r.av[i / B] = std::max(r.av[i / B], std::abs(v));
    r.err_am[i / B] = std::max(r.err_am[i / B], r.err_m[i]);
    r.err_av[i / B] = std::max(r.err_av[i / B], r.err_v[i]);
  }
  return r;
}

// Half the gap between the two map values around y in [0, 1] (table of n magnitudes), and the
// distance of y to the threshold between them in units of that gap.
struct Gap {
  double half = 0;
  double to_threshold = 0;  // |y - midpoint| / gap
};
// The index j of the pair table[j] <= y < table[j + 1] (y in [0, 1)).
int bracket(const float* table, int n, double y) {
  const int j = static_cast<int>(std::upper_bound(table, table + n, y) - table) - 1;
  return std::clamp(j, 0, n - 2);
}
Gap gap_around(const float* table, int n, double y) {
  if (y >= table[n - 1]) return {0.0, 1.0};
  const int j = bracket(table, n, y);
  const double lo = table[j], hi = table[j + 1];
  return {(hi - lo) / 2, std::abs(y - (lo + hi) / 2) / (hi - lo)};
}

// The bound on a stored moment, x its float64 value, a the float64 absmax of its block.
double moment_bound(double x, double a, bool is_m) {
  if (a == 0) return 0;
  const Gap gp = is_m ? gap_around(kMomentCodes.m, kMCodes, std::abs(x) / a)
                      : gap_around(kMomentCodes.v, kVCodes, std::abs(x) / a);
  return a * (gp.half * (1 + std::ldexp(1.0, -20)) + std::ldexp(1.0, -20)) + std::ldexp(1.0, -146);
}

// One step of our optimizer compared with the reference; returns the first failure ("" if none).
std::string check_step(const Shard8& before, const Shard8& after, const Groups& gr, std::int64_t t,
                       double grad_scale, bool exact_codes) {
  const StepRef r = reference_step(before, gr, t, grad_scale);
  const std::size_t n = before.n;
  double lr_max = 0;
  for (const OptimizerParams& hp : gr.params) {
    const double bc1 = hp.bias_correction ? 1 - std::pow(hp.beta1, static_cast<double>(t)) : 1.0;
    lr_max = std::max(lr_max, hp.lr / bc1);
  }
  for (std::size_t b = 0; b * B < n; ++b) {
    for (int k = 0; k < 2; ++k) {
      const double ours = k == 0 ? after.m.absmax(b) : after.v.absmax(b);
      const double want = k == 0 ? r.am[b] : r.av[b];
      const double err = k == 0 ? r.err_am[b] : r.err_av[b];
      if (!(std::abs(ours - want) <= 1e-6 * want + err)) {
        return "block " + std::to_string(b) + (k == 0 ? " m" : " v") + " absmax " +
               std::to_string(ours) + ", reference " + std::to_string(want);
      }
    }
  }
  for (std::size_t i = 0; i < n; ++i) {
    const double p_tol = 2e-6 * std::abs(r.p[i]) + 2e-5 * lr_max + r.err_p[i] + 1e-30;
    if (!(std::abs(after.p[i] - r.p[i]) <= p_tol)) {
      return "p[" + std::to_string(i) + "] = " + std::to_string(after.p[i]) + ", reference " +
             std::to_string(r.p[i]);
    }
    for (int k = 0; k < 2; ++k) {
      const bool is_m = k == 0;
      const double x = is_m ? r.m[i] : r.v[i];
      const double a = is_m ? r.am[i / B] : r.av[i / B];
      const double got = is_m ? after.m.m_value(i) : after.v.v_value(i);
      const double err = is_m ? r.err_m[i] : r.err_v[i];
      const double err_a = is_m ? r.err_am[i / B] : r.err_av[i / B];
      if (!(std::abs(got - x) <= moment_bound(x, a, is_m) + 2 * err + err_a)) {
        return std::string(is_m ? "m[" : "v[") + std::to_string(i) + "] = " + std::to_string(got) +
               ", reference " + std::to_string(x) + " (absmax " + std::to_string(a) + ")";
      }
      if (exact_codes && a > 0) {
        // The float64 nearest code, unless the value lies within 2^-13 of a gap of a midpoint.
        const float* table = is_m ? kMomentCodes.m : kMomentCodes.v;
        const int nc = is_m ? kMCodes : kVCodes;
        const double y = std::abs(x) / a;
        const Gap gp = gap_around(table, nc, y);
        // How far f32's y may be from this one, in gaps.
        const double y_err = (err + y * err_a) / a / std::max(2 * gp.half, 1e-300);
        if (gp.to_threshold < 2 * y_err + std::ldexp(1.0, -13)) continue;
        int best = nc - 1;
        if (y < table[nc - 1]) {
          const int j = bracket(table, nc, y);
          best = y - table[j] <= table[j + 1] - y ? j : j + 1;
        }
        const std::uint8_t code = is_m ? after.m.code(i) : after.v.code(i);
        if ((is_m ? (code & 0x7f) : code) != best) {
          return std::string(is_m ? "m" : "v") + " code[" + std::to_string(i) +
                 "] = " + std::to_string(code) + ", nearest " + std::to_string(best);
        }
      }
    }
  }
  return "";
}

struct Run8 {
  Shard8 s;
  std::string failure;
};

// Runs `steps` steps (gradient of step k: grads[k]) with one ISA, checking each step against the
// reference and the copy against the master (poisoned before each step).
Run8 run_steps(Shard8 s, const Groups& gr, const std::vector<std::vector<float>>& grads,
               CpuExecOptions opts, double grad_scale, bool exact_codes = true) {
  CpuOptimizer opt(opts);
  Run8 out;
  for (std::size_t k = 0; k < grads.size(); ++k) {
    s.set_grads(grads[k]);
    if (s.copy_dtype) std::fill(s.copy.begin() + 8, s.copy.end() - 8, 0xffff);
    const Shard8 before = s;
    ShardRef ref = s.ref();
    opt.step(gr.params.data(), gr.params.size(), ref, gr.runs.data(), gr.runs.size(),
             static_cast<std::int64_t>(k + 1), static_cast<float>(grad_scale));
    const std::string f =
        check_step(before, s, gr, static_cast<std::int64_t>(k + 1), grad_scale, exact_codes);
    if (!f.empty()) {
      out.failure = "step " + std::to_string(k + 1) + ": " + f;
      break;
    }
    if (s.copy_dtype) {
      std::vector<std::uint16_t> want(s.n);
      convert(s.p.data(), DType::kF32, want.data(), *s.copy_dtype, s.n);
      if (!std::equal(want.begin(), want.end(), s.copy.begin() + 8)) {
        out.failure = "step " + std::to_string(k + 1) + ": the copy is not the rounded master";
        break;
      }
      for (int c = 0; c < 8; ++c) {
        if (s.copy[c] != 0x5a5a || s.copy[s.copy.size() - 1 - c] != 0x5a5a) {
          out.failure = "the copy's canaries were overwritten";
        }
      }
    }
    if (!s.m.guards_intact() || !s.v.guards_intact()) {
      out.failure = "step " + std::to_string(k + 1) + ": a write outside the moment records";
      break;
    }
  }
  out.s = std::move(s);
  return out;
}

void expect_same_bits(const Shard8& a, const Shard8& b, const std::string& what) {
  EXPECT_EQ(std::memcmp(a.p.data(), b.p.data(), a.n * 4), 0) << what << ": master differs";
  EXPECT_TRUE(a.m == b.m) << what << ": m records differ";
  EXPECT_TRUE(a.v == b.v) << what << ": v records differ";
  EXPECT_EQ(a.copy, b.copy) << what << ": copy differs";
}

OptimizerParams adamw8() {
  OptimizerParams hp;
  hp.type = OptimizerType::kAdamW;
  hp.lr = 1e-3;
  hp.weight_decay = 0.01;
  hp.moment_dtype = MomentDType::kInt8;
  return hp;
}

std::vector<std::vector<float>> random_grads(std::size_t n, int steps, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> scale(-4.0f, 1.0f);
  // Heavy-tailed: each element has its own magnitude over 5 decades, as real gradients do.
  std::vector<float> mag(n);
  for (float& x : mag) x = std::pow(10.0f, scale(rng));
  std::vector<std::vector<float>> g(static_cast<std::size_t>(steps), std::vector<float>(n));
  for (auto& step : g) {
    for (std::size_t i = 0; i < n; ++i) step[i] = normal(rng) * mag[i];
  }
  return g;
}

// ---- one step on adversarial blocks: the bound, every ISA, the same bits

TEST(Int8Moments, OneStepErrorBoundOnAdversarialBlocks) {
  const std::size_t n = 9 * B + 77;
  std::vector<float> g(n);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t b = i / B, j = i % B;
    switch (b) {
      case 0: g[i] = 0.0f; break;                                   // zeros
      case 1: g[i] = j == 17 ? 1e4f : u(rng) * 1e-3f; break;        // one outlier per block
      case 2: g[i] = 0.37f; break;                                  // constant
      case 3: g[i] = -2.5e-3f; break;                               // constant, negative
      case 4: g[i] = u(rng) * 1e-40f; break;                        // subnormal m, v underflows
      case 5: g[i] = j == 0 ? 1e-30f : u(rng) * 1e-39f; break;      // subnormals beside a tiny
      case 6: g[i] = u(rng) * std::pow(10.0f, 10 * u(rng)); break;  // 20 decades in a block
      case 7: g[i] = (j % 2 ? 1.0f : -1.0f) * 1e-8f; break;         // alternating signs
      default: g[i] = u(rng); break;                                // plain (and the short tail)
    }
  }
  OptimizerParams hp = adamw8();
  hp.eps = 1e-8;
  const Groups gr = one_group(hp, n);
  Shard8 base = make_shard(n, DType::kF32, DType::kBF16);
  for (std::size_t i = 0; i < n; ++i) base.p[i] = 0.5f + 1e-3f * static_cast<float>(i % 100);
  Shard8 scalar;
  for (Isa isa : available_isas()) {
    CpuExecOptions o;
    o.isa = isa;
    // Two steps: the second starts from quantized, non-zero state.
    Run8 r = run_steps(base, gr, {g, g}, o, 1.0);
    ASSERT_TRUE(r.failure.empty()) << to_string(isa) << ": " << r.failure;
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t b = i / B;
      if (b == 0) {
        ASSERT_EQ(r.s.m.m_value(i), 0.0) << i;
        ASSERT_EQ(r.s.v.v_value(i), 0.0) << i;
      }
      if (b == 2 || b == 3) {  // a constant block is stored exactly: every code 1.0
        ASSERT_EQ(r.s.m.m_value(i), static_cast<double>(r.s.m.absmax(b)) * (b == 3 ? -1 : 1));
        ASSERT_EQ(r.s.v.v_value(i), static_cast<double>(r.s.v.absmax(b)));
      }
    }
    EXPECT_LT(r.s.m.absmax(4), 1.2e-38f);  // the subnormal block went through the pre-scaling
    EXPECT_GT(r.s.m.absmax(4), 0.0f);
    if (isa == Isa::kScalar) {
      scalar = std::move(r.s);
    } else {
      expect_same_bits(r.s, scalar, std::string(to_string(isa)));
    }
  }
}

// grad_scale 1 skips the multiply (AVX-512's unscaled spans, the scalar branch) and must give
// the bits of the multiply: gradients 2g at grad_scale 0.5, on every ISA. (f32 and bf16
// gradients: their rounding of 2g is twice that of g; f16's is not among its subnormals.)
TEST(Int8Moments, GradScaleOneGivesTheBitsOfTheMultiply) {
  const std::size_t n = 4099;
  const auto grads = random_grads(n, 3, 21);
  auto doubled = grads;
  for (std::vector<float>& step : doubled) {
    for (float& g : step) g *= 2.0f;
  }
  const Groups gr = one_group(adamw8(), n);
  for (DType gdt : {DType::kF32, DType::kBF16}) {
    Shard8 base = make_shard(n, gdt, DType::kBF16);
    for (std::size_t i = 0; i < n; ++i) base.p[i] = 0.001f * static_cast<float>(i % 1000);
    for (Isa isa : available_isas()) {
      const std::string what = std::string(to_string(gdt)) + " isa " + std::string(to_string(isa));
      CpuExecOptions o;
      o.isa = isa;
      const Run8 a = run_steps(base, gr, grads, o, 1.0);
      const Run8 b = run_steps(base, gr, doubled, o, 0.5);
      ASSERT_TRUE(a.failure.empty()) << what << ": " << a.failure;
      ASSERT_TRUE(b.failure.empty()) << what << ": " << b.failure;
      expect_same_bits(a.s, b.s, what + ", grad_scale 1 against 2g x 0.5");
    }
  }
}

// ---- the matrix: random shards, every grad dtype x copy dtype x ISA, groups' runs

struct Case {
  std::string name;
  DType grad;
};

class Int8Matrix : public ::testing::TestWithParam<Case> {};

TEST_P(Int8Matrix, MatchesFloat64ReferenceAndScalarBitwise) {
  const DType gdt = GetParam().grad;
  std::uint32_t seed = 11;
  for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{255}, std::size_t{256},
                        std::size_t{257}, std::size_t{4099}, std::size_t{70001}}) {
    // Three groups whose runs cut blocks (Adam with L2 decay between two AdamW runs).
    Groups gr;
    OptimizerParams a = adamw8();
    OptimizerParams nodecay = a;
    nodecay.weight_decay = 0.0;
    nodecay.lr = 3e-3;
    nodecay.beta1 = 0.8;
    OptimizerParams l2 = a;
    l2.type = OptimizerType::kAdamW;
    l2.bias_correction = false;
    l2.beta2 = 0.99;
    l2.eps = 1e-6;
    gr.params = {a, nodecay, l2};
    const std::size_t cut1 = n / 3 + 5 < n ? n / 3 + 5 : n, cut2 = cut1 + (n - cut1) / 2;
    gr.runs = {{0, cut1, 0}, {cut1, cut2 - cut1, 1}, {cut2, n - cut2, 2}};
    const auto grads = random_grads(n, 8, seed++);
    for (std::optional<DType> copy : {std::optional<DType>{}, std::optional<DType>{DType::kBF16},
                                      std::optional<DType>{DType::kF16}}) {
      Shard8 base = make_shard(n, gdt, copy);
      std::mt19937 rng(seed);
      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
      for (float& x : base.p) x = u(rng);
      Shard8 scalar;
      for (Isa isa : available_isas()) {
        const std::string what = std::string(to_string(gdt)) + " copy " +
                                 (copy ? std::string(to_string(*copy)) : "none") + " isa " +
                                 std::string(to_string(isa)) + " n " + std::to_string(n);
        CpuExecOptions o;
        o.isa = isa;
        Run8 r = run_steps(base, gr, grads, o, 0.3);
        ASSERT_TRUE(r.failure.empty()) << what << ": " << r.failure;
        if (isa == Isa::kScalar) {
          scalar = std::move(r.s);
        } else {
          expect_same_bits(r.s, scalar, what);
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, Int8Matrix,
                         ::testing::Values(Case{"f32", DType::kF32}, Case{"bf16", DType::kBF16},
                                           Case{"f16", DType::kF16}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

// ---- how the work is split changes nothing

TEST(Int8Moments, ThreadsTaskSizesAndRunSplitsGiveIdenticalBits) {
  const std::size_t n = 300001;
  const auto grads = random_grads(n, 3, 5);
  OptimizerParams hp = adamw8();
  Shard8 base = make_shard(n, DType::kBF16, DType::kBF16);
  for (std::size_t i = 0; i < n; ++i) base.p[i] = 0.001f * static_cast<float>(i % 1000);
  CpuExecOptions o;
  o.isa = best_isa();
  o.threads = 1;
  const Run8 one = run_steps(base, one_group(hp, n), grads, o, 1.0, /*exact_codes=*/false);
  ASSERT_TRUE(one.failure.empty()) << one.failure;
  for (auto [threads, block] : {std::pair{2, std::size_t{0}}, std::pair{2, std::size_t{64}},
                                std::pair{0, std::size_t{4096}}, std::pair{1, std::size_t{192}}}) {
    CpuExecOptions oo = o;
    oo.threads = threads;
    oo.block_elems = block;
    const Run8 r = run_steps(base, one_group(hp, n), grads, oo, 1.0, false);
    ASSERT_TRUE(r.failure.empty()) << r.failure;
    expect_same_bits(r.s, one.s,
                     "threads " + std::to_string(threads) + " block " + std::to_string(block));
  }
  // One group given as many runs (cutting blocks) is the same as one run.
  Groups split;
  split.params = {hp, hp};
  for (std::size_t at = 0; at < n;) {
    const std::size_t len = std::min<std::size_t>(n - at, 1 + (at * 7919) % 1000);
    split.runs.push_back({at, len, static_cast<int>(split.runs.size() % 2)});
    at += len;
  }
  const Run8 r = run_steps(base, split, grads, o, 1.0, false);
  ASSERT_TRUE(r.failure.empty()) << r.failure;
  expect_same_bits(r.s, one.s, "runs of the same options");
}

// f32 / bf16 moments: the runs overload is step() per run, bit for bit.
TEST(Int8Moments, RunsOverloadOfPlainMomentsIsOneStepPerRun) {
  const std::size_t n = 5000;
  const auto g = random_grads(n, 1, 9)[0];
  for (MomentDType md : {MomentDType::kF32, MomentDType::kBF16}) {
    OptimizerParams a;
    a.moment_dtype = md;
    OptimizerParams b = a;
    b.lr = 5e-3;
    b.weight_decay = 0.2;
    const std::size_t es = state_bytes(md, 1);
    std::vector<float> p1(n, 0.25f), p2 = p1;
    std::vector<char> s1(2 * n * es, 0), s2 = s1;
    auto ref = [&](std::vector<float>& p, std::vector<char>& s) {
      ShardRef r;
      r.count = n;
      r.master = p.data();
      r.grad = g.data();
      r.state[0] = s.data();
      r.state[1] = s.data() + n * es;
      return r;
    };
    CpuOptimizer opt;
    const std::vector<OptimizerParams> groups = {a, b};
    const std::vector<StepRun> runs = {{0, 1234, 0}, {1234, 1000, 1}, {2234, n - 2234, 0}};
    opt.step(groups.data(), 2, ref(p1, s1), runs.data(), runs.size(), 1);
    const ShardRef whole = ref(p2, s2);
    for (const StepRun& r : runs) opt.step(groups[r.group], whole.part(r.at, r.count, md), 1);
    EXPECT_EQ(p1, p2) << to_string(md);
    EXPECT_EQ(s1, s2) << to_string(md);
  }
}

// ---- sizes and errors

TEST(Int8Moments, StateBytesAndParts) {
  EXPECT_EQ(state_bytes(MomentDType::kInt8, 0), 0u);
  EXPECT_EQ(state_bytes(MomentDType::kInt8, 1), 5u);
  EXPECT_EQ(state_bytes(MomentDType::kInt8, B), B + 4);
  EXPECT_EQ(state_bytes(MomentDType::kInt8, 3 * B + 1), 3 * B + 1 + 16);
  EXPECT_EQ(state_bytes(MomentDType::kF32, 10), 40u);
  EXPECT_EQ(state_bytes(MomentDType::kBF16, 10), 20u);
  EXPECT_EQ(state_block(MomentDType::kInt8), B);
  EXPECT_EQ(state_block(MomentDType::kF32), 1u);
  EXPECT_EQ(to_string(MomentDType::kInt8), "int8");
  EXPECT_EQ(parse_moment_dtype("INT8"), MomentDType::kInt8);
  EXPECT_EQ(parse_moment_dtype("bfloat16"), MomentDType::kBF16);
  EXPECT_THROW(parse_moment_dtype("fp8"), Error);

  Shard8 s = make_shard(3 * B + 10, DType::kF32, std::nullopt);
  const ShardRef whole = s.ref();
  const ShardRef part = whole.part(B, 2 * B + 10, MomentDType::kInt8);
  EXPECT_EQ(part.state[0], s.m.data() + kMomentRecord);
  EXPECT_EQ(part.master, s.p.data() + B);
  auto expect_invalid = [](const std::function<void()>& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "no error; expected one naming " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_invalid([&] { (void)whole.part(10, B, MomentDType::kInt8); }, "block of 256");
  expect_invalid([&] { (void)whole.part(0, B + 1, MomentDType::kInt8); }, "block of 256");

  CpuOptimizer opt;
  const OptimizerParams hp = adamw8();
  s.set_grads(std::vector<float>(s.n, 0.5f));
  ShardRef bad = s.ref();
  bad.state[1] = s.v.data() + 2;  // not 4-aligned
  expect_invalid([&] { opt.step(hp, bad, 1); }, "aligned to 4");
  const std::vector<StepRun> gap = {{0, 10, 0}, {11, s.n - 11, 0}};
  expect_invalid([&] { opt.step(&hp, 1, s.ref(), gap.data(), gap.size(), 1); },
                 "does not continue");
  const std::vector<StepRun> short_runs = {{0, 10, 0}};
  expect_invalid([&] { opt.step(&hp, 1, s.ref(), short_runs.data(), 1, 1); }, "cover 10");
  const std::vector<StepRun> no_group = {{0, s.n, 1}};
  expect_invalid([&] { opt.step(&hp, 1, s.ref(), no_group.data(), 1, 1); }, "group 1");
  OptimizerParams lion = hp;
  lion.type = OptimizerType::kLion;
  expect_invalid([&] { opt.step(lion, s.ref(), 1); }, "moment_dtype = int8");
  // Nothing was written by the failed calls.
  for (std::size_t i = 0; i < s.n; ++i) ASSERT_EQ(s.p[i], 0.0f);

  // init_state zeroes codes and absmax.
  std::fill(s.m.data(), s.m.data() + s.m.bytes(), 0x77);
  opt.init_state(hp, s.ref());
  EXPECT_TRUE(
      std::all_of(s.m.data(), s.m.data() + s.m.bytes(), [](std::uint8_t b) { return b == 0; }));
  EXPECT_TRUE(s.m.guards_intact());
}

}  // namespace
}  // namespace zero
