// Element type conversion on the device with the scalar rules of zero/core/dtype.hpp (round to
// nearest even, NaN kept quiet): the same bits as zero::convert on the CPU.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda_check.hpp"
#include "zero/core/error.hpp"
#include "zero/device/detail/kernels.hpp"

namespace zero::detail::kernels {
namespace {

constexpr int kThreads = 256;

template <DType S, DType D>
__global__ void cast_kernel(const void* src, void* dst, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{kThreads} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * kThreads) {
    const float x = load_as_f32(static_cast<const char*>(src) + i * (S == DType::kF32 ? 4 : 2), S);
    if constexpr (D == DType::kF32) {
      static_cast<float*>(dst)[i] = x;
    } else if constexpr (D == DType::kBF16) {
      static_cast<std::uint16_t*>(dst)[i] = f32_to_bf16(x);
    } else {
      static_cast<std::uint16_t*>(dst)[i] = f32_to_f16(x);
    }
  }
}

using Launch = void (*)(const void*, void*, std::size_t, cudaStream_t);

template <DType S, DType D>
void launch(const void* src, void* dst, std::size_t n, cudaStream_t stream) {
  cast_kernel<S, D>
      <<<grid_size((n + kThreads - 1) / kThreads, 8), kThreads, 0, stream>>>(src, dst, n);
  check_launch("cast_kernel");
}

template <DType S>
Launch pick_dst(DType d) {
  switch (d) {
    case DType::kF32: return &launch<S, DType::kF32>;
    case DType::kBF16: return &launch<S, DType::kBF16>;
    case DType::kF16: return &launch<S, DType::kF16>;
  }
  return nullptr;
}

}  // namespace

void cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::size_t count,
          void* stream) {
  if (count == 0) return;
  ZERO_CHECK(src != nullptr && dst != nullptr, kInvalidArgument, "GPU cast: null pointer for ",
             count, " elements");
  ZERO_CHECK(reinterpret_cast<std::uintptr_t>(src) % dtype_size(src_dtype) == 0 &&
                 reinterpret_cast<std::uintptr_t>(dst) % dtype_size(dst_dtype) == 0,
             kInvalidArgument, "GPU cast: pointers must be aligned to their element sizes");
  Launch fn = nullptr;
  switch (src_dtype) {
    case DType::kF32: fn = pick_dst<DType::kF32>(dst_dtype); break;
    case DType::kBF16: fn = pick_dst<DType::kBF16>(dst_dtype); break;
    case DType::kF16: fn = pick_dst<DType::kF16>(dst_dtype); break;
  }
  ZERO_CHECK(fn != nullptr, kInvalidArgument, "GPU cast: unsupported dtypes");
  fn(src, dst, count, static_cast<cudaStream_t>(stream));
}

}  // namespace zero::detail::kernels
