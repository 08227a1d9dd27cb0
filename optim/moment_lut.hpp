// optim/moment_lut.hpp — the nearest-code table of the SIMD int8-moment paths (private).
//
// The code of a magnitude is the count of thresholds below it (zero/detail/moment_quant.hpp).
// The scalar path counts by binary search (8 dependent loads); AVX2 / AVX-512 look it up in one
// gather: the magnitude's top 15 bits (exponent and 7 mantissa bits) pick a bucket, and no
// bucket holds more than one threshold of either map (checked when the table is built, at
// compile time), so the count is the bucket's count of thresholds below it plus one if the
// magnitude's low 16 bits exceed those of the bucket's threshold. Entry: base | low16 << 8 (no
// threshold in the bucket: low16 = 0xffff, never exceeded). Buckets below the smallest
// threshold and from 1.0 up are clamped to the first / last entry (count 0 / all; NaN sorts
// above 1.0 as the search has it).
//
// moment_quant_test checks the lookup against the search for every magnitude of every bucket
// that holds a threshold and the ends of every other bucket, which covers every input.
//
// Thread safety: constants.
#pragma once

#include <cstdint>

#include "zero/detail/moment_quant.hpp"

namespace zero::detail::optim {

struct MomentLut {
  // Bucket index range [kLo, kHi]: kLo below the smallest threshold of both maps, kHi = 1.0's.
  static constexpr std::uint32_t kLo = 0x3355;
  static constexpr std::uint32_t kHi = 0x3f80;
  static constexpr std::uint32_t kSize = kHi - kLo + 1;
  std::uint32_t m[kSize];
  std::uint32_t v[kSize];
};

namespace moment_detail {
template <int kN>
constexpr void fill_lut(const std::uint32_t (&thr)[kN], std::uint32_t* out) {
  int below = 0;  // thresholds whose bucket is below the current one
  for (std::uint32_t b = MomentLut::kLo; b <= MomentLut::kHi; ++b) {
    std::uint32_t low = 0xffff;
    int inside = 0;
    while (below + inside < kN && (thr[below + inside] >> 16) == b) {
      low = thr[below + inside] & 0xffff;
      ++inside;
    }
    if (b == MomentLut::kLo && (below < kN && (thr[0] >> 16) < b)) throw "threshold below kLo";
    if (inside > 1) throw "two thresholds in one bucket";
    out[b - MomentLut::kLo] = static_cast<std::uint32_t>(below) | (low << 8);
    below += inside;
  }
  if (below != kN) throw "threshold above kHi";
}
}  // namespace moment_detail

constexpr MomentLut make_moment_lut() {
  MomentLut t{};
  if ((kMomentCodes.m_thr[0] >> 16) <= MomentLut::kLo ||
      (kMomentCodes.v_thr[0] >> 16) <= MomentLut::kLo) {
    throw "kLo must lie below the smallest threshold";
  }
  moment_detail::fill_lut(kMomentCodes.m_thr, t.m);
  moment_detail::fill_lut(kMomentCodes.v_thr, t.v);
  return t;
}

inline constexpr MomentLut kMomentLut = make_moment_lut();

// The lookup in scalar form (the SIMD paths do the same per lane); equals count_below().
inline std::uint32_t lut_count(const std::uint32_t* table, std::uint32_t mag) {
  std::uint32_t b = mag >> 16;
  b = b < MomentLut::kLo ? MomentLut::kLo : (b > MomentLut::kHi ? MomentLut::kHi : b);
  const std::uint32_t e = table[b - MomentLut::kLo];
  return (e & 0xffu) + ((mag & 0xffffu) > (e >> 8) ? 1u : 0u);
}

}  // namespace zero::detail::optim
