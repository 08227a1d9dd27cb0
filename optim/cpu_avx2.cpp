// AVX2 + FMA + F16C block functions: 8 lanes per vector; the last < 8 elements of a block go
// through the scalar loop (same bits). Function-level target (no -m flags on the file).
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "optim/cpu_kernels.hpp"
#include "zero/detail/bf16_simd.hpp"

namespace zero::detail::optim {

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#ifdef __clang__  // clang ignores #pragma GCC target
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#endif
namespace avx2 {

// ---- loads and stores of 8 elements
template <DType T>
inline __m256 load8(const void* base, std::size_t i) {
  if constexpr (T == DType::kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(base) + i);
  } else {
    const __m128i h = _mm_loadu_si128(
        reinterpret_cast<const __m128i*>(static_cast<const std::uint16_t*>(base) + i));
    if constexpr (T == DType::kBF16) {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    } else {
      return _mm256_cvtph_ps(h);
    }
  }
}

// f32 -> bf16 with the rounding and NaN rule of zero::f32_to_bf16 (integer lanes).
inline __m128i to_bf16(__m256 x) {
  const __m256i r = detail::bf16_round_avx2(_mm256_castps_si256(x));
  // packus works per 128-bit lane: [r0..3 r0..3 | r4..7 r4..7]; qwords 0 and 2 hold r0..7.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  return _mm256_castsi256_si128(packed);
}

template <DType T>
inline void store8(void* base, std::size_t i, __m256 x) {
  if constexpr (T == DType::kF32) {
    _mm256_storeu_ps(static_cast<float*>(base) + i, x);
  } else {
    __m128i* p = reinterpret_cast<__m128i*>(static_cast<std::uint16_t*>(base) + i);
    if constexpr (T == DType::kBF16) {
      _mm_storeu_si128(p, to_bf16(x));
    } else {
      _mm_storeu_si128(p, _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
    }
  }
}

struct Scalars8 {
  __m256 grad_scale, beta1, one_minus_beta1, beta2, one_minus_beta2, inv_sqrt_bc2, eps, neg_step,
      l2_wd, neg_lr_wd;
  bool has_l2, has_decoupled, nesterov;
};

inline Scalars8 broadcast(const StepScalars& s) {
  return {_mm256_set1_ps(s.grad_scale),
          _mm256_set1_ps(s.beta1),
          _mm256_set1_ps(s.one_minus_beta1),
          _mm256_set1_ps(s.beta2),
          _mm256_set1_ps(s.one_minus_beta2),
          _mm256_set1_ps(s.inv_sqrt_bc2),
          _mm256_set1_ps(s.eps),
          _mm256_set1_ps(s.neg_step),
          _mm256_set1_ps(s.l2_wd),
          _mm256_set1_ps(s.neg_lr_wd),
          s.l2_wd != 0.0f,
          s.neg_lr_wd != 0.0f,
          s.nesterov};
}

// ---- the updates: mirrors of zero/detail/optim_math.hpp (no FMA)
inline __m256 grad_in(const Scalars8& s, __m256 grad, __m256 p) {
  __m256 g = _mm256_mul_ps(grad, s.grad_scale);
  if (s.has_l2) g = _mm256_add_ps(g, _mm256_mul_ps(s.l2_wd, p));
  return g;
}

inline void adam8(const Scalars8& s, __m256 grad, __m256& p, __m256& m, __m256& v) {
  const __m256 g = grad_in(s, grad, p);
  m = _mm256_add_ps(_mm256_mul_ps(s.beta1, m), _mm256_mul_ps(s.one_minus_beta1, g));
  v = _mm256_add_ps(_mm256_mul_ps(s.beta2, v),
                    _mm256_mul_ps(s.one_minus_beta2, _mm256_mul_ps(g, g)));
  const __m256 denom = _mm256_add_ps(_mm256_mul_ps(_mm256_sqrt_ps(v), s.inv_sqrt_bc2), s.eps);
  const __m256 u = _mm256_div_ps(m, denom);
  if (s.has_decoupled) p = _mm256_add_ps(p, _mm256_mul_ps(s.neg_lr_wd, p));
  p = _mm256_add_ps(p, _mm256_mul_ps(s.neg_step, u));
}

inline void sgd8(const Scalars8& s, __m256 grad, __m256& p) {
  const __m256 g = grad_in(s, grad, p);
  p = _mm256_add_ps(p, _mm256_mul_ps(s.neg_step, g));
}

inline void sgd_momentum8(const Scalars8& s, __m256 grad, __m256& p, __m256& buf) {
  const __m256 g = grad_in(s, grad, p);
  buf = _mm256_add_ps(_mm256_mul_ps(s.beta1, buf), _mm256_mul_ps(s.one_minus_beta1, g));
  const __m256 d = s.nesterov ? _mm256_add_ps(g, _mm256_mul_ps(s.beta2, buf)) : buf;
  p = _mm256_add_ps(p, _mm256_mul_ps(s.neg_step, d));
}

inline void lion8(const Scalars8& s, __m256 grad, __m256& p, __m256& m) {
  const __m256 g = _mm256_mul_ps(grad, s.grad_scale);
  const __m256 c = _mm256_add_ps(_mm256_mul_ps(s.beta1, m), _mm256_mul_ps(s.one_minus_beta1, g));
  const __m256 zero = _mm256_setzero_ps();
  __m256 sign = _mm256_mul_ps(c, zero);  // +-0 stays +-0, NaN stays NaN
  sign = _mm256_blendv_ps(sign, _mm256_set1_ps(1.0f), _mm256_cmp_ps(c, zero, _CMP_GT_OQ));
  sign = _mm256_blendv_ps(sign, _mm256_set1_ps(-1.0f), _mm256_cmp_ps(c, zero, _CMP_LT_OQ));
  if (s.has_decoupled) p = _mm256_add_ps(p, _mm256_mul_ps(s.neg_lr_wd, p));
  p = _mm256_add_ps(p, _mm256_mul_ps(s.neg_step, sign));
  m = _mm256_add_ps(_mm256_mul_ps(s.beta2, m), _mm256_mul_ps(s.one_minus_beta2, g));
}

inline void adagrad8(const Scalars8& s, __m256 grad, __m256& p, __m256& sum) {
  const __m256 g = grad_in(s, grad, p);
  sum = _mm256_add_ps(sum, _mm256_mul_ps(g, g));
  const __m256 u = _mm256_div_ps(g, _mm256_add_ps(_mm256_sqrt_ps(sum), s.eps));
  p = _mm256_add_ps(p, _mm256_mul_ps(s.neg_step, u));
}

template <Rule R, DType G, DType S, Copy C>
struct Avx2Block {
  static void run(const BlockArgs& a, std::size_t begin, std::size_t end) {
    const Scalars8 s = broadcast(a.sc);
    std::size_t i = begin;
    for (; i + 8 <= end; i += 8) {
      const __m256 g = load8<G>(a.g, i);
      __m256 p = load8<DType::kF32>(a.p, i);
      if constexpr (R == Rule::kAdam) {
        __m256 m = load8<S>(a.s0, i);
        __m256 v = load8<S>(a.s1, i);
        adam8(s, g, p, m, v);
        store8<S>(a.s0, i, m);
        store8<S>(a.s1, i, v);
      } else if constexpr (R == Rule::kSgd) {
        sgd8(s, g, p);
      } else {
        __m256 x = load8<S>(a.s0, i);
        if constexpr (R == Rule::kSgdMomentum) sgd_momentum8(s, g, p, x);
        if constexpr (R == Rule::kLion) lion8(s, g, p, x);
        if constexpr (R == Rule::kAdagrad) adagrad8(s, g, p, x);
        store8<S>(a.s0, i, x);
      }
      store8<DType::kF32>(a.p, i, p);
      if constexpr (C == Copy::kBF16) store8<DType::kBF16>(a.copy, i, p);
      if constexpr (C == Copy::kF16) store8<DType::kF16>(a.copy, i, p);
    }
    scalar_range<R, G, S, C>(a, i, end);
  }
};

// Lanes 0-3, 4-7, 8-11, 12-15 in four accumulators; the tail continues the lane pattern in
// scalar code (x*x is exact in double, so FMA and mul+add give the same bits).
template <DType G>
double sumsq8(const void* g, std::size_t begin, std::size_t end) {
  __m256d acc[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(),
                    _mm256_setzero_pd()};
  std::size_t i = begin;
  for (; i + 16 <= end; i += 16) {
    const __m256 x0 = load8<G>(g, i);
    const __m256 x1 = load8<G>(g, i + 8);
    const __m256d d[4] = {
        _mm256_cvtps_pd(_mm256_castps256_ps128(x0)), _mm256_cvtps_pd(_mm256_extractf128_ps(x0, 1)),
        _mm256_cvtps_pd(_mm256_castps256_ps128(x1)), _mm256_cvtps_pd(_mm256_extractf128_ps(x1, 1))};
    for (int k = 0; k < 4; ++k) acc[k] = _mm256_fmadd_pd(d[k], d[k], acc[k]);
  }
  alignas(32) double lane[16];
  for (int k = 0; k < 4; ++k) _mm256_store_pd(lane + 4 * k, acc[k]);
  for (; i < end; ++i) {
    const double x = load_elem<G>(g, i);
    lane[(i - begin) & 15u] += x * x;
  }
  double sum = 0.0;
  for (double l : lane) sum += l;
  return sum;
}

}  // namespace avx2
#ifdef __clang__
#pragma clang attribute pop
#endif
#pragma GCC pop_options

BlockFn select_avx2(Rule r, DType grad, DType state, Copy copy) noexcept {
  return select_block<avx2::Avx2Block>(r, grad, state, copy);
}

SumsqFn sumsq_avx2(DType grad) noexcept {
  switch (grad) {
    case DType::kF32: return &avx2::sumsq8<DType::kF32>;
    case DType::kBF16: return &avx2::sumsq8<DType::kBF16>;
    case DType::kF16: return &avx2::sumsq8<DType::kF16>;
  }
  return nullptr;
}

}  // namespace zero::detail::optim
