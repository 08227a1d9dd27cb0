// device/quantize_kernels.hpp — the per-block loops of block-wise int8 quantization
// (device/quantize.cpp drives them over oneTBB ranges): a baseline version and an AVX-512
// version that performs the same f32 operations in the same order
// (zero/device/detail/quantize_math.hpp), so both give the same bits; quantize_test checks every
// path it can run against the other.
//
// Thread safety: pure functions of their arguments.
#pragma once

#include <cstddef>
#include <cstdint>

namespace zero::detail::quant {

// The block's largest |x| and whether every element is finite.
struct BlockMax {
  float absmax = 0.0f;
  bool finite = true;
};

namespace scalar {
BlockMax block_max(const float* x, std::size_t n);
void quantize(const float* x, std::size_t n, float inverse, std::int8_t* q);
void dequantize(const std::int8_t* q, std::size_t n, float scale, float* out, bool add);
}  // namespace scalar

namespace avx512 {
BlockMax block_max(const float* x, std::size_t n);
void quantize(const float* x, std::size_t n, float inverse, std::int8_t* q);
void dequantize(const std::int8_t* q, std::size_t n, float scale, float* out, bool add);
}  // namespace avx512

}  // namespace zero::detail::quant
