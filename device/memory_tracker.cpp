#include "zero/core/error.hpp"
#include "zero/device/detail/cuda_runtime.hpp"
#include "zero/device/memory.hpp"
#include "zero/device/memory_report.hpp"

namespace zero {

std::string_view to_string(MemCategory c) noexcept {
  switch (c) {
    case MemCategory::kParams16: return "params16";
    case MemCategory::kMasterParams: return "master_params";
    case MemCategory::kGradients: return "gradients";
    case MemCategory::kOptimizerState: return "optimizer_state";
    case MemCategory::kCommBuffers: return "comm_buffers";
    case MemCategory::kActivations: return "activations";
    case MemCategory::kOffloadStaging: return "offload_staging";
    case MemCategory::kOther: return "other";
  }
  return "unknown";
}

std::string_view to_string(MemTier t) noexcept {
  switch (t) {
    case MemTier::kDevice: return "device";
    case MemTier::kHost: return "host";
    case MemTier::kPinned: return "pinned";
    case MemTier::kNvme: return "nvme";
  }
  return "unknown";
}

namespace {
constexpr std::size_t index(MemCategory c, MemTier t) {
  return static_cast<std::size_t>(c) * kNumMemTiers + static_cast<std::size_t>(t);
}
}  // namespace

void MemoryTracker::raise_peak(std::atomic<std::size_t>& peak, std::size_t value) noexcept {
  std::size_t seen = peak.load(std::memory_order_relaxed);
  while (value > seen && !peak.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

void MemoryTracker::charge(MemCategory c, MemTier t, std::size_t bytes) noexcept {
  if (bytes == 0) return;
  const std::size_t i = index(c, t);
  const std::size_t ti = static_cast<std::size_t>(t);
  raise_peak(peak_[i], current_[i].fetch_add(bytes, std::memory_order_relaxed) + bytes);
  raise_peak(tier_peak_[ti], tier_current_[ti].fetch_add(bytes, std::memory_order_relaxed) + bytes);
  if (t != MemTier::kNvme) {
    raise_peak(memory_peak_, memory_current_.fetch_add(bytes, std::memory_order_relaxed) + bytes);
  }
}

void MemoryTracker::release(MemCategory c, MemTier t, std::size_t bytes) {
  if (bytes == 0) return;
  const std::size_t i = index(c, t);
  const std::size_t before = current_[i].fetch_sub(bytes, std::memory_order_relaxed);
  if (before < bytes) {
    current_[i].fetch_add(bytes, std::memory_order_relaxed);
    ZERO_THROW(kInternal, "rank ", rank_, ": releasing ", bytes, " bytes of ", to_string(c), "/",
               to_string(t), " but only ", before, " are charged");
  }
  tier_current_[static_cast<std::size_t>(t)].fetch_sub(bytes, std::memory_order_relaxed);
  if (t != MemTier::kNvme) memory_current_.fetch_sub(bytes, std::memory_order_relaxed);
}

std::size_t MemoryTracker::current(MemCategory c, MemTier t) const noexcept {
  return current_[index(c, t)].load(std::memory_order_relaxed);
}
std::size_t MemoryTracker::peak(MemCategory c, MemTier t) const noexcept {
  return peak_[index(c, t)].load(std::memory_order_relaxed);
}
std::size_t MemoryTracker::current(MemTier t) const noexcept {
  return tier_current_[static_cast<std::size_t>(t)].load(std::memory_order_relaxed);
}
std::size_t MemoryTracker::peak(MemTier t) const noexcept {
  return tier_peak_[static_cast<std::size_t>(t)].load(std::memory_order_relaxed);
}
std::size_t MemoryTracker::current(MemCategory c) const noexcept {
  std::size_t sum = 0;
  for (std::size_t t = 0; t < kNumMemTiers; ++t) sum += current(c, static_cast<MemTier>(t));
  return sum;
}
std::size_t MemoryTracker::current_memory() const noexcept {
  return memory_current_.load(std::memory_order_relaxed);
}
std::size_t MemoryTracker::peak_memory() const noexcept {
  return memory_peak_.load(std::memory_order_relaxed);
}

void MemoryTracker::reset_peaks() noexcept {
  for (std::size_t i = 0; i < current_.size(); ++i) {
    peak_[i].store(current_[i].load(std::memory_order_relaxed), std::memory_order_relaxed);
  }
  for (std::size_t t = 0; t < kNumMemTiers; ++t) {
    tier_peak_[t].store(tier_current_[t].load(std::memory_order_relaxed),
                        std::memory_order_relaxed);
  }
  memory_peak_.store(memory_current_.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

MemoryReport MemoryTracker::report() const {
  MemoryReport r;
  r.rank = rank_;
  for (std::size_t c = 0; c < kNumMemCategories; ++c) {
    for (std::size_t t = 0; t < kNumMemTiers; ++t) {
      r.cells[c][t] = {current_[c * kNumMemTiers + t].load(std::memory_order_relaxed),
                       peak_[c * kNumMemTiers + t].load(std::memory_order_relaxed)};
    }
  }
  for (std::size_t t = 0; t < kNumMemTiers; ++t) {
    r.tiers[t] = {current(static_cast<MemTier>(t)), peak(static_cast<MemTier>(t))};
  }
  r.memory = {current_memory(), peak_memory()};
  r.process = process_memory();
  r.device = device_memory_info(0);
  return r;
}

void MemoryTracker::check_budget(MemCategory c, MemTier t, std::size_t bytes) const {
  const std::size_t budget = budget_.load();
  if (budget == 0 || t == MemTier::kNvme) return;
  const std::size_t now = current_memory();
  ZERO_CHECK(now + bytes <= budget, kOutOfMemory, "rank ", rank_,
             ": memory budget exceeded: ", bytes, " bytes of ", to_string(c), " (", to_string(t),
             ") on top of ", now, " bytes in use would pass the budget of ", budget,
             " bytes (offload the optimizer to NVMe, raise the stage, or raise the budget)");
}

}  // namespace zero
