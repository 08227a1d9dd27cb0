// zero/device/detail/cuda_runtime.hpp — the thin CUDA runtime surface the rest of the library uses.
//
// Implemented in device/cuda_runtime.cpp when built with CUDA (the only file outside kernels/
// and the NCCL communicator that includes a CUDA header) and in device/cuda_runtime_none.cpp
// otherwise, where device_count() is 0 and every allocation throws zero::Error(kCuda).
//
// Thread safety: all functions are safe to call concurrently.
#pragma once

#include <cstddef>
#include <string>

#include "zero/device/memory.hpp"

namespace zero::detail::cuda {

// True when the library was built with ZERO_WITH_CUDA.
bool built() noexcept;
// Number of usable devices; 0 when not built, no driver or no device (never throws).
int device_count() noexcept;
// Why device_count() is 0 ("built without CUDA", "cudaGetDeviceCount: ..."), empty otherwise.
std::string unavailable_reason();

void* device_alloc(std::size_t bytes, int device);  // throws kOutOfMemory / kCuda
void device_free(void* p, int device) noexcept;
void device_memset(void* p, int value, std::size_t bytes, int device);
void* host_alloc(std::size_t bytes);  // cudaHostAlloc; throws
void host_free(void* p) noexcept;
DeviceMemoryInfo mem_info(int device);
// Copies `bytes` between any two of device and page-locked host memory on `device` and waits for
// the device to finish (cudaMemcpy, then cudaDeviceSynchronize: a device-to-device copy may return
// early); the calibration times it. Throws kCuda.
void copy_sync(void* dst, const void* src, std::size_t bytes, int device);
// The device's name ("NVIDIA H100 80GB HBM3"); empty when it cannot be read.
std::string device_name(int device);

}  // namespace zero::detail::cuda
