// zero/core/detail/bf16_simd.hpp — f32 -> bf16 rounding in SIMD integer lanes: the rule of
// zero::f32_to_bf16 (round to nearest even; NaN keeps sign and top payload, made quiet) for
// 8 (AVX2) or 16 (AVX-512) lanes. Each lane holds the bf16 result in its low 16 bits.
//
// Shared by the bulk converters (core/dtype_convert.cpp) and the CPU optimizers' 16-bit
// parameter copy (optim/). The functions carry their own target attributes and internal
// linkage, so every translation unit gets its own copy and none leaks an AVX-512 instruction
// into baseline code through the one-definition rule.
//
// Thread safety: pure functions.
#pragma once

#include <immintrin.h>

namespace zero::detail {
namespace {

__attribute__((target("avx2"))) inline __m256i bf16_round_avx2(__m256i u) {
  const __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
  const __m256i is_nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  return _mm256_blendv_epi8(rounded, quiet, is_nan);
}

__attribute__((target("avx512f"))) inline __m512i bf16_round_avx512(__m512i u) {
  const __m512i abs = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
  const __mmask16 is_nan = _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(0x7f800000));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  return _mm512_mask_blend_epi32(is_nan, rounded, quiet);
}

}  // namespace
}  // namespace zero::detail
