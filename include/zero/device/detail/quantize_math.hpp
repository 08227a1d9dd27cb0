// zero/device/detail/quantize_math.hpp — block-wise symmetric int8 quantization, per element:
// shared by the CPU path (device/quantize.cpp) and the CUDA kernels, so both give the same bits.
//
// A block of elements with absolute maximum m is stored as int8 values q and one f32 scale
// s = m / 127: q = round_half_even(x * (127 / m)), clamped to [-127, 127], and read back as
// q * s. The ZeRO++ scheme (qwZ / qgZ, Wang et al. 2023) with a symmetric range: -128 is never
// produced, so negation is exact and a zero block stays zero (m = 0: s = 0, q = 0).
//
// The bound: |x - q s| <= s / 2 = m / 254, plus the f32 roundings of 127 / m, x * (127 / m),
// m / 127 and q * s: at most 254 x 2^-24 in q's units before rounding (s x 254 x 2^-24 = 2 m
// 2^-24) and 2 m 2^-24 after, so |x - q s| <= m / 254 + 4 m 2^-24 < m / 254 x (1 + 2^-13), the
// bound quantize_test holds every element to.
//
// Thread safety: pure functions of their arguments.
#pragma once

#include <cstdint>

#include "zero/core/detail/hd.hpp"

namespace zero::detail::quant {

inline constexpr float kLevels = 127.0f;
// Blocks whose absolute maximum is below 2^-120 (7.5e-37) are stored as zero: 127 / m would
// overflow f32 below about 3.7e-37, and the scale m / 127 would leave the normal range. Their
// read-back error is their maximum, < 2^-120.
inline constexpr float kTinyBlock = 7.52316384526264005e-37f;  // 2^-120

// The scale stored for a block whose absolute maximum is `absmax` (finite, >= 0).
ZERO_HD inline float block_scale(float absmax) {
  return absmax >= kTinyBlock ? absmax / kLevels : 0.0f;
}
// What each element is multiplied by before rounding: 127 / absmax, 0 for a zero (or tiny) block.
ZERO_HD inline float block_inverse(float absmax) {
  return absmax >= kTinyBlock ? kLevels / absmax : 0.0f;
}

// 1.5 x 2^23: adding and subtracting it rounds an f32 of magnitude < 2^22 to an integer, half to
// even (the sum's ulp is 1), in two plain additions a compiler vectorises — nearbyint is a libm
// call on baseline x86-64 (no SSE4.1 round). Exact for x * inverse, whose magnitude is <= 127.
inline constexpr float kRoundMagic = 12582912.0f;

ZERO_HD inline std::int8_t quantize_one(float x, float inverse) {
#if defined(__CUDA_ARCH__)
  int q = __float2int_rn(__fmul_rn(x, inverse));
#else
  const float r = (x * inverse + kRoundMagic) - kRoundMagic;
  int q = static_cast<int>(r);
#endif
  q = q > 127 ? 127 : (q < -127 ? -127 : q);
  return static_cast<std::int8_t>(q);
}

ZERO_HD inline float dequantize_one(std::int8_t q, float scale) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(static_cast<float>(q), scale);
#else
  return static_cast<float>(q) * scale;
#endif
}

}  // namespace zero::detail::quant
