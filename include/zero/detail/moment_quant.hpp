// zero/detail/moment_quant.hpp — 8-bit Adam moments (optimizer.params.moment_dtype = "int8"):
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
// Nearest code: thresholds are the f32 midpoints between neighbouring values (the exact double
// sum halved, rounded once to f32); the code of a magnitude y is the number of thresholds
// strictly below it, compared as unsigned bit patterns (the order of non-negative floats; NaN
// sorts above everything and gets the top code). The scalar path and the GPU count by a
// branchless binary search; the SIMD paths look the count up in a table indexed by the top
// bits of y (optim/moment_lut.*) and are checked against the search for every input where they
// could differ. Ties go to the smaller magnitude.
//
// A block's absmax is the maximum of the |value| bit patterns (an integer maximum: exact,
// associative, the same in any order; a NaN makes the block's absmax NaN, an Inf Inf: a
// non-finite moment makes its whole block non-finite, where f32 moments keep it to the
// element). Values are normalised as y = (x * pre) * inv with inv = 1 / (absmax * pre):
// pre = 1 for a normal absmax, 2^64 for a subnormal one (so inv stays finite; the scaling is
// exact), inv = 0 for an all-zero block.
//
// The bound (moment_quant_test checks it in float64 on adversarial data): an element x of a
// block with absmax A comes back as x' with |x' - x| <= A (g / 2) (1 + 2^-20) + 2^-149, g the
// gap between the two code values around |x| / A (m: at most 0.9 / 64 / 2 = 0.70% of A in the
// top decade; v: 0.35%; below the smallest code, 1e-6 A for m and 1e-7 A for v, at most half
// of it).
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

#include "zero/detail/hd.hpp"
#include "zero/detail/optim_math.hpp"
#include "zero/dtype.hpp"

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

// The tables: magnitudes in [0, 1] (index 0 is 0, the last 1) and the bit patterns of the
// thresholds between neighbours (threshold i between magnitudes i and i + 1).
struct MomentCodes {
  float m[kMCodes];
  float v[kVCodes];
  std::uint32_t m_thr[kMCodes - 1];
  std::uint32_t v_thr[kVCodes - 1];
};

namespace moment_detail {
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
constexpr std::uint32_t bits_of(float f) { return __builtin_bit_cast(std::uint32_t, f); }
}  // namespace moment_detail

constexpr MomentCodes make_moment_codes() {
  MomentCodes c{};
  for (int j = 0; j < kMCodes; ++j) c.m[j] = static_cast<float>(moment_detail::code_value(j, 7));
  for (int j = 0; j < kVCodes; ++j) c.v[j] = static_cast<float>(moment_detail::code_value(j, 8));
  for (int j = 0; j + 1 < kMCodes; ++j) {
    const double mid = (static_cast<double>(c.m[j]) + static_cast<double>(c.m[j + 1])) / 2.0;
    c.m_thr[j] = moment_detail::bits_of(static_cast<float>(mid));
  }
  for (int j = 0; j + 1 < kVCodes; ++j) {
    const double mid = (static_cast<double>(c.v[j]) + static_cast<double>(c.v[j + 1])) / 2.0;
    c.v_thr[j] = moment_detail::bits_of(static_cast<float>(mid));
  }
  return c;
}

// The host's copy (the CUDA kernel keeps a device copy of the same constant expression).
inline constexpr MomentCodes kMomentCodes = make_moment_codes();
static_assert(kMomentCodes.m[kMCodes - 1] == 1.0f && kMomentCodes.v[kVCodes - 1] == 1.0f);
static_assert(kMomentCodes.m[1] == 1e-6f && kMomentCodes.v[1] == 1e-7f);

// ---- per element

// Count of thresholds below magnitude bits `mag` (0 .. 2^kLog2), a branchless binary search over
// 2^kLog2 - 1 sorted thresholds.
template <int kLog2>
ZERO_HD inline std::uint32_t count_below(const std::uint32_t* thr, std::uint32_t mag) {
  std::uint32_t idx = 0;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int s = kLog2 - 1; s >= 0; --s) {
    const std::uint32_t step = 1u << s;
    idx += thr[idx + step - 1] < mag ? step : 0u;
  }
  return idx;
}

// m: code = sign | nearest magnitude index of y (y = value / absmax).
ZERO_HD inline std::uint8_t m_code(const MomentCodes& c, float y) {
  const std::uint32_t u = f32_bits(y);
  return static_cast<std::uint8_t>(count_below<7>(c.m_thr, u & 0x7fffffffu) | ((u >> 24) & 0x80u));
}
// v: code = nearest magnitude index of |y|.
ZERO_HD inline std::uint8_t v_code(const MomentCodes& c, float y) {
  return static_cast<std::uint8_t>(count_below<8>(c.v_thr, f32_bits(y) & 0x7fffffffu));
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
