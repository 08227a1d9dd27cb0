// engine/buffer_pool.hpp — equal device buffers of one pool shape (engine/placement.hpp), taken on
// demand and given back: in-flight gradients, reduction staging, gathered units. A pool grows to
// what the run needs and never frees before its owner.
//
// Thread safety: not synchronised; one owner's thread.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "engine/placement.hpp"
#include "zero/device/device_ops.hpp"

namespace zero::detail {

// Equal buffers of one pool shape: taken on demand, given back, never freed before the owner.
class BufferPool {
 public:
  BufferPool(DeviceOps& d, MemoryTracker& t, PoolShape shape) : d_(d), t_(t), shape_(shape) {}
  Buffer take() {
    if (!free_.empty()) {
      Buffer b = std::move(free_.back());
      free_.pop_back();
      return b;
    }
    ++allocated_;
    return d_.alloc(t_, shape_.category, shape_.buffer_bytes);
  }
  void give(Buffer b) {
    if (!b.empty()) free_.push_back(std::move(b));
  }
  std::size_t allocated() const { return allocated_; }
  std::size_t allocated_bytes() const { return allocated_ * shape_.buffer_bytes; }

 private:
  DeviceOps& d_;
  MemoryTracker& t_;
  PoolShape shape_;
  std::vector<Buffer> free_;
  std::size_t allocated_ = 0;
};

}  // namespace zero::detail
