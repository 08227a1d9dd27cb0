// Sum of squares and non-finite check over a list of gradient tensors in one read: each block
// accumulates its grid-stride share in double and writes one partial; a second one-block kernel
// sums the partials in a fixed order. A finite f32 squared cannot overflow the double sum, so
// the sum is Inf/NaN exactly when some gradient is (the same rule as the CPU path).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda_check.hpp"
#include "zero/core/error.hpp"
#include "zero/device/detail/kernels.hpp"

namespace zero::detail::kernels {
namespace {

constexpr int kMaxTensors = 48;
constexpr int kThreads = 256;  // must match the shared arrays in both kernels
constexpr std::size_t kChunk = 8192;

struct GradList {
  const void* data[kMaxTensors];
  std::size_t count[kMaxTensors];
  std::size_t first_chunk[kMaxTensors + 1];
  DType dtype[kMaxTensors];
  int n;
};

__device__ double block_sum(double x) {
  __shared__ double part[kThreads];
  part[threadIdx.x] = x;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  return part[0];
}

__global__ void __launch_bounds__(kThreads) sumsq_kernel(GradList L, double* partial) {
  double acc = 0.0;
  const std::size_t total = L.first_chunk[L.n];
  for (std::size_t c = blockIdx.x; c < total; c += gridDim.x) {
    int k = 0;
    while (c >= L.first_chunk[k + 1]) ++k;
    const std::size_t begin = (c - L.first_chunk[k]) * kChunk;
    const std::size_t end = begin + kChunk < L.count[k] ? begin + kChunk : L.count[k];
    const DType t = L.dtype[k];
    const char* base = static_cast<const char*>(L.data[k]);
    const std::size_t es = t == DType::kF32 ? 4 : 2;
    for (std::size_t i = begin + threadIdx.x; i < end; i += kThreads) {
      const double x = load_as_f32(base + i * es, t);
      acc += x * x;
    }
  }
  const double s = block_sum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void __launch_bounds__(kThreads)
    sum_partials_kernel(const double* partial, int n, double* out) {
  double acc = 0.0;
  for (int i = threadIdx.x; i < n; i += kThreads) acc += partial[i];
  const double s = block_sum(acc);
  if (threadIdx.x == 0) *out = s;
}

}  // namespace

GradStats grad_stats(const GradRef* tensors, std::size_t count, void* stream_ptr) {
  GradStats out;
  if (count == 0) return out;
  ZERO_CHECK(tensors != nullptr, kInvalidArgument, "GPU grad_stats: tensors is null for ", count,
             " tensors");
  for (std::size_t k = 0; k < count; ++k) {
    if (tensors[k].count == 0) continue;
    ZERO_CHECK(tensors[k].data != nullptr, kInvalidArgument, "GPU grad_stats: tensor ", k,
               " is null");
    ZERO_CHECK(
        reinterpret_cast<std::uintptr_t>(tensors[k].data) % dtype_size(tensors[k].dtype) == 0,
        kInvalidArgument, "GPU grad_stats: tensor ", k, " is not aligned to its element size");
  }
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  double sum = 0.0;
  std::size_t k = 0;
  while (k < count) {  // batches of kMaxTensors, summed on the host in order
    GradList L{};
    L.first_chunk[0] = 0;
    for (; k < count && L.n < kMaxTensors; ++k) {
      if (tensors[k].count == 0) continue;
      const int j = L.n++;
      L.data[j] = tensors[k].data;
      L.count[j] = tensors[k].count;
      L.dtype[j] = tensors[k].dtype;
      L.first_chunk[j + 1] = L.first_chunk[j] + (tensors[k].count + kChunk - 1) / kChunk;
    }
    if (L.n == 0) break;
    const int grid = grid_size(L.first_chunk[L.n], 2);
    double* dev = nullptr;
    cuda_check(cudaMallocAsync(reinterpret_cast<void**>(&dev), sizeof(double) * (grid + 1), stream),
               "cudaMallocAsync(grad_stats partials)");
    sumsq_kernel<<<grid, kThreads, 0, stream>>>(L, dev);
    check_launch("sumsq_kernel");
    sum_partials_kernel<<<1, kThreads, 0, stream>>>(dev, grid, dev + grid);
    check_launch("sum_partials_kernel");
    double part = 0.0;
    cuda_check(cudaMemcpyAsync(&part, dev + grid, sizeof(double), cudaMemcpyDeviceToHost, stream),
               "cudaMemcpyAsync(grad_stats result)");
    cuda_check(cudaFreeAsync(dev, stream), "cudaFreeAsync(grad_stats partials)");
    cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize(grad_stats)");
    sum += part;
  }
  out.sum_squares = sum;
  out.non_finite = !std::isfinite(sum);
  return out;
}

}  // namespace zero::detail::kernels
