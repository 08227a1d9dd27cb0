// Gradient accumulation on the device: dst = src (first micro-step) or dst + src in f32,
// rounded once to dst's dtype — device/grad_accumulate.hpp's rule with the scalar conversions
// of zero/core/dtype.hpp, so the bits match the CPU path.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda_check.hpp"
#include "zero/core/error.hpp"
#include "zero/device/detail/kernels.hpp"

namespace zero::detail::kernels {
namespace {

constexpr int kThreads = 256;

template <DType D, DType S, bool First>
__global__ void accumulate_kernel(void* dst, const void* src, std::size_t n) {
  constexpr std::size_t ds = D == DType::kF32 ? 4 : 2;
  constexpr std::size_t ss = S == DType::kF32 ? 4 : 2;
  for (std::size_t i = blockIdx.x * std::size_t{kThreads} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * kThreads) {
    char* d = static_cast<char*>(dst) + i * ds;
    const float x = load_as_f32(static_cast<const char*>(src) + i * ss, S);
    if constexpr (First) {
      store_from_f32(d, D, x);
    } else {
      const float sum = __fadd_rn(load_as_f32(d, D), x);  // one f32 add, never contracted
      store_from_f32(d, D, sum);
    }
  }
}

using Launch = void (*)(void*, const void*, std::size_t, cudaStream_t);

template <DType D, DType S, bool First>
void launch(void* dst, const void* src, std::size_t n, cudaStream_t stream) {
  accumulate_kernel<D, S, First>
      <<<grid_size((n + kThreads - 1) / kThreads, 8), kThreads, 0, stream>>>(dst, src, n);
  check_launch("accumulate_kernel");
}

template <DType D, bool First>
Launch pick_src(DType s) {
  switch (s) {
    case DType::kF32: return &launch<D, DType::kF32, First>;
    case DType::kBF16: return &launch<D, DType::kBF16, First>;
    case DType::kF16: return &launch<D, DType::kF16, First>;
  }
  return nullptr;
}

template <bool First>
Launch pick(DType d, DType s) {
  switch (d) {
    case DType::kF32: return pick_src<DType::kF32, First>(s);
    case DType::kBF16: return pick_src<DType::kBF16, First>(s);
    case DType::kF16: return pick_src<DType::kF16, First>(s);
  }
  return nullptr;
}

}  // namespace

void accumulate(void* dst, DType dst_dtype, const void* src, DType src_dtype, std::size_t count,
                bool first, void* stream) {
  if (count == 0) return;
  ZERO_CHECK(src != nullptr && dst != nullptr, kInvalidArgument,
             "GPU accumulate: null pointer for ", count, " elements");
  ZERO_CHECK(reinterpret_cast<std::uintptr_t>(src) % dtype_size(src_dtype) == 0 &&
                 reinterpret_cast<std::uintptr_t>(dst) % dtype_size(dst_dtype) == 0,
             kInvalidArgument, "GPU accumulate: pointers must be aligned to their element sizes");
  const Launch fn = first ? pick<true>(dst_dtype, src_dtype) : pick<false>(dst_dtype, src_dtype);
  ZERO_CHECK(fn != nullptr, kInvalidArgument, "GPU accumulate: unsupported dtypes");
  fn(dst, src, count, static_cast<cudaStream_t>(stream));
}

}  // namespace zero::detail::kernels
