// In-place scaling (unscaling) of a gradient buffer: x = x * factor, rounded back to its dtype.
// f32 buffers aligned to 16 bytes take 16-byte loads; everything else goes element by element.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda_check.hpp"
#include "zero/core/error.hpp"
#include "zero/device/detail/kernels.hpp"
#include "zero/optim/detail/optim_math.hpp"

namespace zero::detail::kernels {
namespace {

constexpr int kThreads = 256;

__global__ void scale_f32x4_kernel(float4* data, std::size_t quads, float f) {
  for (std::size_t i = blockIdx.x * std::size_t{kThreads} + threadIdx.x; i < quads;
       i += std::size_t{gridDim.x} * kThreads) {
    float4 v = data[i];
    v.x = optim::mul(v.x, f), v.y = optim::mul(v.y, f), v.z = optim::mul(v.z, f);
    v.w = optim::mul(v.w, f);
    data[i] = v;
  }
}

template <DType T>
__global__ void scale_kernel(void* data, std::size_t begin, std::size_t n, float f) {
  for (std::size_t i = begin + blockIdx.x * std::size_t{kThreads} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * kThreads) {
    if constexpr (T == DType::kF32) {
      float* p = static_cast<float*>(data);
      p[i] = optim::mul(p[i], f);
    } else if constexpr (T == DType::kBF16) {
      std::uint16_t* p = static_cast<std::uint16_t*>(data);
      p[i] = f32_to_bf16(optim::mul(bf16_to_f32(p[i]), f));
    } else {
      std::uint16_t* p = static_cast<std::uint16_t*>(data);
      p[i] = f32_to_f16(optim::mul(f16_to_f32(p[i]), f));
    }
  }
}

}  // namespace

void scale(void* data, DType dtype, std::size_t count, float factor, void* stream_ptr) {
  if (count == 0) return;
  ZERO_CHECK(data != nullptr, kInvalidArgument, "GPU scale: data is null for ", count, " elements");
  ZERO_CHECK(reinterpret_cast<std::uintptr_t>(data) % dtype_size(dtype) == 0, kInvalidArgument,
             "GPU scale: data is not aligned to its element size");
  ZERO_CHECK(std::isfinite(factor), kInvalidArgument, "GPU scale: factor ", factor,
             " must be finite");
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  std::size_t begin = 0;
  if (dtype == DType::kF32 && reinterpret_cast<std::uintptr_t>(data) % 16 == 0) {
    const std::size_t quads = count / 4;
    if (quads > 0) {
      scale_f32x4_kernel<<<grid_size((quads + kThreads - 1) / kThreads, 8), kThreads, 0, stream>>>(
          static_cast<float4*>(data), quads, factor);
      check_launch("scale_f32x4_kernel");
    }
    begin = quads * 4;
    if (begin == count) return;
  }
  const int grid = grid_size((count - begin + kThreads - 1) / kThreads, 8);
  switch (dtype) {
    case DType::kF32:
      scale_kernel<DType::kF32><<<grid, kThreads, 0, stream>>>(data, begin, count, factor);
      break;
    case DType::kBF16:
      scale_kernel<DType::kBF16><<<grid, kThreads, 0, stream>>>(data, begin, count, factor);
      break;
    case DType::kF16:
      scale_kernel<DType::kF16><<<grid, kThreads, 0, stream>>>(data, begin, count, factor);
      break;
  }
  check_launch("scale_kernel");
}

}  // namespace zero::detail::kernels
