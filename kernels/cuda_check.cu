// The SM count behind grid_size(), read once per device.
#include <algorithm>
#include <atomic>

#include "kernels/cuda_check.hpp"

namespace zero::detail::kernels {

int grid_size(std::size_t work_items, int blocks_per_sm) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> sm_count[kMaxDevices] = {};
  int device = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  int sms = device < kMaxDevices ? sm_count[device].load(std::memory_order_relaxed) : 0;
  if (sms == 0) {
    cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
               "cudaDeviceGetAttribute(MultiProcessorCount)");
    if (device < kMaxDevices) sm_count[device].store(sms, std::memory_order_relaxed);
  }
  const std::size_t cap = static_cast<std::size_t>(sms) * static_cast<std::size_t>(blocks_per_sm);
  return static_cast<int>(std::max<std::size_t>(1, std::min(work_items, cap)));
}

}  // namespace zero::detail::kernels
