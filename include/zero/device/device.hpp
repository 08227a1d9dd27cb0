// zero/device/device.hpp — where memory lives and a non-owning typed view of it.
//
// Thread safety: plain values; safe to copy and read from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "zero/core/dtype.hpp"
#include "zero/core/error.hpp"

namespace zero {

enum class DeviceType : std::uint8_t { kCpu, kCuda };

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;  // CUDA device ordinal; 0 for the CPU

  static constexpr Device cpu() noexcept { return {DeviceType::kCpu, 0}; }
  static constexpr Device cuda(int index) noexcept { return {DeviceType::kCuda, index}; }
  constexpr bool is_cpu() const noexcept { return type == DeviceType::kCpu; }
  constexpr bool is_cuda() const noexcept { return type == DeviceType::kCuda; }
  friend constexpr bool operator==(Device a, Device b) noexcept {
    return a.type == b.type && a.index == b.index;
  }
  // "cpu" or "cuda:N".
  std::string to_string() const {
    return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
  }
};

// A non-owning view of `count` elements of `dtype` at `data` on `device`. Owns nothing; the
// memory must outlive the view.
struct View {
  void* data = nullptr;
  std::size_t count = 0;
  DType dtype = DType::kF32;
  Device device = Device::cpu();

  std::size_t bytes() const noexcept { return count * dtype_size(dtype); }
  bool empty() const noexcept { return count == 0; }

  // Elements [offset, offset + n). REQUIRES: offset + n <= count, else zero::Error.
  View slice(std::size_t offset, std::size_t n) const {
    ZERO_CHECK(offset <= count && n <= count - offset, kInvalidArgument, "View::slice(", offset,
               ", ", n, ") out of range for a view of ", count, " elements");
    return {static_cast<char*>(data) + offset * dtype_size(dtype), n, dtype, device};
  }

  // Typed pointer; T must match dtype (float for f32, std::uint16_t for f16/bf16).
  template <typename T>
  T* as() const {
    ZERO_CHECK(sizeof(T) == dtype_size(dtype), kInvalidArgument, "View::as: element size ",
               sizeof(T), " does not match dtype ", to_string(dtype));
    return static_cast<T*>(data);
  }
};

}  // namespace zero
