#include "zero/device/memory_report.hpp"

#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

namespace zero {

std::string format_bytes(std::size_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0) {
    std::snprintf(buf, sizeof buf, "%zu B", bytes);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f %s", v, kUnits[u]);
  }
  return buf;
}

std::string MemoryReport::table() const {
  std::ostringstream os;
  char line[256];
  std::snprintf(line, sizeof line, "rank %d memory (current / peak)\n", rank);
  os << line;
  std::snprintf(line, sizeof line, "%-16s", "category");
  os << line;
  for (std::size_t t = 0; t < kNumMemTiers; ++t) {
    std::snprintf(line, sizeof line, " %25s",
                  std::string(to_string(static_cast<MemTier>(t))).c_str());
    os << line;
  }
  os << '\n';
  auto row = [&](const std::string& name, const std::array<Cell, kNumMemTiers>& cols) {
    std::snprintf(line, sizeof line, "%-16s", name.c_str());
    os << line;
    for (const Cell& c : cols) {
      const std::string s = format_bytes(c.current) + " / " + format_bytes(c.peak);
      std::snprintf(line, sizeof line, " %25s", s.c_str());
      os << line;
    }
    os << '\n';
  };
  for (std::size_t c = 0; c < kNumMemCategories; ++c) {
    bool any = false;
    for (const Cell& cell : cells[c]) any = any || cell.peak != 0;
    if (any) row(std::string(to_string(static_cast<MemCategory>(c))), cells[c]);
  }
  row("total", tiers);
  os << "memory (all tiers but nvme): " << format_bytes(memory.current) << " / "
     << format_bytes(memory.peak) << "; process RSS " << format_bytes(process.rss_bytes) << ", HWM "
     << format_bytes(process.hwm_bytes);
  if (device.available) {
    os << "; device used " << format_bytes(device.total_bytes - device.free_bytes) << " of "
       << format_bytes(device.total_bytes);
  }
  os << '\n';
  return os.str();
}

std::string MemoryReport::json() const {
  nlohmann::json j;
  j["rank"] = rank;
  auto cell = [](const Cell& c) {
    return nlohmann::json{{"current", c.current}, {"peak", c.peak}};
  };
  nlohmann::json cats = nlohmann::json::object();
  for (std::size_t c = 0; c < kNumMemCategories; ++c) {
    nlohmann::json tiers_j = nlohmann::json::object();
    for (std::size_t t = 0; t < kNumMemTiers; ++t) {
      tiers_j[std::string(to_string(static_cast<MemTier>(t)))] = cell(cells[c][t]);
    }
    cats[std::string(to_string(static_cast<MemCategory>(c)))] = tiers_j;
  }
  j["categories"] = cats;
  nlohmann::json tj = nlohmann::json::object();
  for (std::size_t t = 0; t < kNumMemTiers; ++t) {
    tj[std::string(to_string(static_cast<MemTier>(t)))] = cell(tiers[t]);
  }
  j["tiers"] = tj;
  j["memory"] = cell(memory);
  j["process"] = {{"rss", process.rss_bytes}, {"hwm", process.hwm_bytes}};
  j["device"] = {
      {"available", device.available}, {"free", device.free_bytes}, {"total", device.total_bytes}};
  return j.dump();
}

}  // namespace zero
