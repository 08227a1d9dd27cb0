// Buffer: the allocators of the three memory tiers (host, pinned host, CUDA device), each
// allocation charged to its rank's MemoryTracker.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "zero/core/error.hpp"
#include "zero/device/detail/cuda_runtime.hpp"
#include "zero/device/memory.hpp"

namespace zero {

namespace {
constexpr std::size_t kHugePage = std::size_t{2} << 20;

void* host_alloc(std::size_t bytes, MemCategory c) {
  const std::size_t align = bytes >= kHugePageThreshold ? kHugePage : kHostAlignment;
  const std::size_t rounded = (bytes + align - 1) / align * align;
  void* p = std::aligned_alloc(align, rounded);
  if (p == nullptr) {
    ZERO_THROW(kOutOfMemory, "host allocation of ", bytes, " bytes for ", to_string(c), " failed");
  }
  if (align == kHugePage) {
    // Advisory: transparent huge pages are madvise-only on these systems; failure is harmless.
    (void)madvise(p, rounded, MADV_HUGEPAGE);
  }
  return p;
}
}  // namespace

void prefault_pages(void* p, std::size_t bytes, std::size_t grain) {
  if (p == nullptr || bytes == 0) return;
  if (grain < 4096) grain = 4096;
  auto* base = static_cast<char*>(p);
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, bytes, grain),
                    [base](const tbb::blocked_range<std::size_t>& r) {
                      std::memset(base + r.begin(), 0, r.size());
                    });
}

Buffer Buffer::host(MemoryTracker& tracker, MemCategory c, std::size_t bytes, AllocOptions opts) {
  Buffer b;
  if (bytes == 0) return b;
  tracker.check_budget(c, MemTier::kHost, bytes);
  b.data_ = host_alloc(bytes, c);
  b.size_ = bytes;
  b.tracker_ = &tracker;
  b.category_ = c;
  b.tier_ = MemTier::kHost;
  b.kind_ = Kind::kHost;
  tracker.charge(c, MemTier::kHost, bytes);
  if (opts.prefault || opts.zero) prefault_pages(b.data_, bytes, opts.prefault_grain);
  return b;
}

Buffer Buffer::pinned(MemoryTracker& tracker, MemCategory c, std::size_t bytes, AllocOptions opts) {
  Buffer b;
  if (bytes == 0) return b;
  tracker.check_budget(c, MemTier::kPinned, bytes);
  if (detail::cuda::device_count() > 0) {
    b.data_ = detail::cuda::host_alloc(bytes);
    b.kind_ = Kind::kCudaHost;
  } else {
    b.data_ = host_alloc(bytes, c);
    b.kind_ = Kind::kHost;
  }
  b.size_ = bytes;
  b.tracker_ = &tracker;
  b.category_ = c;
  b.tier_ = MemTier::kPinned;
  tracker.charge(c, MemTier::kPinned, bytes);
  if (opts.prefault || opts.zero) prefault_pages(b.data_, bytes, opts.prefault_grain);
  return b;
}

Buffer Buffer::device(MemoryTracker& tracker, MemCategory c, std::size_t bytes, Device device,
                      AllocOptions opts) {
  ZERO_CHECK(device.is_cuda(), kInvalidArgument, "Buffer::device needs a CUDA device, got ",
             device.to_string());
  Buffer b;
  if (bytes == 0) return b;
  tracker.check_budget(c, MemTier::kDevice, bytes);
  b.data_ = detail::cuda::device_alloc(bytes, device.index);
  b.size_ = bytes;
  b.tracker_ = &tracker;
  b.category_ = c;
  b.tier_ = MemTier::kDevice;
  b.kind_ = Kind::kCudaDevice;
  b.device_ = device;
  tracker.charge(c, MemTier::kDevice, bytes);
  if (opts.zero) {
    try {
      detail::cuda::device_memset(b.data_, 0, bytes, device.index);
    } catch (...) {
      b.reset();
      throw;
    }
  }
  return b;
}

Buffer Buffer::external(MemoryTracker& tracker, MemCategory c, MemTier tier, Device location,
                        std::size_t bytes, const std::function<void*(std::size_t)>& allocate,
                        std::function<void(void*)> release) {
  ZERO_CHECK(allocate != nullptr && release != nullptr, kInvalidArgument,
             "Buffer::external needs an allocate and a release function");
  Buffer b;
  if (bytes == 0) return b;
  tracker.check_budget(c, tier, bytes);
  b.data_ = allocate(bytes);
  ZERO_CHECK(b.data_ != nullptr, kOutOfMemory, "allocation of ", bytes, " bytes for ", to_string(c),
             " (", to_string(tier), ") returned null");
  b.size_ = bytes;
  b.tracker_ = &tracker;
  b.category_ = c;
  b.tier_ = tier;
  b.kind_ = Kind::kExternal;
  b.device_ = location;
  b.release_ = std::move(release);
  tracker.charge(c, tier, bytes);
  return b;
}

Buffer::Buffer(Buffer&& o) noexcept
    : data_(o.data_),
      size_(o.size_),
      tracker_(o.tracker_),
      category_(o.category_),
      tier_(o.tier_),
      kind_(o.kind_),
      device_(o.device_),
      release_(std::move(o.release_)) {
  o.data_ = nullptr;
  o.size_ = 0;
  o.tracker_ = nullptr;
  o.kind_ = Kind::kNone;
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    reset();
    data_ = o.data_;
    size_ = o.size_;
    tracker_ = o.tracker_;
    category_ = o.category_;
    tier_ = o.tier_;
    kind_ = o.kind_;
    device_ = o.device_;
    release_ = std::move(o.release_);
    o.data_ = nullptr;
    o.size_ = 0;
    o.tracker_ = nullptr;
    o.kind_ = Kind::kNone;
  }
  return *this;
}

Buffer::~Buffer() { reset(); }

void Buffer::reset() noexcept {
  if (data_ == nullptr) return;
  switch (kind_) {
    case Kind::kHost: std::free(data_); break;
    case Kind::kCudaHost: detail::cuda::host_free(data_); break;
    case Kind::kCudaDevice: detail::cuda::device_free(data_, device_.index); break;
    case Kind::kExternal: try { release_(data_);
      } catch (...) {
        // A release function must not throw; never throw from a destructor.
      }
      break;
    case Kind::kNone: break;
  }
  if (tracker_ != nullptr) {
    try {
      tracker_->release(category_, tier_, size_);
    } catch (...) {
      // Cannot happen for a buffer that charged its own bytes; never throw from a destructor.
    }
  }
  data_ = nullptr;
  size_ = 0;
  tracker_ = nullptr;
  kind_ = Kind::kNone;
  release_ = nullptr;
}

ProcessMemory process_memory() {
  std::ifstream in("/proc/self/status");
  ZERO_CHECK(in.good(), kIO, "cannot open /proc/self/status to read VmRSS/VmHWM");
  ProcessMemory m;
  std::string line;
  while (std::getline(in, line)) {
    auto read_kib = [&](const char* key, std::size_t& out) {
      const std::size_t n = std::strlen(key);
      if (line.compare(0, n, key) == 0) out = std::stoull(line.substr(n)) * 1024;
    };
    read_kib("VmRSS:", m.rss_bytes);
    read_kib("VmHWM:", m.hwm_bytes);
  }
  return m;
}

DeviceMemoryInfo device_memory_info(int device) { return detail::cuda::mem_info(device); }

}  // namespace zero
