// zero/optim/detail/moment_quant.hpp — 8-bit Adam moments (optimizer.params.moment_dtype = "int8"):
// the code maps, the block layout and the per-element quantize / dequantize, shared by the CPU
// paths (optim/) and the CUDA kernel (kernels/optimizer_step.cu), so every path gives the same
// bits.
//
// The scheme is bitsandbytes' block-wise 8-bit Adam (Dettmers et al. 2022, "8-bit Optimizers
// via Block-wise Quantization", arXiv:2110.02861): each moment array is cut into blocks of
// kMomentBlock elements; a block keeps one f32 absmax (its largest |value|) and one 8-bit code
// per element, the code naming a value of a non-linear "dynamic" map in [-1, 1] (m) or [0, 1]
// (v) that is multiplied by the absmax. The step reads a block's codes, dequantizes, applies
// today's Adam update (adam_update in optim_math.hpp, unchanged: the parameter update uses the
// f32 moments before re-quantization, as bitsandbytes does), takes the block's new absmax and
// writes every moment back as the code nearest to value / absmax.
//
// The maps (our own closed form of the dynamic-tree idea of bitsandbytes' create_dynamic_map):
// a magnitude index j >= 1 with n = floor(log2 j) lies in decade d = (bits - 1) - n, where the
// decade (10^-(d+1), 10^-d] is cut into 2^n equal steps and j names the upper end of step
// k = j - 2^n:
//     value(j) = 10^-d (0.1 + 0.9 (k + 1) / 2^n) = (2^n + 9 (k + 1)) / (10^(d+1) 2^n)
// so large magnitudes get many codes, small ones few, and 1 is exact (the block's absmax element
// comes back exactly). m: sign + 7 bits (j = 0..127, 0 = zero; decades down to 1e-6); v: 8 bits
// (j = 0..255, decades down to 1e-7). Numerator and denominator are exact integers in double;
// one double division and one rounding to f32 make each value, in constexpr evaluation: the
// same bits on every compiler, host or device.
//
// Nearest code, by arithmetic (no search): the map's codes are equally spaced within each
// decade, so a magnitude y in region r (r = d: (10^-(d+1), 10^-d], the codes from the one at its
// lower end, lo_r, to its top, hi_r; the bottom region runs from 0) gets code
//     base_r + RNE((y - lo_r) * inv_step_r)
// (base_r the code at lo_r, inv_step_r = 1 / the codes' spacing, all f32 constants made in
// constexpr double like the values). That is the nearest code up to the f32 rounding of that
// product: a y within ~2^-15 of a spacing of the midpoint between two codes may get either. The
// region is the count of decade tops hi_1 .. hi_D at or above y (the scalar path and the GPU
// compare; AVX-512 reads it from the exponent of y and one compare, moment_lut.hpp; the tests
// check they agree). Every path performs these same IEEE operations, so the codes are the same
// bits everywhere. A magnitude above 2 (rounding can give 1 + ulp; Inf) or NaN gets the top code.
//
// A block's absmax is the maximum of the |value| bit patterns (an integer maximum: exact,
// associative, the same in any order; a NaN makes the block's absmax NaN, an Inf Inf: a
// non-finite moment makes its whole block non-finite, where f32 moments keep it to the
// element). Values are normalised as y = (x * pre) * inv with inv = 1 / (absmax * pre):
// pre = 1 for a normal absmax, 2^64 for a subnormal one (so inv stays finite; the scaling is
// exact), inv = 0 for an all-zero block.
//
// The bound (moment_quant_test checks it in float64 on adversarial data): an element x of a
// block with absmax A comes back as x' with |x' - x| <= A (g / 2) (1 + 2^-20) + A 2^-20 +
// 2^-146, g the gap between the two code values around |x| / A (m: at most 0.9 / 64 / 2 = 0.70%
// of A in the top decade; v: 0.35%; below the smallest code, 1e-6 A for m and 1e-7 A for v, at
// most half of it); the A 2^-20 covers the near-ties and the f32 roundings of the normalisation
// and the product, the last term subnormal results.
//
// Storage: a moment array is a sequence of records, one per block: the f32 absmax, then the
// block's codes (the last block of an array may be shorter). moment_bytes(n) is the size of n
// elements; a sub-range of an array starts on a block boundary. m codes are sign | index, v
// codes the index.
//
// Thread safety: pure functions and constants.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zero/core/detail/hd.hpp"
#include "zero/core/dtype.hpp"
#include "zero/optim/detail/optim_math.hpp"

namespace zero::detail::optim {

// Elements per quantization block. bitsandbytes' blockwise optimizer kernels use 256 (its paper
// 2048): small blocks keep an outlier from coarsening many neighbours, and the engine pads each
// unit to N x this (a shard starts on a block), which 256 keeps small. The scale costs
// 4 / 256 = 0.016 B per element per moment. Must match the CUDA kernel's threads per block.
inline constexpr std::size_t kMomentBlock = 256;
inline constexpr std::size_t kMomentRecord = 4 + kMomentBlock;  // absmax, then the codes

// Bytes of n elements of an int8 moment array (n counted from a block boundary).
ZERO_HD inline constexpr std::size_t moment_bytes(std::size_t n) {
  return n + 4 * ((n + kMomentBlock - 1) / kMomentBlock);
}

inline constexpr int kMCodes = 128;  // m magnitudes (the sign is bit 7 of the code)
inline constexpr int kVCodes = 256;  // v magnitudes

// The tables: magnitudes in [0, 1] (index 0 is 0, the last 1) and each map's regions.
inline constexpr int kMaxRegions = 8;
struct MomentRegions {
  float hi[kMaxRegions];           // the region's top value (a code's); region 0: 1
  float lo[kMaxRegions];           // the value of the code below its first (bottom region: 0)
  float inv_step[kMaxRegions];     // 1 / the spacing of its codes
  std::int32_t base[kMaxRegions];  // the code at lo
  int count;                       // regions (m: 7, v: 8)
  std::int32_t top;                // the largest code (m: 127, v: 255)
};
struct MomentCodes {
  float m[kMCodes];
  float v[kVCodes];
  MomentRegions mr, vr;
};

namespace moment_detail {
constexpr double pow10_neg(int d) {
  std::int64_t den = 1;
  for (int i = 0; i < d; ++i) den *= 10;
  return 1.0 / static_cast<double>(den);
}
// value(j) for a map of `bits` magnitude bits (see above).
constexpr double code_value(int j, int bits) {
  if (j == 0) return 0.0;
  int n = 0;
  while ((2 << n) <= j) ++n;  // floor(log2 j)
  const int d = bits - 1 - n;
  const std::int64_t p2 = std::int64_t{1} << n;
  std::int64_t den = p2;
  for (int i = 0; i <= d; ++i) den *= 10;
  return static_cast<double>(p2 + 9 * (j - p2 + 1)) / static_cast<double>(den);
}
constexpr MomentRegions regions(int bits) {
  MomentRegions r{};
  r.count = bits;
  r.top = (1 << bits) - 1;
  for (int d = 0; d < bits; ++d) {
    const int n = bits - 1 - d;  // the decade's codes: 2^n .. 2^(n+1) - 1
    const int base = (1 << n) - 1;
    const double hi = pow10_neg(d);
    const double lo = d == bits - 1 ? 0.0 : pow10_neg(d + 1);
    r.hi[d] = static_cast<float>(code_value((2 << n) - 1, bits));
    r.lo[d] = static_cast<float>(code_value(base, bits));
    r.inv_step[d] = static_cast<float>(static_cast<double>(1 << n) / (hi - lo));
    r.base[d] = base;
  }
  return r;
}
}  // namespace moment_detail

constexpr MomentCodes make_moment_codes() {
  MomentCodes c{};
  for (int j = 0; j < kMCodes; ++j) c.m[j] = static_cast<float>(moment_detail::code_value(j, 7));
  for (int j = 0; j < kVCodes; ++j) c.v[j] = static_cast<float>(moment_detail::code_value(j, 8));
  c.mr = moment_detail::regions(7);
  c.vr = moment_detail::regions(8);
  return c;
}

// The host's copy (the CUDA kernel keeps a device copy of the same constant expression).
inline constexpr MomentCodes kMomentCodes = make_moment_codes();
static_assert(kMomentCodes.m[kMCodes - 1] == 1.0f && kMomentCodes.v[kVCodes - 1] == 1.0f);
static_assert(kMomentCodes.m[1] == 1e-6f && kMomentCodes.v[1] == 1e-7f);
static_assert(kMomentCodes.mr.hi[0] == 1.0f && kMomentCodes.vr.lo[7] == 0.0f);

// ---- per element

// The region of magnitude y: how many decade tops below the first are >= y.
ZERO_HD inline int region_of(const MomentRegions& r, float y) {
  int k = 0;
  for (int d = 1; d < r.count; ++d) k += r.hi[d] >= y ? 1 : 0;
  return k;
}

// 1.5 x 2^23: (x + it) - it rounds an f32 of magnitude < 2^22 to an integer, half to even, in
// plain additions (what cvtps2dq and __float2int_rn do in their default mode).
inline constexpr float kRoundMagic = 12582912.0f;

// The code (magnitude index) of magnitude y >= 0 (or NaN).
ZERO_HD inline std::int32_t magnitude_code(const MomentRegions& r, float y) {
  if (!(y <= 2.0f)) return r.top;
  const int k = region_of(r, y);
  const float x = mul(add(y, -r.lo[k]), r.inv_step[k]);
  const std::int32_t j =
      r.base[k] + static_cast<std::int32_t>(add(add(x, kRoundMagic), -kRoundMagic));
  return j < r.top ? j : r.top;
}

// m: code = sign | magnitude code of |y| (y = value / absmax).
ZERO_HD inline std::uint8_t m_code(const MomentCodes& c, float y) {
  const std::uint32_t u = f32_bits(y);
  const std::int32_t j = magnitude_code(c.mr, f32_from_bits(u & 0x7fffffffu));
  return static_cast<std::uint8_t>(static_cast<std::uint32_t>(j) | ((u >> 24) & 0x80u));
}
// v: code = magnitude code of |y|.
ZERO_HD inline std::uint8_t v_code(const MomentCodes& c, float y) {
  return static_cast<std::uint8_t>(magnitude_code(c.vr, f32_from_bits(f32_bits(y) & 0x7fffffffu)));
}

ZERO_HD inline float m_value(const MomentCodes& c, std::uint8_t code, float absmax) {
  const float mag = c.m[code & 0x7fu];
  return mul(f32_from_bits(f32_bits(mag) | (std::uint32_t{code & 0x80u} << 24)), absmax);
}
ZERO_HD inline float v_value(const MomentCodes& c, std::uint8_t code, float absmax) {
  return mul(c.v[code], absmax);
}

// |x| as bits: what a block's absmax is the maximum of.
ZERO_HD inline std::uint32_t abs_bits(float x) { return f32_bits(x) & 0x7fffffffu; }

// How a block with absmax bits `amax` normalises its values: y = (x * pre) * inv.
struct BlockNorm {
  float pre = 1.0f;
  float inv = 0.0f;
};
inline constexpr float kSubnormalPre = 18446744073709551616.0f;  // 2^64
ZERO_HD inline BlockNorm block_norm(std::uint32_t amax) {
  BlockNorm n;
  if (amax == 0) return n;  // all zeros: every code 0 (or -0 for m)
  const float a = f32_from_bits(amax);
  if (amax < 0x00800000u) n.pre = kSubnormalPre;  // subnormal: 1 / a would overflow
  n.inv = div(1.0f, mul(a, n.pre));
  return n;
}
ZERO_HD inline float normalise(const BlockNorm& n, float x) { return mul(mul(x, n.pre), n.inv); }

// A block's absmax as stored (the records' first word).
ZERO_HD inline float load_absmax(const std::uint8_t* record) {
  std::uint32_t u;
  __builtin_memcpy(&u, record, 4);
  return f32_from_bits(u);
}
ZERO_HD inline void store_absmax(std::uint8_t* record, std::uint32_t amax) {
  __builtin_memcpy(record, &amax, 4);
}

}  // namespace zero::detail::optim
