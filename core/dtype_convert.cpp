// Bulk f32 <-> bf16 / f16 converters: scalar, AVX2 + F16C and AVX-512 (+ AVX512_BF16) paths,
// each bitwise equal to the scalar functions in zero/core/dtype.hpp.
#include <immintrin.h>

// GCC 12's AVX-512 intrinsic headers start masked loads from an undefined vector and warn about
// it under -Wmaybe-uninitialized; the lanes in question are masked off.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <cstring>
#include <string>

#include "zero/core/detail/bf16_simd.hpp"
#include "zero/core/detail/dtype_convert.hpp"
#include "zero/core/dtype.hpp"
#include "zero/core/error.hpp"

namespace zero {

std::string_view to_string(DType t) noexcept {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
  }
  return "unknown";
}

DType parse_dtype(std::string_view name) {
  if (name == "f32" || name == "fp32" || name == "float32" || name == "float") return DType::kF32;
  if (name == "f16" || name == "fp16" || name == "float16" || name == "half") return DType::kF16;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  ZERO_THROW(kInvalidArgument, "unknown dtype '", std::string(name),
             "' (expected f32, f16 or bf16)");
}

namespace {

using detail::bf16_round_avx2;
using detail::bf16_round_avx512;

// ---- scalar
void f32_to_bf16_scalar(const float* s, std::uint16_t* d, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(s[i]);
}
void bf16_to_f32_scalar(const std::uint16_t* s, float* d, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) d[i] = bf16_to_f32(s[i]);
}
void f32_to_f16_scalar(const float* s, std::uint16_t* d, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) d[i] = f32_to_f16(s[i]);
}
void f16_to_f32_scalar(const std::uint16_t* s, float* d, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) d[i] = f16_to_f32(s[i]);
}

// ---- AVX2 + F16C
#define ZERO_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))

ZERO_TARGET_AVX2 void f32_to_bf16_avx2(const float* s, std::uint16_t* d, std::size_t n) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i a = bf16_round_avx2(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i)));
    const __m256i b =
        bf16_round_avx2(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 8)));
    // packus works per 128-bit lane: fix the order with a cross-lane permute.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), packed);
  }
  f32_to_bf16_scalar(s + i, d + i, n - i);
}

ZERO_TARGET_AVX2 void bf16_to_f32_avx2(const std::uint16_t* s, float* d, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i w =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), _mm256_slli_epi32(w, 16));
  }
  bf16_to_f32_scalar(s + i, d + i, n - i);
}

ZERO_TARGET_AVX2 void f32_to_f16_avx2(const float* s, std::uint16_t* d, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), h);
  }
  f32_to_f16_scalar(s + i, d + i, n - i);
}

ZERO_TARGET_AVX2 void f16_to_f32_avx2(const std::uint16_t* s, float* d, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(d + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
  }
  f16_to_f32_scalar(s + i, d + i, n - i);
}

// ---- AVX-512 (tails through masked loads/stores, no scalar remainder)
#define ZERO_TARGET_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define ZERO_TARGET_AVX512BF16 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")))

ZERO_TARGET_AVX512 inline __mmask16 tail_mask(std::size_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1u);
}

// Without AVX512_BF16: integer rounding.
ZERO_TARGET_AVX512 void f32_to_bf16_avx512(const float* s, std::uint16_t* d, std::size_t n) {
  for (std::size_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    const __m512i u = _mm512_maskz_loadu_epi32(m, s + i);
    _mm256_mask_storeu_epi16(d + i, m, _mm512_cvtepi32_epi16(bf16_round_avx512(u)));
  }
}

// With AVX512_BF16: vcvtneps2bf16 rounds to nearest even and quiets NaNs exactly like the scalar
// function, but treats subnormal inputs as zero; those lanes (rare) are redone in integers.
ZERO_TARGET_AVX512BF16 void f32_to_bf16_avx512bf16(const float* s, std::uint16_t* d,
                                                   std::size_t n) {
  const __m512i exp_mask = _mm512_set1_epi32(0x7f800000);
  const __m512i mant_mask = _mm512_set1_epi32(0x007fffff);
  for (std::size_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    const __m512i u = _mm512_maskz_loadu_epi32(m, s + i);
    __m256i h = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_castsi512_ps(u)));
    const __mmask16 zero_exp = _mm512_testn_epi32_mask(u, exp_mask);
    const __mmask16 subnormal = _mm512_mask_test_epi32_mask(zero_exp, u, mant_mask);
    if (subnormal != 0) [[unlikely]] {
      h = _mm256_mask_blend_epi16(subnormal, h, _mm512_cvtepi32_epi16(bf16_round_avx512(u)));
    }
    _mm256_mask_storeu_epi16(d + i, m, h);
  }
}

ZERO_TARGET_AVX512 void bf16_to_f32_avx512(const std::uint16_t* s, float* d, std::size_t n) {
  for (std::size_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, s + i));
    _mm512_mask_storeu_epi32(d + i, m, _mm512_slli_epi32(w, 16));
  }
}

ZERO_TARGET_AVX512 void f32_to_f16_avx512(const float* s, std::uint16_t* d, std::size_t n) {
  for (std::size_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    const __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, s + i), _MM_FROUND_TO_NEAREST_INT);
    _mm256_mask_storeu_epi16(d + i, m, h);
  }
}

ZERO_TARGET_AVX512 void f16_to_f32_avx512(const std::uint16_t* s, float* d, std::size_t n) {
  for (std::size_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(d + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, s + i)));
  }
}

void require(Isa isa) {
  ZERO_CHECK(isa_supported(isa), kInvalidArgument, "ISA ", to_string(isa),
             " is not supported by this CPU");
}

}  // namespace

namespace detail {

void f32_to_bf16(Isa isa, const float* src, std::uint16_t* dst, std::size_t n) {
  require(isa);
  switch (isa) {
    case Isa::kAvx512:
      if (cpu_features().avx512_bf16) return f32_to_bf16_avx512bf16(src, dst, n);
      return f32_to_bf16_avx512(src, dst, n);
    case Isa::kAvx2: return f32_to_bf16_avx2(src, dst, n);
    case Isa::kScalar: return f32_to_bf16_scalar(src, dst, n);
  }
}
void bf16_to_f32(Isa isa, const std::uint16_t* src, float* dst, std::size_t n) {
  require(isa);
  switch (isa) {
    case Isa::kAvx512: return bf16_to_f32_avx512(src, dst, n);
    case Isa::kAvx2: return bf16_to_f32_avx2(src, dst, n);
    case Isa::kScalar: return bf16_to_f32_scalar(src, dst, n);
  }
}
void f32_to_f16(Isa isa, const float* src, std::uint16_t* dst, std::size_t n) {
  require(isa);
  switch (isa) {
    case Isa::kAvx512: return f32_to_f16_avx512(src, dst, n);
    case Isa::kAvx2: return f32_to_f16_avx2(src, dst, n);
    case Isa::kScalar: return f32_to_f16_scalar(src, dst, n);
  }
}
void f16_to_f32(Isa isa, const std::uint16_t* src, float* dst, std::size_t n) {
  require(isa);
  switch (isa) {
    case Isa::kAvx512: return f16_to_f32_avx512(src, dst, n);
    case Isa::kAvx2: return f16_to_f32_avx2(src, dst, n);
    case Isa::kScalar: return f16_to_f32_scalar(src, dst, n);
  }
}

}  // namespace detail

void f32_to_bf16(const float* src, std::uint16_t* dst, std::size_t n) {
  detail::f32_to_bf16(best_isa(), src, dst, n);
}
void bf16_to_f32(const std::uint16_t* src, float* dst, std::size_t n) {
  detail::bf16_to_f32(best_isa(), src, dst, n);
}
void f32_to_f16(const float* src, std::uint16_t* dst, std::size_t n) {
  detail::f32_to_f16(best_isa(), src, dst, n);
}
void f16_to_f32(const std::uint16_t* src, float* dst, std::size_t n) {
  detail::f16_to_f32(best_isa(), src, dst, n);
}

void convert(const void* src, DType src_type, void* dst, DType dst_type, std::size_t n) {
  if (n == 0) return;
  ZERO_CHECK(src != nullptr && dst != nullptr, kInvalidArgument, "convert: null pointer for ", n,
             " elements");
  if (src_type == dst_type) {
    if (src != dst) std::memmove(dst, src, n * dtype_size(src_type));
    return;
  }
  const auto* s16 = static_cast<const std::uint16_t*>(src);
  auto* d16 = static_cast<std::uint16_t*>(dst);
  const auto* s32 = static_cast<const float*>(src);
  auto* d32 = static_cast<float*>(dst);
  if (src_type == DType::kF32) {
    return dst_type == DType::kBF16 ? f32_to_bf16(s32, d16, n) : f32_to_f16(s32, d16, n);
  }
  if (dst_type == DType::kF32) {
    return src_type == DType::kBF16 ? bf16_to_f32(s16, d32, n) : f16_to_f32(s16, d32, n);
  }
  // f16 <-> bf16 through f32 in cache-sized blocks (two roundings are exact here: every f16 and
  // bf16 value is an f32, so the only rounding is the final one).
  constexpr std::size_t kBlock = 1024;
  float tmp[kBlock];
  for (std::size_t i = 0; i < n; i += kBlock) {
    const std::size_t m = n - i < kBlock ? n - i : kBlock;
    if (src_type == DType::kF16) {
      f16_to_f32(s16 + i, tmp, m);
      f32_to_bf16(tmp, d16 + i, m);
    } else {
      bf16_to_f32(s16 + i, tmp, m);
      f32_to_f16(tmp, d16 + i, m);
    }
  }
}

}  // namespace zero
