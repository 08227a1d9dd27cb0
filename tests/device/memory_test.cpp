// MemoryTracker and Buffer: exact accounting under concurrency, alignment, huge-page blocks,
// prefaulting, the pinned fallback, and clear errors where there is no GPU.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>
#include <vector>

#include "zero/core/error.hpp"
#include "zero/device/detail/cuda_runtime.hpp"
#include "zero/device/memory.hpp"
#include "zero/device/memory_report.hpp"

namespace zero {
namespace {

TEST(MemoryTracker, ChargesAndReleasesByCategoryAndTierWithPeaks) {
  MemoryTracker t(3);
  t.charge(MemCategory::kGradients, MemTier::kHost, 100);
  t.charge(MemCategory::kGradients, MemTier::kHost, 50);
  t.charge(MemCategory::kMasterParams, MemTier::kPinned, 1000);
  t.charge(MemCategory::kOptimizerState, MemTier::kNvme, 7);
  t.release(MemCategory::kGradients, MemTier::kHost, 120);
  EXPECT_EQ(t.current(MemCategory::kGradients, MemTier::kHost), 30u);
  EXPECT_EQ(t.peak(MemCategory::kGradients, MemTier::kHost), 150u);
  EXPECT_EQ(t.current(MemTier::kHost), 30u);
  EXPECT_EQ(t.peak(MemTier::kHost), 150u);
  EXPECT_EQ(t.current(MemCategory::kMasterParams), 1000u);
  EXPECT_EQ(t.current_memory(), 1030u);  // NVMe is not memory
  EXPECT_EQ(t.peak_memory(), 1150u);
  EXPECT_EQ(t.current(MemTier::kNvme), 7u);
  t.reset_peaks();
  EXPECT_EQ(t.peak(MemCategory::kGradients, MemTier::kHost), 30u);
  EXPECT_EQ(t.peak_memory(), 1030u);
}

TEST(MemoryTracker, OverReleaseIsAnInternalErrorNamingRankAndCategory) {
  MemoryTracker t(5);
  t.charge(MemCategory::kActivations, MemTier::kHost, 10);
  try {
    t.release(MemCategory::kActivations, MemTier::kHost, 11);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInternal);
    const std::string w = e.what();
    EXPECT_NE(w.find("rank 5"), std::string::npos) << w;
    EXPECT_NE(w.find("activations"), std::string::npos) << w;
  }
  EXPECT_EQ(t.current(MemCategory::kActivations, MemTier::kHost), 10u);  // unchanged
}

TEST(MemoryTracker, ABudgetRefusesTheAllocationThatWouldPassItNamingRankAndSize) {
  MemoryTracker t(3);
  t.set_memory_budget(1 << 20);
  Buffer a = Buffer::host(t, MemCategory::kParams16, 600 << 10);
  Buffer b = Buffer::pinned(t, MemCategory::kOffloadStaging, 400 << 10);
  // NVMe files are not memory: never capped.
  t.charge(MemCategory::kOptimizerState, MemTier::kNvme, std::size_t{1} << 30);
  try {
    Buffer c = Buffer::host(t, MemCategory::kMasterParams, 100 << 10);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("rank 3"), std::string::npos) << msg;
    EXPECT_NE(msg.find("102400 bytes of master_params"), std::string::npos) << msg;
    EXPECT_NE(msg.find("budget of 1048576"), std::string::npos) << msg;
  }
  EXPECT_EQ(t.current_memory(), std::size_t{1000} << 10);  // the refused one charged nothing
  b.reset();
  Buffer c = Buffer::host(t, MemCategory::kMasterParams, 100 << 10);  // fits now
  EXPECT_EQ(c.size(), std::size_t{100} << 10);
  t.release(MemCategory::kOptimizerState, MemTier::kNvme, std::size_t{1} << 30);
}

TEST(MemoryTracker, TotalsAreExactUnderConcurrentAllocationFromManyThreads) {
  MemoryTracker t;
  constexpr int kThreads = 8, kIters = 3000;
  std::atomic<bool> go{false};
  std::vector<std::vector<Buffer>> kept(kThreads);
  std::vector<std::size_t> kept_bytes(kThreads, 0);
  std::vector<std::thread> threads;
  for (int id = 0; id < kThreads; ++id) {
    threads.emplace_back([&, id] {
      std::mt19937 rng(static_cast<unsigned>(id));
      while (!go.load()) {
      }
      std::vector<Buffer>& live = kept[static_cast<std::size_t>(id)];
      for (int i = 0; i < kIters; ++i) {
        const auto c = static_cast<MemCategory>(rng() % kNumMemCategories);
        live.push_back(Buffer::host(t, c, 1 + rng() % 5000));
        if (live.size() > 5) live.erase(live.begin() + static_cast<long>(rng() % live.size()));
      }
      for (const Buffer& b : live) kept_bytes[static_cast<std::size_t>(id)] += b.size();
    });
  }
  go = true;
  for (auto& th : threads) th.join();
  std::size_t expected = 0;
  std::size_t expected_by_cat[kNumMemCategories] = {};
  for (const auto& v : kept) {
    for (const Buffer& b : v) {
      expected += b.size();
      expected_by_cat[static_cast<std::size_t>(b.category())] += b.size();
    }
  }
  EXPECT_EQ(t.current_memory(), expected);
  EXPECT_EQ(t.current(MemTier::kHost), expected);
  for (std::size_t c = 0; c < kNumMemCategories; ++c) {
    EXPECT_EQ(t.current(static_cast<MemCategory>(c), MemTier::kHost), expected_by_cat[c]) << c;
  }
  EXPECT_GE(t.peak_memory(), expected);
  EXPECT_LE(t.peak_memory(), std::size_t{kThreads} * 6 * 5000);
  kept.clear();
  EXPECT_EQ(t.current_memory(), 0u);
  for (std::size_t c = 0; c < kNumMemCategories; ++c) {
    EXPECT_EQ(t.current(static_cast<MemCategory>(c)), 0u);
  }
}

TEST(Buffer, HostIsAlignedChargedAndReleased) {
  MemoryTracker t;
  for (std::size_t bytes :
       {std::size_t{1}, std::size_t{63}, std::size_t{4097}, kHugePageThreshold + 5}) {
    Buffer b = Buffer::host(t, MemCategory::kParams16, bytes);
    ASSERT_NE(b.data(), nullptr);
    const std::size_t align = bytes >= kHugePageThreshold ? (std::size_t{2} << 20) : kHostAlignment;
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b.data()) % align, 0u) << bytes;
    EXPECT_EQ(t.current(MemCategory::kParams16, MemTier::kHost), bytes);
    std::memset(b.data(), 0x5a, bytes);  // the whole range is usable
    Buffer moved = std::move(b);
    EXPECT_TRUE(b.empty());
    EXPECT_EQ(t.current(MemCategory::kParams16, MemTier::kHost), bytes);
    moved.reset();
    EXPECT_EQ(t.current(MemCategory::kParams16, MemTier::kHost), 0u);
  }
  Buffer empty = Buffer::host(t, MemCategory::kOther, 0);
  EXPECT_TRUE(empty.empty());
  EXPECT_EQ(t.peak(MemCategory::kOther, MemTier::kHost), 0u);
}

TEST(Buffer, PrefaultAndZeroFillEveryByteAndRaiseRss) {
  MemoryTracker t;
  const std::size_t bytes = std::size_t{96} << 20;
  const ProcessMemory before = process_memory();
  Buffer b = Buffer::host(t, MemCategory::kOptimizerState, bytes, {.prefault = true});
  const ProcessMemory after = process_memory();
  // Prefaulted pages are resident: RSS grew by (almost) the whole block.
  EXPECT_GE(after.rss_bytes, before.rss_bytes + bytes * 9 / 10)
      << "before " << before.rss_bytes << " after " << after.rss_bytes;
  const auto* p = b.as<const unsigned char>();
  for (std::size_t i = 0; i < bytes; i += 4093) ASSERT_EQ(p[i], 0) << i;
  EXPECT_EQ(p[bytes - 1], 0);
}

TEST(Buffer, PinnedFallsBackToHostWithoutADeviceButIsChargedAsPinned) {
  MemoryTracker t;
  Buffer b = Buffer::pinned(t, MemCategory::kOffloadStaging, 12345, {.zero = true});
  EXPECT_EQ(t.current(MemCategory::kOffloadStaging, MemTier::kPinned), 12345u);
  EXPECT_EQ(t.current(MemTier::kHost), 0u);
  EXPECT_EQ(b.page_locked(), detail::cuda::device_count() > 0);
  for (std::size_t i = 0; i < 12345; ++i) ASSERT_EQ(b.as<unsigned char>()[i], 0);
}

TEST(Buffer, DeviceWithoutGpuIsACudaErrorAndChargesNothing) {
  if (detail::cuda::device_count() > 0) {
    MemoryTracker t;
    Buffer b = Buffer::device(t, MemCategory::kGradients, 1 << 20, Device::cuda(0), {.zero = true});
    EXPECT_EQ(t.current(MemCategory::kGradients, MemTier::kDevice), std::size_t{1} << 20);
    EXPECT_TRUE(device_memory_info(0).available);
    return;
  }
  MemoryTracker t;
  try {
    Buffer b = Buffer::device(t, MemCategory::kGradients, 1 << 20, Device::cuda(0));
    FAIL() << "allocated device memory without a device";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCuda);
    EXPECT_NE(std::string(e.what()).find("1048576"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cuda:0"), std::string::npos) << e.what();
  }
  EXPECT_EQ(t.current_memory(), 0u);
  EXPECT_FALSE(device_memory_info(0).available);
  EXPECT_THROW(Buffer::device(t, MemCategory::kOther, 8, Device::cpu()), Error);
}

TEST(Buffer, HugeRequestIsOutOfMemoryNamingSizeAndCategory) {
  MemoryTracker t;
  try {
    Buffer b = Buffer::host(t, MemCategory::kMasterParams, std::size_t{1} << 62);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory);
    EXPECT_NE(std::string(e.what()).find("master_params"), std::string::npos) << e.what();
  }
  EXPECT_EQ(t.current_memory(), 0u);
}

TEST(MemoryReport, TableAndJsonCarryTheTrackerFigures) {
  MemoryTracker t(2);
  Buffer a = Buffer::host(t, MemCategory::kMasterParams, 4096);
  Buffer b = Buffer::pinned(t, MemCategory::kOptimizerState, 8192);
  t.charge(MemCategory::kOptimizerState, MemTier::kNvme, 1 << 20);
  const MemoryReport r = t.report();
  EXPECT_EQ(r.at(MemCategory::kMasterParams, MemTier::kHost).current, 4096u);
  EXPECT_GT(r.process.rss_bytes, 0u);
  EXPECT_GE(r.process.hwm_bytes, r.process.rss_bytes);
  const auto j = nlohmann::json::parse(r.json());
  EXPECT_EQ(j["rank"], 2);
  EXPECT_EQ(j["categories"]["optimizer_state"]["pinned"]["current"], 8192);
  EXPECT_EQ(j["categories"]["optimizer_state"]["nvme"]["current"], 1 << 20);
  EXPECT_EQ(j["memory"]["current"], 4096 + 8192);
  const std::string table = r.table();
  EXPECT_NE(table.find("master_params"), std::string::npos) << table;
  EXPECT_NE(table.find("1.00 MiB"), std::string::npos) << table;
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  t.release(MemCategory::kOptimizerState, MemTier::kNvme, 1 << 20);
}

}  // namespace
}  // namespace zero
