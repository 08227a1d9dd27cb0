// Whether a run fits the machine (zero/engine/fit.hpp): the machine's budget per tier, a plan's
// need.
#include "zero/engine/fit.hpp"

#include <sys/statvfs.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "core/process_limits.hpp"
#include "zero/device/memory.hpp"
#include "zero/device/memory_report.hpp"

namespace zero {
namespace {

// A "key value" line of a stat file (memory.stat, /proc/meminfo "Key: value kB").
std::optional<std::size_t> read_key(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string k;
    std::size_t v = 0;
    if (!(ls >> k >> v)) continue;
    if (k == key || k == key + ":") return v;
  }
  return std::nullopt;
}

// The process's memory cgroup and the tightest limit over it and its ancestors: limit less what
// is in use there (less the inactive file cache, which the kernel reclaims before it kills).
struct CgroupRoom {
  std::size_t room = 0;
  std::string from;
};
std::optional<CgroupRoom> cgroup_room() {
  const detail::CgroupDirs cg = detail::cgroup_dirs("memory");
  const char* limit_file = cg.v1 ? "memory.limit_in_bytes" : "memory.max";
  const char* usage_file = cg.v1 ? "memory.usage_in_bytes" : "memory.current";
  const char* inactive_key = cg.v1 ? "total_inactive_file" : "inactive_file";
  std::optional<CgroupRoom> best;
  for (const std::string& dir : cg.dirs) {
    const std::optional<std::size_t> limit = detail::read_number(dir + "/" + limit_file);
    // v1 says "no limit" with a number near 2^63.
    if (!limit || *limit >= (std::size_t{1} << 62)) continue;
    const std::size_t usage = detail::read_number(dir + "/" + usage_file).value_or(0);
    const std::size_t inactive = read_key(dir + "/memory.stat", inactive_key).value_or(0);
    const std::size_t used = usage > inactive ? usage - inactive : 0;
    const std::size_t room = *limit > used ? *limit - used : 0;
    if (!best || room < best->room) {
      best = CgroupRoom{room, "memory cgroup " + dir + ": limit " + format_bytes(*limit) + ", " +
                                  format_bytes(used) + " in use"};
    }
  }
  return best;
}

}  // namespace

MemoryBudget machine_budget(const Device& device, const std::string& nvme_dir) {
  MemoryBudget b;
  if (const std::optional<std::size_t> kb = read_key("/proc/meminfo", "MemAvailable")) {
    b.host = *kb * 1024;
    b.host_from = "MemAvailable " + format_bytes(b.host);
  }
  if (const std::optional<CgroupRoom> cg = cgroup_room();
      cg && (b.host == 0 || cg->room < b.host)) {
    b.host = cg->room;
    b.host_from = cg->from;
  }
  if (device.is_cuda()) {
    const DeviceMemoryInfo d = device_memory_info(device.index);
    if (d.available) {
      b.device = d.free_bytes;
      b.device_from = device.to_string() + " free " + format_bytes(d.free_bytes) + " of " +
                      format_bytes(d.total_bytes);
    }
  }
  struct statvfs fs {};
  if (!nvme_dir.empty() && ::statvfs(nvme_dir.c_str(), &fs) == 0) {
    b.nvme = static_cast<std::size_t>(fs.f_bavail) * fs.f_frsize;
    b.nvme_from = "free under " + nvme_dir;
  }
  return b;
}

FitNeed fit_need(const PlanResult& plan, int ranks, std::size_t trainer_bytes,
                 bool device_is_host) {
  std::size_t pinned = 0, on_device = trainer_bytes, nvme = 0;
  for (std::size_t c = 0; c < kNumMemCategories; ++c) {
    pinned += plan.pinned[c];
    on_device += plan.bytes[c] - plan.pinned[c];
    nvme += plan.nvme[c];
  }
  const auto n = static_cast<std::size_t>(std::max(ranks, 1));
  FitNeed need;
  need.host = n * (pinned + (device_is_host ? on_device : 0));
  need.device = device_is_host ? 0 : n * on_device;
  need.nvme = n * nvme;
  return need;
}

std::string fit_shortfall(const FitNeed& need, const MemoryBudget& budget) {
  std::string out;
  auto tier = [&](const char* name, std::size_t needs, std::size_t has, const std::string& from) {
    if (has == 0 || needs <= has) return;
    if (!out.empty()) out += "; ";
    out += std::string(name) + ": needs " + format_bytes(needs) + ", has " + format_bytes(has) +
           (from.empty() ? "" : " (" + from + ")") + ": short by " + format_bytes(needs - has);
  };
  tier("host memory", need.host, budget.host, budget.host_from);
  tier("device memory", need.device, budget.device, budget.device_from);
  tier("NVMe", need.nvme, budget.nvme, budget.nvme_from);
  return out;
}

}  // namespace zero
