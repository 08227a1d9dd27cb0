// Block-wise int8 quantization on the GPU: one thread block per quantization block (grid-stride
// over blocks), the block's |x| maximum by a shared-memory reduction (a maximum does not depend
// on the order), then every element through the per-element math the CPU path uses
// (zero/detail/quantize_math.hpp), so a GPU round trip gives the CPU's bits.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda_check.hpp"
#include "zero/detail/kernels.hpp"
#include "zero/detail/quantize_math.hpp"
#include "zero/error.hpp"

namespace zero::detail::kernels {
namespace {

constexpr int kThreads = 256;

__global__ void quantize_kernel(const float* x, std::size_t count, std::size_t block,
                                std::int8_t* q, float* scales,
                                unsigned long long* first_non_finite) {
  __shared__ float maxima[kThreads];
  __shared__ float inverse;
  const std::size_t blocks = (count + block - 1) / block;
  for (std::size_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const std::size_t lo = b * block, hi = lo + block < count ? lo + block : count;
    float m = 0.0f;
    for (std::size_t i = lo + threadIdx.x; i < hi; i += kThreads) {
      const float a = fabsf(x[i]);
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
      q[i] = quant::quantize_one(x[i], inverse);
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

}  // namespace

void quantize_int8(const float* x, std::size_t count, std::size_t block, std::int8_t* q,
                   float* scales, unsigned long long* first_non_finite, void* stream) {
  ZERO_CHECK(block >= 1, kInvalidArgument, "GPU quantize_int8: block size must be >= 1");
  if (count == 0) return;
  ZERO_CHECK(x != nullptr && q != nullptr && scales != nullptr, kInvalidArgument,
             "GPU quantize_int8: null buffer for ", count, " elements");
  const std::size_t blocks = (count + block - 1) / block;
  quantize_kernel<<<grid_size(blocks, 8), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      x, count, block, q, scales, first_non_finite);
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

}  // namespace zero::detail::kernels
