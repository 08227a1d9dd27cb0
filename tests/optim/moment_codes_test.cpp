// The int8 Adam moments' code maps (zero/optim/detail/moment_quant.hpp): sorted and spanning [0,
// 1], their regions, the AVX-512 region lookup from the exponent against the comparisons, the
// nearest code against every value of the map, and smaller blocks quantizing Adam moments better.
// The optimizer's step with int8 moments: moment_quant_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "optim/moment_lut.hpp"
#include "zero/core/dtype.hpp"
#include "zero/optim/detail/moment_quant.hpp"

namespace zero {
namespace {

using detail::optim::kMCodes;
using detail::optim::kMomentCodes;
using detail::optim::kVCodes;

// ---- the maps

TEST(MomentCodes, MapsAreSortedAndSpanZeroToOne) {
  EXPECT_EQ(kMomentCodes.m[0], 0.0f);
  EXPECT_EQ(kMomentCodes.v[0], 0.0f);
  EXPECT_EQ(kMomentCodes.m[kMCodes - 1], 1.0f);
  EXPECT_EQ(kMomentCodes.v[kVCodes - 1], 1.0f);
  for (int j = 1; j < kMCodes; ++j) EXPECT_LT(kMomentCodes.m[j - 1], kMomentCodes.m[j]) << j;
  for (int j = 1; j < kVCodes; ++j) EXPECT_LT(kMomentCodes.v[j - 1], kMomentCodes.v[j]) << j;
  // The dynamic map: 64 codes in (0.1, 1] for m, 128 for v; the smallest non-zero 1e-6 / 1e-7.
  EXPECT_EQ(
      std::count_if(kMomentCodes.m, kMomentCodes.m + kMCodes, [](float x) { return x > 0.1f; }),
      64);
  EXPECT_EQ(
      std::count_if(kMomentCodes.v, kMomentCodes.v + kVCodes, [](float x) { return x > 0.1f; }),
      128);
  EXPECT_FLOAT_EQ(kMomentCodes.m[1], 1e-6f);
  EXPECT_FLOAT_EQ(kMomentCodes.v[1], 1e-7f);
}

// The regions: the codes at each region's ends, and its spacing (the codes inside are
// lo + k * step, k = 0 .. 2^n, to within f32 rounding).
TEST(MomentCodes, RegionsDescribeTheMaps) {
  auto check = [](const float* val, const detail::optim::MomentRegions& r, const char* map) {
    EXPECT_EQ(r.hi[0], 1.0f) << map;
    for (int d = 0; d < r.count; ++d) {
      const int base = r.base[d];
      const int codes = d == r.count - 1 ? 1 : base + 1;  // the region's codes above lo
      EXPECT_EQ(r.lo[d], val[base]) << map << " region " << d;
      EXPECT_EQ(r.hi[d], val[base + codes]) << map << " region " << d;
      if (d + 1 < r.count) {
        EXPECT_EQ(r.lo[d], r.hi[d + 1]) << map << " region " << d;
      }
      for (int k = 0; k <= codes; ++k) {
        const double want = r.lo[d] + k / static_cast<double>(r.inv_step[d]);
        EXPECT_NEAR(val[base + k], want, 1e-6 * want) << map << " region " << d << " k " << k;
      }
    }
  };
  check(kMomentCodes.m, kMomentCodes.mr, "m");
  check(kMomentCodes.v, kMomentCodes.vr, "v");
}

// The AVX-512 path's region from the exponent equals the count of decade tops >= y, for every
// decade top and binade edge and 300 neighbours on either side of each (where the two could
// differ), and NaN-free random magnitudes.
TEST(MomentCodes, RegionFromTheExponentEqualsTheComparisons) {
  std::vector<std::uint32_t> probes;
  for (const auto* r : {&kMomentCodes.mr, &kMomentCodes.vr}) {
    for (int d = 0; d < r->count; ++d) probes.push_back(f32_bits(r->hi[d]));
  }
  for (std::uint32_t e = 0; e < 255; ++e) probes.push_back(e << 23);
  std::size_t checked = 0;
  for (std::uint32_t p : probes) {
    for (std::int64_t delta = -300; delta <= 300; ++delta) {
      const std::int64_t b = static_cast<std::int64_t>(p) + delta;
      if (b < 0 || b >= 0x7f800000) continue;
      const float y = f32_from_bits(static_cast<std::uint32_t>(b));
      ASSERT_EQ(detail::optim::exp_region(detail::optim::kExpRegionsM, y),
                detail::optim::region_of(kMomentCodes.mr, y))
          << "m y " << y;
      ASSERT_EQ(detail::optim::exp_region(detail::optim::kExpRegionsV, y),
                detail::optim::region_of(kMomentCodes.vr, y))
          << "v y " << y;
      ++checked;
    }
  }
  std::mt19937 rng(1);
  std::uniform_int_distribution<std::uint32_t> bits(0, 0x7f7fffff);
  for (int t = 0; t < 1000000; ++t) {
    const float y = f32_from_bits(bits(rng));
    ASSERT_EQ(detail::optim::exp_region(detail::optim::kExpRegionsM, y),
              detail::optim::region_of(kMomentCodes.mr, y));
    ASSERT_EQ(detail::optim::exp_region(detail::optim::kExpRegionsV, y),
              detail::optim::region_of(kMomentCodes.vr, y));
  }
  EXPECT_GT(checked, 100000u);
}

// Nearest: no other value of the map is closer to y than the chosen one, but for ties within
// 2^-14 of the spacing of the two codes around y (the f32 rounding of (y - lo) * inv_step).
// Above 2 and NaN: the top code.
TEST(MomentCodes, TheCodeNamesTheNearestValue) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> e(-9.0, 0.05);
  std::uniform_int_distribution<int> sign(0, 1);
  auto spacing = [](const float* table, int n, double y) {
    int j = 0;
    while (j + 2 < n && table[j + 1] < y) ++j;
    return static_cast<double>(table[j + 1]) - table[j];
  };
  for (int t = 0; t < 200000; ++t) {
    const float y = static_cast<float>((sign(rng) ? -1.0 : 1.0) * std::pow(10.0, e(rng)));
    const double a = std::abs(static_cast<double>(y));
    const std::uint8_t cm = detail::optim::m_code(kMomentCodes, y);
    const std::uint8_t cv = detail::optim::v_code(kMomentCodes, y);
    const double dm = std::abs(a - kMomentCodes.m[cm & 0x7f]);
    const double dv = std::abs(a - kMomentCodes.v[cv]);
    ASSERT_EQ((cm & 0x80) != 0, y < 0) << y;
    const double sm = std::ldexp(spacing(kMomentCodes.m, kMCodes, a), -14);
    const double sv = std::ldexp(spacing(kMomentCodes.v, kVCodes, a), -14);
    for (int j = 0; j < kVCodes; ++j) {
      if (j < kMCodes) {
        ASSERT_LE(dm, std::abs(a - kMomentCodes.m[j]) + sm)
            << "y " << y << " code " << int(cm) << " vs " << j;
      }
      ASSERT_LE(dv, std::abs(a - kMomentCodes.v[j]) + sv)
          << "y " << y << " code " << int(cv) << " vs " << j;
    }
  }
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(detail::optim::v_code(kMomentCodes, nan), 255);
  EXPECT_EQ(detail::optim::v_code(kMomentCodes, inf), 255);
  EXPECT_EQ(detail::optim::v_code(kMomentCodes, 1.5f), 255);
  EXPECT_EQ(detail::optim::m_code(kMomentCodes, -inf), 0xff);
  EXPECT_EQ(detail::optim::m_code(kMomentCodes, 0.0f), 0);
  EXPECT_EQ(detail::optim::m_code(kMomentCodes, -0.0f), 0x80);
  EXPECT_EQ(detail::optim::v_code(kMomentCodes, 4e-8f), 0);
  EXPECT_EQ(detail::optim::v_code(kMomentCodes, 6e-8f), 1);
}

// The block size, measured: Adam moments of 2^20 elements after 30 steps of noisy gradients
// whose scale drifts along the array over 5 decades (as parameters' gradients do) with a 2x
// jitter per element, quantized in blocks of 64 .. 16384 with the maps above. The relative RMS
// error of m, v and of the update m / sqrt(v) grows with the block (an outlier coarsens more
// neighbours): 1.72% at 256 against 3.48% at 2048 on the update (printed; docs/optimizers.md,
// "8-bit optimizer moments"), and past a few thousand the small v of a block fall below its
// smallest code and the update error explodes.
TEST(MomentCodes, SmallerBlocksQuantizeAdamMomentsBetter) {
  const std::size_t n = std::size_t{1} << 20;
  std::mt19937 rng(1);
  std::normal_distribution<double> nd(0, 1);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> scale(n), m(n, 0), v(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    scale[i] = std::pow(10.0, 0.3 * u(rng) + 2.5 * std::sin(static_cast<double>(i) * 4e-4) - 1.5);
  }
  for (int t = 0; t < 30; ++t) {
    for (std::size_t i = 0; i < n; ++i) {
      const double g = (nd(rng) + 0.1) * scale[i];
      m[i] = 0.9 * m[i] + 0.1 * g;
      v[i] = 0.999 * v[i] + 0.001 * g * g;
    }
  }
  std::vector<double> update_error;
  for (std::size_t block : {64, 256, 2048, 16384}) {
    double em = 0, ev = 0, eu = 0, sm = 0, sv = 0, su = 0;
    for (std::size_t b = 0; b < n; b += block) {
      std::uint32_t am = 0, av = 0;
      for (std::size_t i = b; i < b + block; ++i) {
        am = std::max(am, detail::optim::abs_bits(static_cast<float>(m[i])));
        av = std::max(av, detail::optim::abs_bits(static_cast<float>(v[i])));
      }
      const auto nm = detail::optim::block_norm(am), nv = detail::optim::block_norm(av);
      for (std::size_t i = b; i < b + block; ++i) {
        const double qm = detail::optim::m_value(
            kMomentCodes,
            detail::optim::m_code(kMomentCodes,
                                  detail::optim::normalise(nm, static_cast<float>(m[i]))),
            f32_from_bits(am));
        const double qv = detail::optim::v_value(
            kMomentCodes,
            detail::optim::v_code(kMomentCodes,
                                  detail::optim::normalise(nv, static_cast<float>(v[i]))),
            f32_from_bits(av));
        const double up = m[i] / (std::sqrt(v[i]) + 1e-8), uq = qm / (std::sqrt(qv) + 1e-8);
        em += (qm - m[i]) * (qm - m[i]);
        ev += (qv - v[i]) * (qv - v[i]);
        eu += (uq - up) * (uq - up);
        sm += m[i] * m[i];
        sv += v[i] * v[i];
        su += up * up;
      }
    }
    update_error.push_back(std::sqrt(eu / su));
    std::printf("block %5zu: relative RMS error m %.4f, v %.4f, update m / sqrt(v) %.4f\n", block,
                std::sqrt(em / sm), std::sqrt(ev / sv), std::sqrt(eu / su));
  }
  EXPECT_LT(update_error[1], update_error[2]);  // 256 better than 2048
  EXPECT_LT(update_error[1], 0.05);
}

}  // namespace
}  // namespace zero
