// optim/cpu_kernels.hpp — the block functions behind CpuOptimizer, one set per ISA (private).
//
// A block function applies one rule to elements [begin, end) of a shard. Each ISA file
// (cpu_scalar.cpp, cpu_avx2.cpp, cpu_avx512.cpp) instantiates one per (rule, gradient dtype,
// state dtype, copy dtype) and hands it out through its select_*() function; CpuOptimizer picks
// the ISA once and splits the shard over oneTBB. Element loops for the scalar path (and the
// AVX2 tails) are the templates below, built on the shared per-element functions.
//
// Thread safety: block functions touch only [begin, end) of the arrays they are given.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zero/detail/optim_math.hpp"
#include "zero/dtype.hpp"

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
