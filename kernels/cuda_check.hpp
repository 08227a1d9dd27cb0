// kernels/cuda_check.hpp — the one checked path for CUDA calls and launches in kernels/.
//
// Thread safety: stateless.
#pragma once

#include <cuda_runtime.h>

#include "zero/core/error.hpp"

namespace zero::detail::kernels {

// Throws zero::Error(kCuda) naming `what` and CUDA's message unless `e` is cudaSuccess.
inline void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    ZERO_THROW(kCuda, what, ": ", cudaGetErrorName(e), ": ", cudaGetErrorString(e));
  }
}

// After a <<<>>> launch: a bad configuration or a missing device shows up here.
inline void check_launch(const char* kernel) { cuda_check(cudaGetLastError(), kernel); }

// Blocks for a grid-stride kernel over `work_items`: enough to fill the device (SM count x
// blocks_per_sm), never more than the work. The SM count is read once per device.
int grid_size(std::size_t work_items, int blocks_per_sm);

}  // namespace zero::detail::kernels
