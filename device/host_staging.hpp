// device/host_staging.hpp — working-dtype values between the engine's device and f32 host
// arrays.
//
// Where the host can address the device's memory (the CPU device) the conversion runs in place;
// a discrete device copies through a temporary pinned buffer (charged to kOffloadStaging) and
// waits. Used by set_param / read_param and by the offloaded optimizer's master refresh.
//
// Thread safety: the engine's thread.
#pragma once

#include <cstddef>

#include "zero/core/dtype.hpp"
#include "zero/device/device_ops.hpp"
#include "zero/device/memory.hpp"

namespace zero::detail {

// out[0, n) = f32 of n values of dtype w at src, which is device memory (on_device) or host
// memory.
inline void to_host_f32(DeviceOps& dev, MemoryTracker& tracker, const void* src, DType w,
                        bool on_device, float* out, std::size_t n) {
  if (!on_device || dev.host_accessible()) {
    convert(src, w, out, DType::kF32, n);
    return;
  }
  Buffer tmp = Buffer::pinned(tracker, MemCategory::kOffloadStaging, n * dtype_size(w));
  dev.copy(tmp.data(), src, n * dtype_size(w));
  dev.synchronize();
  convert(tmp.data(), w, out, DType::kF32, n);
}

// dst[0, n) (device memory) = n f32 host values converted to w.
inline void from_host_f32(DeviceOps& dev, MemoryTracker& tracker, const float* src, void* dst,
                          DType w, std::size_t n) {
  if (dev.host_accessible()) {
    convert(src, DType::kF32, dst, w, n);
    return;
  }
  Buffer tmp = Buffer::pinned(tracker, MemCategory::kOffloadStaging, n * dtype_size(w));
  convert(src, DType::kF32, tmp.data(), w, n);
  dev.copy(dst, tmp.data(), n * dtype_size(w));
  dev.synchronize();
}

}  // namespace zero::detail
