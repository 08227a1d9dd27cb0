// Block-wise int8 quantization on the GPU: one thread block per quantization block (grid-stride
// over blocks), the block's |x| maximum by a shared-memory reduction (a maximum does not depend
// on the order), then every element through the per-element math the CPU path uses
// (zero/device/detail/quantize_math.hpp), so a GPU round trip gives the CPU's bits.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda_check.hpp"
#include "zero/core/dtype.hpp"
#include "zero/core/error.hpp"
#include "zero/device/detail/kernels.hpp"
#include "zero/device/detail/quantize_math.hpp"

namespace zero::detail::kernels {
namespace {

constexpr int kThreads = 256;

// Element i of a buffer of `dtype`, in f32 (exact for 16-bit values), and the rounding back.
__device__ inline float load_f32(const void* p, DType dtype, std::size_t i) {
  switch (dtype) {
    case DType::kF32: return static_cast<const float*>(p)[i];
    case DType::kBF16: return bf16_to_f32(static_cast<const std::uint16_t*>(p)[i]);
    case DType::kF16: return f16_to_f32(static_cast<const std::uint16_t*>(p)[i]);
  }
  return 0.0f;
}
__device__ inline void store_f32(void* p, DType dtype, std::size_t i, float v) {
  switch (dtype) {
    case DType::kF32: static_cast<float*>(p)[i] = v; break;
    case DType::kBF16: static_cast<std::uint16_t*>(p)[i] = f32_to_bf16(v); break;
    case DType::kF16: static_cast<std::uint16_t*>(p)[i] = f32_to_f16(v); break;
  }
}

__global__ void quantize_kernel(const void* x, DType dtype, std::size_t count, std::size_t block,
                                std::int8_t* q, float* scales,
                                unsigned long long* first_non_finite) {
  __shared__ float maxima[kThreads];
  __shared__ float inverse;
  const std::size_t blocks = (count + block - 1) / block;
  for (std::size_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const std::size_t lo = b * block, hi = lo + block < count ? lo + block : count;
    float m = 0.0f;
    for (std::size_t i = lo + threadIdx.x; i < hi; i += kThreads) {
      const float a = fabsf(load_f32(x, dtype, i));
      if (!(a <= 3.402823466e38f)) {  // Inf or NaN: report the element, quantize nothing here
        if (first_non_finite != nullptr) {
          atomicMin(first_non_finite, static_cast<unsigned long long>(i));
        }
      }
      m = a > m ? a : m;
    }
    maxima[threadIdx.x] = m;
    __syncthreads();
    for (int stride = kThreads / 2; stride > 0; stride /= 2) {
      if (threadIdx.x < stride) {
        const float o = maxima[threadIdx.x + stride];
        maxima[threadIdx.x] = o > maxima[threadIdx.x] ? o : maxima[threadIdx.x];
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      scales[b] = quant::block_scale(maxima[0]);
      inverse = quant::block_inverse(maxima[0]);
    }
    __syncthreads();
    for (std::size_t i = lo + threadIdx.x; i < hi; i += kThreads) {
      q[i] = quant::quantize_one(load_f32(x, dtype, i), inverse);
    }
    __syncthreads();  // `maxima` and `inverse` are reused by the next block
  }
}

__global__ void dequantize_kernel(const std::int8_t* q, const float* scales, std::size_t count,
                                  std::size_t block, float* out, bool add) {
  for (std::size_t i = blockIdx.x * std::size_t{kThreads} + threadIdx.x; i < count;
       i += std::size_t{gridDim.x} * kThreads) {
    const float v = quant::dequantize_one(q[i], scales[i / block]);
    out[i] = add ? __fadd_rn(out[i], v) : v;
  }
}

// dst[i] = (sum over k < n of chunk k's element i read back, in k order) / divisor.
__global__ void dequantize_sum_kernel(const char* chunks, std::size_t stride,
                                      std::size_t scales_offset, int n, std::size_t count,
                                      std::size_t block, float divisor, void* dst, DType dtype) {
  for (std::size_t i = blockIdx.x * std::size_t{kThreads} + threadIdx.x; i < count;
       i += std::size_t{gridDim.x} * kThreads) {
    float acc = 0.0f;
    for (int k = 0; k < n; ++k) {
      const char* chunk = chunks + static_cast<std::size_t>(k) * stride;
      const float v =
          quant::dequantize_one(reinterpret_cast<const std::int8_t*>(chunk)[i],
                                reinterpret_cast<const float*>(chunk + scales_offset)[i / block]);
      acc = k == 0 ? v : __fadd_rn(acc, v);
    }
    store_f32(dst, dtype, i, divisor == 1.0f ? acc : __fdiv_rn(acc, divisor));
  }
}

}  // namespace

void quantize_int8(const float* x, std::size_t count, std::size_t block, std::int8_t* q,
                   float* scales, unsigned long long* first_non_finite, void* stream) {
  quantize_int8(x, DType::kF32, count, block, q, scales, first_non_finite, stream);
}

void quantize_int8(const void* x, DType dtype, std::size_t count, std::size_t block, std::int8_t* q,
                   float* scales, unsigned long long* first_non_finite, void* stream) {
  ZERO_CHECK(block >= 1, kInvalidArgument, "GPU quantize_int8: block size must be >= 1");
  if (count == 0) return;
  ZERO_CHECK(x != nullptr && q != nullptr && scales != nullptr, kInvalidArgument,
             "GPU quantize_int8: null buffer for ", count, " elements");
  const std::size_t blocks = (count + block - 1) / block;
  quantize_kernel<<<grid_size(blocks, 8), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      x, dtype, count, block, q, scales, first_non_finite);
  check_launch("quantize_kernel");
}

void dequantize_int8(const std::int8_t* q, const float* scales, std::size_t count,
                     std::size_t block, float* out, bool add, void* stream) {
  ZERO_CHECK(block >= 1, kInvalidArgument, "GPU dequantize_int8: block size must be >= 1");
  if (count == 0) return;
  ZERO_CHECK(q != nullptr && scales != nullptr && out != nullptr, kInvalidArgument,
             "GPU dequantize_int8: null buffer for ", count, " elements");
  dequantize_kernel<<<grid_size((count + kThreads - 1) / kThreads, 8), kThreads, 0,
                      static_cast<cudaStream_t>(stream)>>>(q, scales, count, block, out, add);
  check_launch("dequantize_kernel");
}

void dequantize_sum_int8(const char* chunks, std::size_t stride, std::size_t scales_offset, int n,
                         std::size_t count, std::size_t block, float divisor, void* dst,
                         DType dtype, void* stream) {
  ZERO_CHECK(block >= 1 && n >= 1 && divisor > 0.0f, kInvalidArgument,
             "GPU dequantize_sum_int8: block ", block, ", ", n, " chunks, divisor ", divisor);
  if (count == 0) return;
  ZERO_CHECK(chunks != nullptr && dst != nullptr, kInvalidArgument,
             "GPU dequantize_sum_int8: null buffer for ", count, " elements");
  dequantize_sum_kernel<<<grid_size((count + kThreads - 1) / kThreads, 8), kThreads, 0,
                          static_cast<cudaStream_t>(stream)>>>(chunks, stride, scales_offset, n,
                                                               count, block, divisor, dst, dtype);
  check_launch("dequantize_sum_kernel");
}

}  // namespace zero::detail::kernels
