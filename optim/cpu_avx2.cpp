// AVX2 + FMA + F16C block functions: 8 lanes per vector; the last < 8 elements of a block go
// through the scalar loop (same bits). Function-level target (no -m flags on the file).
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "optim/cpu_kernels.hpp"
#include "zero/core/detail/bf16_simd.hpp"

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

// ---- the updates: mirrors of zero/optim/detail/optim_math.hpp (vfmadd exactly where it calls
// fma()) kScaled: grad_scale != 1. The block loops are versioned on it (a template argument, not a
// per-vector test), so a step without loss scaling or clipping runs no multiply for it.
template <bool kScaled>
inline __m256 scaled_grad(const Scalars8& s, __m256 grad) {
  if constexpr (kScaled) {
    return _mm256_mul_ps(grad, s.grad_scale);
  } else {
    return grad;
  }
}

template <bool kScaled>
inline __m256 grad_in(const Scalars8& s, __m256 grad, __m256 p) {
  const __m256 g = scaled_grad<kScaled>(s, grad);
  return s.has_l2 ? _mm256_fmadd_ps(s.l2_wd, p, g) : g;
}

template <bool kScaled>
inline void adam8(const Scalars8& s, __m256 grad, __m256& p, __m256& m, __m256& v) {
  const __m256 g = grad_in<kScaled>(s, grad, p);
  m = _mm256_fmadd_ps(s.one_minus_beta1, g, _mm256_mul_ps(s.beta1, m));
  v = _mm256_fmadd_ps(s.one_minus_beta2, _mm256_mul_ps(g, g), _mm256_mul_ps(s.beta2, v));
  const __m256 denom = _mm256_fmadd_ps(_mm256_sqrt_ps(v), s.inv_sqrt_bc2, s.eps);
  const __m256 u = _mm256_div_ps(m, denom);
  if (s.has_decoupled) p = _mm256_fmadd_ps(s.neg_lr_wd, p, p);
  p = _mm256_fmadd_ps(s.neg_step, u, p);
}

template <bool kScaled>
inline void sgd8(const Scalars8& s, __m256 grad, __m256& p) {
  p = _mm256_fmadd_ps(s.neg_step, grad_in<kScaled>(s, grad, p), p);
}

template <bool kScaled>
inline void sgd_momentum8(const Scalars8& s, __m256 grad, __m256& p, __m256& buf) {
  const __m256 g = grad_in<kScaled>(s, grad, p);
  buf = _mm256_fmadd_ps(s.one_minus_beta1, g, _mm256_mul_ps(s.beta1, buf));
  const __m256 d = s.nesterov ? _mm256_fmadd_ps(s.beta2, buf, g) : buf;
  p = _mm256_fmadd_ps(s.neg_step, d, p);
}

template <bool kScaled>
inline void lion8(const Scalars8& s, __m256 grad, __m256& p, __m256& m) {
  const __m256 g = scaled_grad<kScaled>(s, grad);
  const __m256 c = _mm256_fmadd_ps(s.one_minus_beta1, g, _mm256_mul_ps(s.beta1, m));
  const __m256 zero = _mm256_setzero_ps();
  __m256 sign = _mm256_mul_ps(c, zero);  // +-0 stays +-0, NaN stays NaN
  sign = _mm256_blendv_ps(sign, _mm256_set1_ps(1.0f), _mm256_cmp_ps(c, zero, _CMP_GT_OQ));
  sign = _mm256_blendv_ps(sign, _mm256_set1_ps(-1.0f), _mm256_cmp_ps(c, zero, _CMP_LT_OQ));
  if (s.has_decoupled) p = _mm256_fmadd_ps(s.neg_lr_wd, p, p);
  p = _mm256_fmadd_ps(s.neg_step, sign, p);
  m = _mm256_fmadd_ps(s.one_minus_beta2, g, _mm256_mul_ps(s.beta2, m));
}

template <bool kScaled>
inline void adagrad8(const Scalars8& s, __m256 grad, __m256& p, __m256& sum) {
  const __m256 g = grad_in<kScaled>(s, grad, p);
  sum = _mm256_fmadd_ps(g, g, sum);
  const __m256 u = _mm256_div_ps(g, _mm256_add_ps(_mm256_sqrt_ps(sum), s.eps));
  p = _mm256_fmadd_ps(s.neg_step, u, p);
}

template <Rule R, DType G, DType S, Copy C>
struct Avx2Block {
  static void run(const BlockArgs& a, std::size_t begin, std::size_t end) {
    const std::size_t i = a.sc.grad_scale != 1.0f ? run_scaled<true>(a, begin, end)
                                                  : run_scaled<false>(a, begin, end);
    scalar_range<R, G, S, C>(a, i, end);
  }

  // Full vectors of [begin, end); returns where they end. args is copied to a local: the stores
  // through its pointers cannot change a local whose address stays here, so the pointers stay in
  // registers instead of being reloaded per vector.
  template <bool kScaled>
  static std::size_t run_scaled(const BlockArgs& args, std::size_t begin, std::size_t end) {
    const BlockArgs a = args;
    const Scalars8 s = broadcast(a.sc);
    std::size_t i = begin;
    for (; i + 8 <= end; i += 8) body<kScaled>(a, s, i);
    return i;
  }

  template <bool kScaled>
  static inline void body(const BlockArgs& a, const Scalars8& s, std::size_t i) {
    const __m256 g = load8<G>(a.g, i);
    __m256 p = load8<DType::kF32>(a.p, i);
    if constexpr (R == Rule::kAdam) {
      __m256 m = load8<S>(a.s0, i);
      __m256 v = load8<S>(a.s1, i);
      adam8<kScaled>(s, g, p, m, v);
      store8<S>(a.s0, i, m);
      store8<S>(a.s1, i, v);
    } else if constexpr (R == Rule::kSgd) {
      sgd8<kScaled>(s, g, p);
    } else {
      __m256 x = load8<S>(a.s0, i);
      if constexpr (R == Rule::kSgdMomentum) sgd_momentum8<kScaled>(s, g, p, x);
      if constexpr (R == Rule::kLion) lion8<kScaled>(s, g, p, x);
      if constexpr (R == Rule::kAdagrad) adagrad8<kScaled>(s, g, p, x);
      store8<S>(a.s0, i, x);
    }
    store8<DType::kF32>(a.p, i, p);
    if constexpr (C == Copy::kBF16) store8<DType::kBF16>(a.copy, i, p);
    if constexpr (C == Copy::kF16) store8<DType::kF16>(a.copy, i, p);
  }
};

// ---- int8 moments (zero/optim/detail/moment_quant.hpp; the walk over blocks: q8_blocks). Spans
// and blocks are done 8 lanes at a time; the last < 8 elements of each through the scalar kernel's
// element code (the same bits).

inline __m256 m_dequant8(const std::uint8_t* codes, __m256 absmax) {
  const __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes)));
  const __m256i mag = _mm256_i32gather_epi32(reinterpret_cast<const int*>(kMomentCodes.m),
                                             _mm256_and_si256(c, _mm256_set1_epi32(0x7f)), 4);
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x80)), 24);
  return _mm256_mul_ps(_mm256_castsi256_ps(_mm256_or_si256(mag, sign)), absmax);
}
inline __m256 v_dequant8(const std::uint8_t* codes, __m256 absmax) {
  const __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes)));
  return _mm256_mul_ps(_mm256_i32gather_ps(kMomentCodes.v, c, 4), absmax);
}

// magnitude_code() per lane: the region by comparing with each decade top, then
// base + RNE((y - lo) * inv_step), the top code above 2 and for NaN.
inline __m256i magnitude_code8(const MomentRegions& r, __m256 y) {
  __m256i k = _mm256_setzero_si256();
  for (int d = 1; d < r.count; ++d) {
    // All ones (-1) where hi_d >= y: subtracting counts it.
    k = _mm256_sub_epi32(
        k, _mm256_castps_si256(_mm256_cmp_ps(_mm256_set1_ps(r.hi[d]), y, _CMP_GE_OQ)));
  }
  const __m256 lo = _mm256_permutevar8x32_ps(_mm256_loadu_ps(r.lo), k);
  const __m256 inv = _mm256_permutevar8x32_ps(_mm256_loadu_ps(r.inv_step), k);
  const __m256i base =
      _mm256_permutevar8x32_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(r.base)), k);
  const __m256 x = _mm256_mul_ps(_mm256_sub_ps(y, lo), inv);
  __m256i j = _mm256_add_epi32(
      base, _mm256_cvttps_epi32(_mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
  j = _mm256_min_epi32(j, _mm256_set1_epi32(r.top));
  const __m256 ok = _mm256_cmp_ps(y, _mm256_set1_ps(2.0f), _CMP_LE_OQ);
  return _mm256_blendv_epi8(_mm256_set1_epi32(r.top), j, _mm256_castps_si256(ok));
}

// The low byte of each 32-bit lane, 8 bytes stored at p.
inline void store_bytes8(std::uint8_t* p, __m256i x) {
  const __m256i pick =
      _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1,
                       -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i t = _mm256_shuffle_epi8(x, pick);
  const __m128i lo = _mm256_castsi256_si128(t), hi = _mm256_extracti128_si256(t, 1);
  _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_unpacklo_epi32(lo, hi));
}

// MomentAcc lanes: 0-7 the vector lanes, 8 the scalar tails'.
template <DType G, Copy C>
struct Avx2Q8 {
  static void span(const BlockArgs& a, const StepScalars& sc, std::size_t lo, std::size_t hi,
                   std::size_t c0, float am, float av, const std::uint8_t* cm,
                   const std::uint8_t* cv, MomentScratch& scr, MomentAcc& acc) {
    const Scalars8 s = broadcast(sc);
    const __m256 vam = _mm256_set1_ps(am), vav = _mm256_set1_ps(av);
    const __m256i abs = _mm256_set1_epi32(0x7fffffff);
    __m256i acc_m = _mm256_load_si256(reinterpret_cast<const __m256i*>(acc.m));
    __m256i acc_v = _mm256_load_si256(reinterpret_cast<const __m256i*>(acc.v));
    std::size_t i = lo;
    for (; i + 8 <= hi; i += 8) {
      const std::size_t j = i - c0;
      const __m256 g = load8<G>(a.g, i);
      __m256 p = load8<DType::kF32>(a.p, i);
      __m256 m = m_dequant8(cm + j, vam);
      __m256 v = v_dequant8(cv + j, vav);
      adam8<true>(s, g, p, m, v);  // not versioned: x * 1 gives the same bits when grad_scale is 1
      store8<DType::kF32>(a.p, i, p);
      if constexpr (C == Copy::kBF16) store8<DType::kBF16>(a.copy, i, p);
      if constexpr (C == Copy::kF16) store8<DType::kF16>(a.copy, i, p);
      _mm256_storeu_ps(scr.m + j, m);
      _mm256_storeu_ps(scr.v + j, v);
      acc_m = _mm256_max_epu32(acc_m, _mm256_and_si256(_mm256_castps_si256(m), abs));
      acc_v = _mm256_max_epu32(acc_v, _mm256_and_si256(_mm256_castps_si256(v), abs));
    }
    _mm256_store_si256(reinterpret_cast<__m256i*>(acc.m), acc_m);
    _mm256_store_si256(reinterpret_cast<__m256i*>(acc.v), acc_v);
    if (i == hi) return;
    // The tail accumulates in lane 8 (the scalar kernel's lane 0 of a shifted view).
    MomentAcc tail{};
    tail.m[0] = acc.m[8];
    tail.v[0] = acc.v[8];
    ScalarQ8<G, C>::span(a, sc, i, hi, c0, am, av, cm, cv, scr, tail);
    acc.m[8] = tail.m[0];
    acc.v[8] = tail.v[0];
  }

  static std::uint32_t reduce_max(const std::uint32_t* lane) {
    std::uint32_t r = 0;
    for (int l = 0; l < 9; ++l) r = lane[l] > r ? lane[l] : r;
    return r;
  }

  static void finish(const BlockArgs&, std::size_t c0, std::size_t c1, std::uint8_t* rec_m,
                     std::uint8_t* rec_v, const MomentScratch& scr, const MomentAcc& acc) {
    const std::uint32_t amax_m = reduce_max(acc.m);
    const std::uint32_t amax_v = reduce_max(acc.v);
    store_absmax(rec_m, amax_m);
    store_absmax(rec_v, amax_v);
    const BlockNorm nm = block_norm(amax_m), nv = block_norm(amax_v);
    const __m256 pre_m = _mm256_set1_ps(nm.pre), inv_m = _mm256_set1_ps(nm.inv);
    const __m256 pre_v = _mm256_set1_ps(nv.pre), inv_v = _mm256_set1_ps(nv.inv);
    const __m256i abs = _mm256_set1_epi32(0x7fffffff);
    const std::size_t n = c1 - c0;
    std::size_t j = 0;
    for (; j + 8 <= n; j += 8) {
      const __m256i um = _mm256_castps_si256(
          _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(scr.m + j), pre_m), inv_m));
      const __m256i uv = _mm256_castps_si256(
          _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(scr.v + j), pre_v), inv_v));
      __m256i qm = magnitude_code8(kMomentCodes.mr, _mm256_castsi256_ps(_mm256_and_si256(um, abs)));
      qm =
          _mm256_or_si256(qm, _mm256_and_si256(_mm256_srli_epi32(um, 24), _mm256_set1_epi32(0x80)));
      const __m256i qv =
          magnitude_code8(kMomentCodes.vr, _mm256_castsi256_ps(_mm256_and_si256(uv, abs)));
      store_bytes8(rec_m + 4 + j, qm);
      store_bytes8(rec_v + 4 + j, qv);
    }
    const MomentCodes& k = kMomentCodes;
    for (; j < n; ++j) {
      rec_m[4 + j] = m_code(k, normalise(nm, scr.m[j]));
      rec_v[4 + j] = v_code(k, normalise(nv, scr.v[j]));
    }
  }
};

template <DType G, Copy C>
struct Avx2Q8Block {
  static void run(const BlockArgs& a, std::size_t begin, std::size_t end) {
    q8_blocks<Avx2Q8<G, C>>(a, begin, end);
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

BlockFn select_q8_avx2(DType grad, Copy copy) noexcept {
  return select_q8<avx2::Avx2Q8Block>(grad, copy);
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
