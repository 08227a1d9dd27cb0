// zero/core/dtype.hpp — element types (f32, f16, bf16) and conversions between them.
//
// Scalar conversions are ZERO_HD inline functions shared by the CPU path and the CUDA kernels.
// f32 -> 16-bit rounds to nearest, ties to even; overflow gives +-Inf; subnormals are produced
// and consumed exactly (no flush to zero). NaN policy (the one x86 hardware follows, so the
// vectorized converters agree bitwise): a NaN keeps its sign and the top bits of its payload
// and is made quiet.
//
// Bulk converters pick AVX-512 (AVX512_BF16 for f32->bf16, F16C for f16) at run time when the
// CPU has them, and agree bitwise with the scalar functions for every input.
//
// Thread safety: every function here is pure and safe to call concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "zero/core/detail/hd.hpp"

namespace zero {

enum class DType : std::uint8_t { kF32, kF16, kBF16 };

constexpr std::size_t dtype_size(DType t) noexcept { return t == DType::kF32 ? 4 : 2; }

// "f32", "f16", "bf16".
std::string_view to_string(DType t) noexcept;
// Accepts "f32"/"fp32"/"float32", "f16"/"fp16"/"float16", "bf16"/"bfloat16"; throws
// zero::Error(kInvalidArgument) naming the string otherwise.
DType parse_dtype(std::string_view name);

// ---- bit casts usable in host and device code
ZERO_HD inline std::uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  return __builtin_bit_cast(std::uint32_t, f);
#endif
}
ZERO_HD inline float f32_from_bits(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  return __builtin_bit_cast(float, u);
#endif
}

// ---- bf16: the top 16 bits of an f32
ZERO_HD inline float bf16_to_f32(std::uint16_t h) { return f32_from_bits(std::uint32_t{h} << 16); }

ZERO_HD inline std::uint16_t f32_to_bf16(float f) {
  std::uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<std::uint16_t>((u >> 16) | 0x0040u);  // NaN: quiet, top payload kept
  }
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even; carries into the exponent
  return static_cast<std::uint16_t>(u >> 16);
}

// ---- f16: IEEE binary16 (1 sign, 5 exponent, 10 mantissa bits)
ZERO_HD inline float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t{h & 0x8000u} << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) {  // Inf or NaN (NaN made quiet, payload kept)
    return f32_from_bits(sign | 0x7f800000u | (mant << 13) | (mant != 0 ? 0x00400000u : 0u));
  }
  if (exp != 0) return f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return f32_from_bits(sign);
  // Subnormal: normalise. value = mant * 2^-24.
  int e = 113;  // biased f32 exponent of 2^-14
  while ((mant & 0x400u) == 0) {
    mant <<= 1;
    --e;
  }
  return f32_from_bits(sign | (static_cast<std::uint32_t>(e) << 23) | ((mant & 0x3ffu) << 13));
}

ZERO_HD inline std::uint16_t f32_to_f16(float f) {
  const std::uint32_t u = f32_bits(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) {  // NaN: quiet, top 10 payload bits kept
    return static_cast<std::uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  }
  if (abs >= 0x477ff000u) {  // >= 65520 = max f16 + half an ulp: rounds to Inf (ties to even)
    return static_cast<std::uint16_t>(sign | 0x7c00u);
  }
  if (abs >= 0x38800000u) {                               // normal f16 range (>= 2^-14)
    std::uint32_t r = abs - (112u << 23);                 // rebias exponent
    r += 0x0fffu + ((r >> 13) & 1u);                      // RNE on the 13 dropped bits
    return static_cast<std::uint16_t>(sign | (r >> 13));  // a carry may reach Inf: correct
  }
  if (abs < 0x33000000u) return static_cast<std::uint16_t>(sign);  // < 2^-25: rounds to zero
  // Subnormal f16: value = m * 2^-24 with m = round(abs_value * 2^24).
  const std::uint32_t exp = abs >> 23;                       // 102..112
  const std::uint32_t mant = (abs & 0x7fffffu) | 0x800000u;  // 24-bit significand
  const std::uint32_t shift = 126u - exp;                    // 14..24 bits dropped
  std::uint32_t m = mant >> shift;
  const std::uint32_t rem = mant & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (m & 1u) != 0)) ++m;  // may become the smallest normal: fine
  return static_cast<std::uint16_t>(sign | m);
}

// Converts one value stored as dtype `t` at p to f32 (scalar; for bulk use convert()).
ZERO_HD inline float load_as_f32(const void* p, DType t) {
  switch (t) {
    case DType::kF32: return *static_cast<const float*>(p);
    case DType::kF16: return f16_to_f32(*static_cast<const std::uint16_t*>(p));
    case DType::kBF16: return bf16_to_f32(*static_cast<const std::uint16_t*>(p));
  }
  return 0.0f;
}

// Stores f32 x as dtype `t` at p (round to nearest even; scalar).
ZERO_HD inline void store_from_f32(void* p, DType t, float x) {
  switch (t) {
    case DType::kF32: *static_cast<float*>(p) = x; return;
    case DType::kF16: *static_cast<std::uint16_t*>(p) = f32_to_f16(x); return;
    case DType::kBF16: *static_cast<std::uint16_t*>(p) = f32_to_bf16(x); return;
  }
}

// ---- bulk converters (CPU). dst and src must not overlap unless dst == src and the types
// have the same size. Any alignment is accepted. Dispatch: zero/core/cpu_features.hpp.
void convert(const void* src, DType src_type, void* dst, DType dst_type, std::size_t n);

void f32_to_bf16(const float* src, std::uint16_t* dst, std::size_t n);
void bf16_to_f32(const std::uint16_t* src, float* dst, std::size_t n);
void f32_to_f16(const float* src, std::uint16_t* dst, std::size_t n);
void f16_to_f32(const std::uint16_t* src, float* dst, std::size_t n);

}  // namespace zero
