// optim/moment_lut.hpp — the AVX-512 int8-moment path's region table (private).
//
// The nearest code of a magnitude y needs its region: the count of decade tops hi_1 .. hi_D at
// or above y (zero/optim/detail/moment_quant.hpp). The scalar and AVX2 paths compare with each top;
// AVX-512 reads the region from y's exponent instead: a binade [2^k, 2^(k+1)) holds at most one
// decade top (decades are 3.3 binades wide), so every y in it has the region of the binade's top
// end, plus one where y <= the top inside it. Binades are indexed by the biased exponent clamped
// to [kFirstExp, kFirstExp + 31] (below: the bottom region, 2^-31 < 1e-7; above: region 0), so
// the tables are 32 entries, two AVX-512 registers each. moment_quant_test checks the two ways
// agree on every decade top and binade edge and their neighbours.
//
// Thread safety: constants.
#pragma once

#include <cstdint>

#include "zero/optim/detail/moment_quant.hpp"

namespace zero::detail::optim {

struct ExpRegions {
  static constexpr std::uint32_t kFirstExp = 96;  // biased exponent of 2^-31
  alignas(64) std::int32_t region[32];            // the region of the binade's top end
  alignas(64) float bound[32];                    // the decade top inside the binade, -1 if none
};

constexpr ExpRegions make_exp_regions(const MomentRegions& r) {
  ExpRegions t{};
  for (int i = 0; i < 32; ++i) {
    const int e = static_cast<int>(ExpRegions::kFirstExp) + i - 127;  // binade [2^e, 2^(e+1))
    double lo = 1.0, hi = 1.0;
    for (int k = 0; k < e; ++k) lo *= 2.0;
    for (int k = 0; k > e; --k) lo /= 2.0;
    hi = 2.0 * lo;
    int region = 0, inside = 0;
    t.bound[i] = -1.0f;
    for (int d = 1; d < r.count; ++d) {
      const double top = static_cast<double>(r.hi[d]);
      if (top >= hi) ++region;
      if (top >= lo && top < hi) {
        t.bound[i] = r.hi[d];
        ++inside;
      }
    }
    if (inside > 1) throw "two decade tops in one binade";
    t.region[i] = region;
  }
  return t;
}

inline constexpr ExpRegions kExpRegionsM = make_exp_regions(kMomentCodes.mr);
inline constexpr ExpRegions kExpRegionsV = make_exp_regions(kMomentCodes.vr);

// A map's per-region constants as 16-lane permute tables (the region in the low 3 bits).
struct RegionTables16 {
  alignas(64) float lo[16];
  alignas(64) float inv_step[16];
  alignas(64) std::int32_t base[16];
};
constexpr RegionTables16 make_region_tables16(const MomentRegions& r) {
  RegionTables16 t{};
  for (int i = 0; i < 16; ++i) {
    t.lo[i] = r.lo[i % kMaxRegions];
    t.inv_step[i] = r.inv_step[i % kMaxRegions];
    t.base[i] = r.base[i % kMaxRegions];
  }
  return t;
}
alignas(64) inline constexpr RegionTables16 kRegions16M = make_region_tables16(kMomentCodes.mr);
alignas(64) inline constexpr RegionTables16 kRegions16V = make_region_tables16(kMomentCodes.vr);

// The region in scalar form (the AVX-512 path does this per lane); equals region_of().
inline int exp_region(const ExpRegions& t, float y) {
  std::uint32_t e = f32_bits(y) >> 23;
  e = e < ExpRegions::kFirstExp ? ExpRegions::kFirstExp
                                : (e > ExpRegions::kFirstExp + 31 ? ExpRegions::kFirstExp + 31 : e);
  const std::uint32_t i = e - ExpRegions::kFirstExp;
  return t.region[i] + (y <= t.bound[i] ? 1 : 0);
}

}  // namespace zero::detail::optim
