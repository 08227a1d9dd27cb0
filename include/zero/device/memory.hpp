// zero/device/memory.hpp — every byte the library allocates, charged to a rank's MemoryTracker.
//
// The harness compares measured bytes against the ZeRO formulas (DESIGN.md), so nothing is
// computed: each Buffer charges its tracker on allocation and releases on destruction, by
// category (what the bytes are for) and tier (where they live). Files on NVMe are charged by
// the offload swapper through charge()/release() directly.
//
// Thread safety: MemoryTracker is safe for concurrent use from any number of threads (atomic
// counters; totals are exact). A Buffer is a move-only owner and is not itself synchronised.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "zero/device/device.hpp"

namespace zero {

enum class MemCategory : std::uint8_t {
  kParams16,        // 16-bit (or working-precision) parameters the trainer computes with
  kMasterParams,    // fp32 master copy of the parameters
  kGradients,       // gradients (full or sharded)
  kOptimizerState,  // optimizer moments (Adam m, v; momentum; ...)
  kCommBuffers,     // collective staging and bucket buffers
  kActivations,     // activations and activation checkpoints
  kOffloadStaging,  // pinned / aligned buffers that carry offloaded state
  kOther,
};
inline constexpr std::size_t kNumMemCategories = 8;

enum class MemTier : std::uint8_t { kDevice, kHost, kPinned, kNvme };
inline constexpr std::size_t kNumMemTiers = 4;

std::string_view to_string(MemCategory c) noexcept;
std::string_view to_string(MemTier t) noexcept;

class MemoryReport;

// Per-rank accounting of current and peak bytes by (category, tier).
class MemoryTracker {
 public:
  explicit MemoryTracker(int rank = 0) noexcept : rank_(rank) {}
  MemoryTracker(const MemoryTracker&) = delete;
  MemoryTracker& operator=(const MemoryTracker&) = delete;

  int rank() const noexcept { return rank_; }

  void charge(MemCategory c, MemTier t, std::size_t bytes) noexcept;
  // REQUIRES: bytes were charged to (c, t) before; an underflow is a bug (zero::Error kInternal).
  void release(MemCategory c, MemTier t, std::size_t bytes);

  std::size_t current(MemCategory c, MemTier t) const noexcept;
  std::size_t peak(MemCategory c, MemTier t) const noexcept;
  // Sum over categories of one tier; its peak is the peak of the sum, not the sum of peaks.
  std::size_t current(MemTier t) const noexcept;
  std::size_t peak(MemTier t) const noexcept;
  // Sum over categories of a category over all tiers.
  std::size_t current(MemCategory c) const noexcept;
  // All tiers but NVMe (memory, not files).
  std::size_t current_memory() const noexcept;
  std::size_t peak_memory() const noexcept;

  // Sets every peak to its current value (e.g. between harness configurations).
  void reset_peaks() noexcept;

  // A cap on this rank's memory (all tiers but NVMe), 0 for none: a Buffer whose allocation
  // would take current_memory() past it throws kOutOfMemory naming the rank, the category, the
  // size and the budget (files on NVMe are not memory and are not capped). Checked per
  // allocation, not atomically across threads charging the same tracker at once.
  void set_memory_budget(std::size_t bytes) noexcept { budget_.store(bytes); }
  std::size_t memory_budget() const noexcept { return budget_.load(); }
  // Throws as above if `bytes` more of (c, t) would exceed the budget.
  void check_budget(MemCategory c, MemTier t, std::size_t bytes) const;

  MemoryReport report() const;

 private:
  static void raise_peak(std::atomic<std::size_t>& peak, std::size_t value) noexcept;

  int rank_;
  std::array<std::atomic<std::size_t>, kNumMemCategories * kNumMemTiers> current_{};
  std::array<std::atomic<std::size_t>, kNumMemCategories * kNumMemTiers> peak_{};
  std::array<std::atomic<std::size_t>, kNumMemTiers> tier_current_{};
  std::array<std::atomic<std::size_t>, kNumMemTiers> tier_peak_{};
  std::atomic<std::size_t> memory_current_{0};
  std::atomic<std::size_t> memory_peak_{0};
  std::atomic<std::size_t> budget_{0};
};

struct AllocOptions {
  // Touch every page right after allocation, in parallel (oneTBB), in blocks of `prefault_grain`
  // bytes: first touch of fresh memory runs at ~1-2 GB/s and would otherwise land on the first
  // optimizer step. Host and pinned tiers only.
  bool prefault = false;
  std::size_t prefault_grain = std::size_t{2} << 20;
  // Fill with zeros (device tier: cudaMemset). Implies touching the pages.
  bool zero = false;
};

// Blocks of at least this size are 2 MiB aligned and advised MADV_HUGEPAGE.
inline constexpr std::size_t kHugePageThreshold = std::size_t{4} << 20;
inline constexpr std::size_t kHostAlignment = 64;

// A move-only owner of one allocation charged to a tracker. Empty (size 0) buffers own nothing.
class Buffer {
 public:
  Buffer() noexcept = default;
  // Host memory: 64-byte aligned; >= kHugePageThreshold: 2 MiB aligned, MADV_HUGEPAGE.
  // Throws zero::Error(kOutOfMemory) naming the size and category on failure.
  static Buffer host(MemoryTracker& tracker, MemCategory c, std::size_t bytes,
                     AllocOptions opts = {});
  // Page-locked host memory (cudaHostAlloc) when CUDA is built and a device is present;
  // otherwise plain host memory, still charged to the pinned tier.
  static Buffer pinned(MemoryTracker& tracker, MemCategory c, std::size_t bytes,
                       AllocOptions opts = {});
  // CUDA device memory on `device`. Throws zero::Error(kCuda) when CUDA is not built or no device
  // is present, kOutOfMemory when cudaMalloc fails for lack of memory.
  static Buffer device(MemoryTracker& tracker, MemCategory c, std::size_t bytes, Device device,
                       AllocOptions opts = {});
  // Memory from a caller's allocator (a DeviceOps backend of its own): the budget is checked,
  // allocate(bytes) called (it throws on failure), the bytes charged to (c, tier); `release`
  // frees the pointer allocate returned. `location` is what data() points into.
  static Buffer external(MemoryTracker& tracker, MemCategory c, MemTier tier, Device location,
                         std::size_t bytes, const std::function<void*(std::size_t)>& allocate,
                         std::function<void(void*)> release);

  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  void* data() const noexcept { return data_; }
  template <typename T>
  T* as() const noexcept {
    return static_cast<T*>(data_);
  }
  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  MemTier tier() const noexcept { return tier_; }
  MemCategory category() const noexcept { return category_; }
  Device location() const noexcept { return device_; }
  // True when pinned() got real page-locked memory (CUDA present).
  bool page_locked() const noexcept { return kind_ == Kind::kCudaHost; }

  // A typed view of the whole buffer.
  View view(DType t) const noexcept { return {data_, size_ / dtype_size(t), t, device_}; }

  // Frees now (also done by the destructor).
  void reset() noexcept;

 private:
  enum class Kind : std::uint8_t { kNone, kHost, kCudaHost, kCudaDevice, kExternal };

  void* data_ = nullptr;
  std::size_t size_ = 0;
  MemoryTracker* tracker_ = nullptr;
  MemCategory category_ = MemCategory::kOther;
  MemTier tier_ = MemTier::kHost;
  Kind kind_ = Kind::kNone;
  Device device_ = Device::cpu();
  std::function<void(void*)> release_;  // kExternal
};

// Touches every page of [p, p + bytes) in parallel with oneTBB, writing zeros.
void prefault_pages(void* p, std::size_t bytes, std::size_t grain = std::size_t{2} << 20);

// ---- process and device readers
struct ProcessMemory {
  std::size_t rss_bytes = 0;  // VmRSS
  std::size_t hwm_bytes = 0;  // VmHWM (peak RSS)
};
// Reads /proc/self/status. Throws zero::Error(kIO) if it cannot be read.
ProcessMemory process_memory();

struct DeviceMemoryInfo {
  bool available = false;  // false: no CUDA build or no device
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
};
// cudaMemGetInfo on `device` when CUDA is built and present.
DeviceMemoryInfo device_memory_info(int device = 0);

}  // namespace zero
