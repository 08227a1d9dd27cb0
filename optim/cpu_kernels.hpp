// optim/cpu_kernels.hpp — the block functions behind CpuOptimizer, one set per ISA (private).
//
// A block function applies one rule to elements [begin, end) of a shard. Each ISA file
// (cpu_scalar.cpp, cpu_avx2.cpp, cpu_avx512.cpp) instantiates one per (rule, gradient dtype,
// state dtype, copy dtype) and hands it out through its select_*() function; CpuOptimizer picks
// the ISA once and splits the shard over oneTBB. Element loops for the scalar path (and the
// AVX2 tails) are the templates below, built on the shared per-element functions.
//
// int8 Adam moments (zero/optim/detail/moment_quant.hpp) have block functions of their own, one set
// per ISA (select_q8_*): they walk the quantization blocks of [begin, end) with q8_blocks() below,
// which cuts each block at the parameter-group runs the shard was given (each run with its own
// StepScalars) and hands the pieces to the ISA's kernel: span() updates elements, keeps the new
// moments in a block-sized scratch and their absmax; finish() quantizes the block.
//
// Thread safety: block functions touch only [begin, end) of the arrays they are given.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zero/core/dtype.hpp"
#include "zero/optim/detail/moment_quant.hpp"
#include "zero/optim/detail/optim_math.hpp"

namespace zero::detail::optim {

enum class Copy : std::uint8_t { kNone, kBF16, kF16 };

struct BlockArgs {
  float* p = nullptr;       // master
  void* copy = nullptr;     // 16-bit copy or null
  const void* g = nullptr;  // gradients
  void* s0 = nullptr;       // state 0 (Adam m, SGD momentum buffer, Lion m, Adagrad sum)
  void* s1 = nullptr;       // state 1 (Adam v)
  StepScalars sc;
  // Write the 16-bit copy with non-temporal stores (AVX-512 path, where 32-byte aligned). Set for
  // shards far larger than the cache: the copy is write-only here, and a normal store would
  // first read each line (32 B of traffic per element instead of 30).
  bool stream_copy = false;
  // int8 moments: the shard's runs, tiling [0, count) in order; run r ends at runs[r].end and
  // is stepped with runs[r].sc (sc above is unused). s0 / s1 are the m / v records.
  const struct MomentRun* runs = nullptr;
  std::size_t num_runs = 0;
};

struct MomentRun {
  std::size_t end = 0;
  StepScalars sc;
};

using BlockFn = void (*)(const BlockArgs& a, std::size_t begin, std::size_t end);
// Sum of squares of grad[begin, end) in double, accumulated in 16 lanes (element i goes to lane
// (i - begin) % 16) and the lanes summed in order 0..15: the same bits on every ISA.
// REQUIRES: begin is where the caller's lane pattern starts (block starts).
using SumsqFn = double (*)(const void* g, std::size_t begin, std::size_t end);

// nullptr when the combination is not supported by that path (the caller falls back).
BlockFn select_scalar(Rule r, DType grad, DType state, Copy copy) noexcept;
BlockFn select_avx2(Rule r, DType grad, DType state, Copy copy) noexcept;
BlockFn select_avx512(Rule r, DType grad, DType state, Copy copy, bool native_bf16) noexcept;
// int8-moment Adam: [begin, end) starts on a quantization block and ends on one or at the
// shard's end.
BlockFn select_q8_scalar(DType grad, Copy copy) noexcept;
BlockFn select_q8_avx2(DType grad, Copy copy) noexcept;
BlockFn select_q8_avx512(DType grad, Copy copy, bool native_bf16) noexcept;
SumsqFn sumsq_scalar(DType grad) noexcept;
SumsqFn sumsq_avx2(DType grad) noexcept;
SumsqFn sumsq_avx512(DType grad) noexcept;

// ---- scalar element loops (shared by the scalar path and the AVX2 tails)
template <DType T>
inline float load_elem(const void* base, std::size_t i) {
  if constexpr (T == DType::kF32) {
    return static_cast<const float*>(base)[i];
  } else if constexpr (T == DType::kBF16) {
    return bf16_to_f32(static_cast<const std::uint16_t*>(base)[i]);
  } else {
    return f16_to_f32(static_cast<const std::uint16_t*>(base)[i]);
  }
}

template <DType T>
inline void store_elem(void* base, std::size_t i, float x) {
  if constexpr (T == DType::kF32) {
    static_cast<float*>(base)[i] = x;
  } else if constexpr (T == DType::kBF16) {
    static_cast<std::uint16_t*>(base)[i] = f32_to_bf16(x);
  } else {
    static_cast<std::uint16_t*>(base)[i] = f32_to_f16(x);
  }
}

template <Copy C>
inline void store_copy(void* base, std::size_t i, float x) {
  if constexpr (C == Copy::kBF16) {
    static_cast<std::uint16_t*>(base)[i] = f32_to_bf16(x);
  } else if constexpr (C == Copy::kF16) {
    static_cast<std::uint16_t*>(base)[i] = f32_to_f16(x);
  }
}

template <Rule R, DType G, DType S, Copy C>
void scalar_range(const BlockArgs& a, std::size_t begin, std::size_t end) {
  const StepScalars s = a.sc;
  for (std::size_t i = begin; i < end; ++i) {
    const float g = load_elem<G>(a.g, i);
    float p = a.p[i];
    if constexpr (R == Rule::kAdam) {
      float m = load_elem<S>(a.s0, i);
      float v = load_elem<S>(a.s1, i);
      adam_update(s, g, p, m, v);
      store_elem<S>(a.s0, i, m);
      store_elem<S>(a.s1, i, v);
    } else if constexpr (R == Rule::kSgd) {
      sgd_update(s, g, p);
    } else {
      float x = load_elem<S>(a.s0, i);
      if constexpr (R == Rule::kSgdMomentum) sgd_momentum_update(s, g, p, x);
      if constexpr (R == Rule::kLion) lion_update(s, g, p, x);
      if constexpr (R == Rule::kAdagrad) adagrad_update(s, g, p, x);
      store_elem<S>(a.s0, i, x);
    }
    a.p[i] = p;
    store_copy<C>(a.copy, i, p);
  }
}

template <DType G>
double scalar_sumsq(const void* g, std::size_t begin, std::size_t end) {
  double lane[16] = {};
  for (std::size_t i = begin; i < end; ++i) {
    const double x = load_elem<G>(g, i);
    lane[(i - begin) & 15u] += x * x;
  }
  double sum = 0.0;
  for (double l : lane) sum += l;
  return sum;
}

// ---- int8 moments: the walk over quantization blocks, shared by every ISA

// Where a block's new moments wait between span() and finish().
struct MomentScratch {
  alignas(64) float m[kMomentBlock];
  alignas(64) float v[kMomentBlock];
};
// The block's absmax so far, as |value| bits, per lane (scalar: lane 0; AVX2: 0-7; AVX-512:
// 0-15). Plain data: the walk below is baseline code and only passes it on.
struct MomentAcc {
  alignas(64) std::uint32_t m[16];
  alignas(64) std::uint32_t v[16];
};

// K provides (all indices are shard elements; c0 the block's first; acc zeroed per block):
//   K::span(a, sc, lo, hi, c0, am, av, cm, cv, scratch, acc)  elements [lo, hi) of the block,
//       old absmax am / av, codes cm / cv (the block's, indexed from c0)
//   K::finish(a, c0, c1, rec_m, rec_v, scratch, acc)          quantize the block, write records
template <class K>
void q8_blocks(const BlockArgs& a, std::size_t begin, std::size_t end) {
  // The run holding `begin`: the first whose end is past it.
  std::size_t lo_r = 0, hi_r = a.num_runs;
  while (lo_r < hi_r) {
    const std::size_t mid = (lo_r + hi_r) / 2;
    if (a.runs[mid].end <= begin) {
      lo_r = mid + 1;
    } else {
      hi_r = mid;
    }
  }
  std::size_t r = lo_r;
  MomentScratch scratch;
  auto* s0 = static_cast<std::uint8_t*>(a.s0);
  auto* s1 = static_cast<std::uint8_t*>(a.s1);
  for (std::size_t c0 = begin; c0 < end; c0 += kMomentBlock) {
    const std::size_t c1 = c0 + kMomentBlock < end ? c0 + kMomentBlock : end;
    std::uint8_t* rec_m = s0 + (c0 / kMomentBlock) * kMomentRecord;
    std::uint8_t* rec_v = s1 + (c0 / kMomentBlock) * kMomentRecord;
    const float am = load_absmax(rec_m), av = load_absmax(rec_v);
    MomentAcc acc{};
    for (std::size_t lo = c0; lo < c1;) {
      const std::size_t run_end = a.runs[r].end;
      const std::size_t hi = run_end < c1 ? run_end : c1;
      K::span(a, a.runs[r].sc, lo, hi, c0, am, av, rec_m + 4, rec_v + 4, scratch, acc);
      lo = hi;
      if (hi == run_end) ++r;
    }
    K::finish(a, c0, c1, rec_m, rec_v, scratch, acc);
  }
}

// The scalar kernel: the shared per-element functions, the reference the SIMD kernels match.
template <DType G, Copy C>
struct ScalarQ8 {
  static void span(const BlockArgs& a, const StepScalars& sc, std::size_t lo, std::size_t hi,
                   std::size_t c0, float am, float av, const std::uint8_t* cm,
                   const std::uint8_t* cv, MomentScratch& s, MomentAcc& acc) {
    const MomentCodes& k = kMomentCodes;
    std::uint32_t am_bits = acc.m[0], av_bits = acc.v[0];
    for (std::size_t i = lo; i < hi; ++i) {
      float m = m_value(k, cm[i - c0], am);
      float v = v_value(k, cv[i - c0], av);
      float p = a.p[i];
      adam_update(sc, load_elem<G>(a.g, i), p, m, v);
      a.p[i] = p;
      store_copy<C>(a.copy, i, p);
      s.m[i - c0] = m;
      s.v[i - c0] = v;
      const std::uint32_t bm = abs_bits(m), bv = abs_bits(v);
      am_bits = bm > am_bits ? bm : am_bits;
      av_bits = bv > av_bits ? bv : av_bits;
    }
    acc.m[0] = am_bits;
    acc.v[0] = av_bits;
  }
  static void finish(const BlockArgs&, std::size_t c0, std::size_t c1, std::uint8_t* rec_m,
                     std::uint8_t* rec_v, const MomentScratch& s, const MomentAcc& acc) {
    const MomentCodes& k = kMomentCodes;
    store_absmax(rec_m, acc.m[0]);
    store_absmax(rec_v, acc.v[0]);
    const BlockNorm nm = block_norm(acc.m[0]), nv = block_norm(acc.v[0]);
    for (std::size_t j = 0; j < c1 - c0; ++j) {
      rec_m[4 + j] = m_code(k, normalise(nm, s.m[j]));
      rec_v[4 + j] = v_code(k, normalise(nv, s.v[j]));
    }
  }
};

// Instantiates `F<G, C>::run` for the runtime gradient and copy dtypes.
template <template <DType, Copy> class F>
BlockFn select_q8(DType g, Copy c) noexcept {
  auto by_copy = [&]<DType G>() -> BlockFn {
    switch (c) {
      case Copy::kNone: return &F<G, Copy::kNone>::run;
      case Copy::kBF16: return &F<G, Copy::kBF16>::run;
      case Copy::kF16: return &F<G, Copy::kF16>::run;
    }
    return nullptr;
  };
  switch (g) {
    case DType::kF32: return by_copy.template operator()<DType::kF32>();
    case DType::kBF16: return by_copy.template operator()<DType::kBF16>();
    case DType::kF16: return by_copy.template operator()<DType::kF16>();
  }
  return nullptr;
}

// Instantiates `F<R, G, S, C>` for the runtime combination; S is f32 except for Adam (f32 or
// bf16). Returns nullptr for an unsupported combination.
template <template <Rule, DType, DType, Copy> class F>
BlockFn select_block(Rule r, DType g, DType s, Copy c) noexcept {
  auto by_copy = [&]<Rule R, DType G, DType S>() -> BlockFn {
    switch (c) {
      case Copy::kNone: return &F<R, G, S, Copy::kNone>::run;
      case Copy::kBF16: return &F<R, G, S, Copy::kBF16>::run;
      case Copy::kF16: return &F<R, G, S, Copy::kF16>::run;
    }
    return nullptr;
  };
  auto by_state = [&]<Rule R, DType G>() -> BlockFn {
    if (s == DType::kF32) return by_copy.template operator()<R, G, DType::kF32>();
    if constexpr (R == Rule::kAdam) {
      if (s == DType::kBF16) return by_copy.template operator()<R, G, DType::kBF16>();
    }
    return nullptr;
  };
  auto by_grad = [&]<Rule R>() -> BlockFn {
    switch (g) {
      case DType::kF32: return by_state.template operator()<R, DType::kF32>();
      case DType::kBF16: return by_state.template operator()<R, DType::kBF16>();
      case DType::kF16: return by_state.template operator()<R, DType::kF16>();
    }
    return nullptr;
  };
  switch (r) {
    case Rule::kAdam: return by_grad.template operator()<Rule::kAdam>();
    case Rule::kSgd: return by_grad.template operator()<Rule::kSgd>();
    case Rule::kSgdMomentum: return by_grad.template operator()<Rule::kSgdMomentum>();
    case Rule::kLion: return by_grad.template operator()<Rule::kLion>();
    case Rule::kAdagrad: return by_grad.template operator()<Rule::kAdagrad>();
  }
  return nullptr;
}

}  // namespace zero::detail::optim
