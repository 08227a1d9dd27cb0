// AVX-512 loops of block-wise int8 quantization (see device/quantize_kernels.hpp): the same
// f32 operations as the shared per-element math, 16 lanes at a time, the tail through the scalar
// functions. Function-level targets (no -m flags on the file), as optim/cpu_avx512.cpp.
#include <immintrin.h>

// GCC 12's AVX-512 intrinsic headers start masked operations from an undefined vector and warn
// about it under -Wmaybe-uninitialized (as in optim/cpu_avx512.cpp); those lanes are masked off.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <cstddef>
#include <cstdint>
#include <limits>

#include "device/quantize_kernels.hpp"
#include "zero/device/detail/quantize_math.hpp"

namespace zero::detail::quant {

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")
#ifdef __clang__  // clang ignores #pragma GCC target
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"))), \
                             apply_to = function)
#endif
namespace avx512 {

BlockMax block_max(const float* x, std::size_t n) {
  const __m512 max_finite = _mm512_set1_ps(std::numeric_limits<float>::max());
  __m512 m = _mm512_setzero_ps();
  __mmask16 finite = 0xffff;
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 a = _mm512_abs_ps(_mm512_loadu_ps(x + i));
    finite &= _mm512_cmp_ps_mask(a, max_finite, _CMP_LE_OQ);  // false for Inf and NaN
    m = _mm512_max_ps(m, a);
  }
  BlockMax r{_mm512_reduce_max_ps(m), finite == 0xffff};
  const BlockMax tail = scalar::block_max(x + i, n - i);
  r.absmax = tail.absmax > r.absmax ? tail.absmax : r.absmax;
  r.finite = r.finite && tail.finite;
  return r;
}

void quantize(const float* x, std::size_t n, float inverse, std::int8_t* q) {
  const __m512 inv = _mm512_set1_ps(inverse), magic = _mm512_set1_ps(kRoundMagic);
  const __m512i hi = _mm512_set1_epi32(127), lo = _mm512_set1_epi32(-127);
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    // (x * inverse + magic) - magic: half to even, exactly as quantize_one; the result is an
    // integer, so the conversion is exact.
    const __m512 r =
        _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), inv), magic), magic);
    const __m512i v = _mm512_max_epi32(_mm512_min_epi32(_mm512_cvttps_epi32(r), hi), lo);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), _mm512_cvtsepi32_epi8(v));
  }
  scalar::quantize(x + i, n - i, inverse, q + i);
}

void dequantize(const std::int8_t* q, std::size_t n, float scale, float* out, bool add) {
  const __m512 s = _mm512_set1_ps(scale);
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + i));
    const __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), s);
    _mm512_storeu_ps(out + i, add ? _mm512_add_ps(_mm512_loadu_ps(out + i), v) : v);
  }
  scalar::dequantize(q + i, n - i, scale, out + i, add);
}

}  // namespace avx512
#ifdef __clang__
#pragma clang attribute pop
#endif
#pragma GCC pop_options

}  // namespace zero::detail::quant
