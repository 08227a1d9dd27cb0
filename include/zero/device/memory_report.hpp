// zero/device/memory_report.hpp — a snapshot of one rank's MemoryTracker plus the process readings,
// printable as a table and serialisable to JSON.
//
// Thread safety: an immutable value once built.
#pragma once

#include <array>
#include <cstddef>
#include <string>

#include "zero/device/memory.hpp"

namespace zero {

class MemoryReport {
 public:
  struct Cell {
    std::size_t current = 0;
    std::size_t peak = 0;
  };

  int rank = 0;
  std::array<std::array<Cell, kNumMemTiers>, kNumMemCategories> cells{};
  std::array<Cell, kNumMemTiers> tiers{};
  Cell memory{};  // all tiers but NVMe
  ProcessMemory process{};
  DeviceMemoryInfo device{};

  const Cell& at(MemCategory c, MemTier t) const {
    return cells[static_cast<std::size_t>(c)][static_cast<std::size_t>(t)];
  }

  // A fixed-width table: a row per category with a non-zero figure, a column per tier (current
  // and peak), then totals and the process RSS / HWM.
  std::string table() const;
  // {"rank":..,"categories":{"params16":{"device":{"current":..,"peak":..},..},..},
  //  "tiers":{..},"memory":{..},"process":{"rss":..,"hwm":..},"device":{..}}
  std::string json() const;
};

// "1.50 MiB" style, binary units.
std::string format_bytes(std::size_t bytes);

}  // namespace zero
