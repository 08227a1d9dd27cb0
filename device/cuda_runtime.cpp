// The CUDA runtime surface of a CUDA build. Device detection happens once; without a driver or
// device (cudaGetDeviceCount fails, e.g. 35 = insufficient driver) the count is 0.
#include <cuda_runtime.h>

#include "zero/core/error.hpp"
#include "zero/device/detail/cuda_runtime.hpp"

namespace zero::detail::cuda {

namespace {
struct Probe {
  int count = 0;
  std::string reason;
};
const Probe& probe() {
  static const Probe p = [] {
    Probe r;
    int n = 0;  // left untouched by a failing call
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      r.reason = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
      (void)cudaGetLastError();  // clear the sticky-free error so later calls start clean
      return r;
    }
    r.count = n;
    if (n == 0) r.reason = "no CUDA device present";
    return r;
  }();
  return p;
}

void check(cudaError_t e, const char* what, std::size_t bytes, int device) {
  if (e == cudaSuccess) return;
  (void)cudaGetLastError();
  if (e == cudaErrorMemoryAllocation) {
    ZERO_THROW(kOutOfMemory, what, " of ", bytes, " bytes on cuda:", device,
               " failed: ", cudaGetErrorString(e));
  }
  ZERO_THROW(kCuda, what, " (", bytes, " bytes, cuda:", device,
             ") failed: ", cudaGetErrorString(e));
}
}  // namespace

bool built() noexcept { return true; }
int device_count() noexcept {
  try {
    return probe().count;
  } catch (...) {
    return 0;
  }
}
std::string unavailable_reason() { return probe().reason; }

void* device_alloc(std::size_t bytes, int device) {
  ZERO_CHECK(device >= 0 && device < device_count(), kCuda, "cannot allocate ", bytes,
             " bytes on cuda:", device, ": ",
             device_count() == 0 ? unavailable_reason() : "no such device");
  check(cudaSetDevice(device), "cudaSetDevice", bytes, device);
  void* p = nullptr;
  check(cudaMalloc(&p, bytes), "cudaMalloc", bytes, device);
  return p;
}

void device_free(void* p, int device) noexcept {
  if (p == nullptr) return;
  cudaSetDevice(device);
  cudaFree(p);
}

void device_memset(void* p, int value, std::size_t bytes, int device) {
  check(cudaSetDevice(device), "cudaSetDevice", bytes, device);
  check(cudaMemset(p, value, bytes), "cudaMemset", bytes, device);
}

void* host_alloc(std::size_t bytes) {
  ZERO_CHECK(device_count() > 0, kCuda, "cannot page-lock ", bytes,
             " bytes: ", unavailable_reason());
  void* p = nullptr;
  check(cudaHostAlloc(&p, bytes, cudaHostAllocPortable), "cudaHostAlloc", bytes, -1);
  return p;
}

void host_free(void* p) noexcept {
  if (p != nullptr) cudaFreeHost(p);
}

DeviceMemoryInfo mem_info(int device) {
  DeviceMemoryInfo info;
  if (device < 0 || device >= device_count()) return info;
  if (cudaSetDevice(device) != cudaSuccess) return info;
  std::size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
    (void)cudaGetLastError();
    return info;
  }
  info.available = true;
  info.free_bytes = free_b;
  info.total_bytes = total_b;
  return info;
}

void copy_sync(void* dst, const void* src, std::size_t bytes, int device) {
  check(cudaSetDevice(device), "cudaSetDevice", bytes, device);
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), "cudaMemcpy", bytes, device);
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize after cudaMemcpy", bytes, device);
}

std::string device_name(int device) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return {};
  }
  return prop.name;
}

}  // namespace zero::detail::cuda
