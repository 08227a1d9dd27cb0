// zero/device/quantize.hpp — block-wise int8 quantization of f32 data, the building block of
// quantized collectives (ZeRO++: qwZ quantizes the stage-3 parameter all-gather, qgZ the gradient
// reduce-scatter, where the reduction is done in f32 after dequantization, never on int8).
//
// Layout: `count` elements in blocks of `block` (the last block may be shorter); block b's int8
// values are q[b * block ...] and its scale is scales[b]; num_blocks(count, block) scales.
// Per block with absolute maximum m: scale m / 127, values in [-127, 127], and every element read
// back within m / 254 of what was quantized (zero/device/detail/quantize_math.hpp states the
// rounding). A zero block stays exactly zero; a constant block comes back within one f32 rounding;
// a block whose maximum is below 2^-120 (subnormal-range values) is stored as zero.
//
// Non-finite input cannot be carried by a scale and is refused: zero::Error(kInvalidArgument)
// naming the first offending element, its value and its block; q and scales are then
// unspecified (x is never written).
//
// Every path (isa: best_isa() by default; scalar, AVX-512) gives the same bits.
//
// Thread safety: pure functions of their arguments; they run on the caller's oneTBB arena.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "zero/core/cpu_features.hpp"
#include "zero/core/dtype.hpp"

namespace zero {

// Blocks (and scales) for `count` elements in blocks of `block`. REQUIRES: block >= 1.
std::size_t num_blocks(std::size_t count, std::size_t block);

// Quantizes x[0, count) into q[0, count) and scales[0, num_blocks). REQUIRES: block >= 1;
// x, q, scales non-null when count > 0; throws kInvalidArgument otherwise or on non-finite x.
void quantize_int8(const float* x, std::size_t count, std::size_t block, std::int8_t* q,
                   float* scales, Isa isa = best_isa());

// out[i] = q[i] * scales[i / block].
void dequantize_int8(const std::int8_t* q, const float* scales, std::size_t count,
                     std::size_t block, float* out, Isa isa = best_isa());

// out[i] += q[i] * scales[i / block]: the f32 reduction of quantized gradients (qgZ sums what
// each rank sent, dequantized, in rank order).
void dequantize_add_int8(const std::int8_t* q, const float* scales, std::size_t count,
                         std::size_t block, float* out, Isa isa = best_isa());

// ---- any element type, and sums of quantized chunks (the quantized collectives' two ends)

// quantize_int8 of `count` elements of x in `dtype` (16-bit values become f32 exactly first).
void quantize_int8(const void* x, DType dtype, std::size_t count, std::size_t block, std::int8_t* q,
                   float* scales, Isa isa = best_isa());

// n quantized chunks of `count` elements each: chunk k's values at chunks + k * stride and its
// scales at chunks + k * stride + scales_offset (bytes; 4-aligned).
// out[i] = (sum over k = 0, 1, ..., n-1 of chunk k's element i read back) / divisor, summed in
// f32 in k order and rounded once to `dtype` (n = 1, divisor = 1: the chunk read back). The
// reduction of qgZ never sums int8: each rank's contribution is read back first.
// REQUIRES: n >= 1, divisor > 0.
void dequantize_sum_int8(const char* chunks, std::size_t stride, std::size_t scales_offset, int n,
                         std::size_t count, std::size_t block, float divisor, void* out,
                         DType dtype, Isa isa = best_isa());

namespace detail {
// The error of a non-finite element i (of `dtype`, read as f32 `value`) met by `where`:
// zero::Error(kInvalidArgument) naming it and its block. Shared by the CPU and CUDA paths.
[[noreturn]] void throw_non_finite(std::string_view where, std::size_t i, std::size_t block,
                                   DType dtype, float value);
}  // namespace detail

}  // namespace zero
