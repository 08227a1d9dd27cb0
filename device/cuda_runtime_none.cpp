// The CUDA runtime surface of a build without CUDA: no devices, and a clear error on use.
#include "zero/core/error.hpp"
#include "zero/device/detail/cuda_runtime.hpp"

namespace zero::detail::cuda {

bool built() noexcept { return false; }
int device_count() noexcept { return 0; }
std::string unavailable_reason() { return "zero was built without CUDA (ZERO_WITH_CUDA=OFF)"; }

void* device_alloc(std::size_t bytes, int device) {
  ZERO_THROW(kCuda, "cannot allocate ", bytes, " bytes on cuda:", device, ": ",
             unavailable_reason());
}
void device_free(void*, int) noexcept {}
void device_memset(void*, int, std::size_t bytes, int device) {
  ZERO_THROW(kCuda, "cannot memset ", bytes, " bytes on cuda:", device, ": ", unavailable_reason());
}
void* host_alloc(std::size_t bytes) {
  ZERO_THROW(kCuda, "cannot page-lock ", bytes, " bytes: ", unavailable_reason());
}
void host_free(void*) noexcept {}
DeviceMemoryInfo mem_info(int) { return {}; }
void copy_sync(void*, const void*, std::size_t bytes, int device) {
  ZERO_THROW(kCuda, "cannot copy ", bytes, " bytes on cuda:", device, ": ", unavailable_reason());
}
std::string device_name(int) { return {}; }

}  // namespace zero::detail::cuda
