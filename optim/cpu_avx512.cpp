// AVX-512 block functions (F + BW + VL + DQ), compiled twice from cpu_avx512.inc: once plain,
// once with AVX512_BF16 for the f32 -> bf16 rounding (vcvtneps2bf16). Function-level targets
// (no -m flags on the file) keep everything else in this file baseline x86-64.
#include <immintrin.h>

// GCC 12's AVX-512 intrinsic headers start masked loads from an undefined vector and warn about
// it under -Wmaybe-uninitialized; the lanes in question are masked off.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <cstddef>
#include <cstdint>

#include "optim/cpu_kernels.hpp"
#include "optim/moment_lut.hpp"
#include "zero/core/detail/bf16_simd.hpp"

namespace zero::detail::optim {

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#ifdef __clang__  // clang ignores #pragma GCC target
#pragma clang attribute push(                                                    \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"))), \
    apply_to = function)
#endif
namespace avx512 {
#define ZERO_NATIVE_BF16 0
#include "optim/cpu_avx512.inc"
#undef ZERO_NATIVE_BF16
}  // namespace avx512
#ifdef __clang__
#pragma clang attribute pop
#endif
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")
#ifdef __clang__  // clang ignores #pragma GCC target
#pragma clang attribute push(                                                               \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c"))), \
    apply_to = function)
#endif
namespace avx512bf16 {
#define ZERO_NATIVE_BF16 1
#include "optim/cpu_avx512.inc"
#undef ZERO_NATIVE_BF16
}  // namespace avx512bf16
#ifdef __clang__
#pragma clang attribute pop
#endif
#pragma GCC pop_options

BlockFn select_avx512(Rule r, DType grad, DType state, Copy copy, bool native_bf16) noexcept {
  if (native_bf16) return select_block<avx512bf16::Avx512Block>(r, grad, state, copy);
  return select_block<avx512::Avx512Block>(r, grad, state, copy);
}

BlockFn select_q8_avx512(DType grad, Copy copy, bool native_bf16) noexcept {
  if (native_bf16) return select_q8<avx512bf16::Avx512Q8Block>(grad, copy);
  return select_q8<avx512::Avx512Q8Block>(grad, copy);
}

SumsqFn sumsq_avx512(DType grad) noexcept {
  switch (grad) {
    case DType::kF32: return &avx512::sumsq16<DType::kF32>;
    case DType::kBF16: return &avx512::sumsq16<DType::kBF16>;
    case DType::kF16: return &avx512::sumsq16<DType::kF16>;
  }
  return nullptr;
}

}  // namespace zero::detail::optim
