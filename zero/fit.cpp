// Whether a run fits the machine (zero/fit.hpp): the machine's budget per tier, a plan's need.
#include "zero/fit.hpp"

#include <sys/statvfs.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "zero/memory.hpp"
#include "zero/memory_report.hpp"

namespace zero {
namespace {

std::optional<std::size_t> read_number(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  if (!(in >> s) || s == "max") return std::nullopt;
  try {
    return static_cast<std::size_t>(std::stoull(s));
  } catch (...) {
    return std::nullopt;
  }
}

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
  std::ifstream in("/proc/self/cgroup");
  std::string line, v1, v2;
  bool has_v2 = false;
  while (std::getline(in, line)) {
    const std::size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (controllers == "memory") v1 = path;
    if (line.compare(0, 3, "0::") == 0) {
      v2 = path;
      has_v2 = true;
    }
  }
  struct Level {
    std::string dir, limit_file, usage_file, inactive_key;
  };
  std::vector<Level> levels;
  auto walk = [&](const std::string& root, std::string path, const char* limit, const char* usage,
                  const char* inactive) {
    while (true) {
      levels.push_back({root + path, limit, usage, inactive});
      if (path.empty() || path == "/") break;
      const std::size_t slash = path.rfind('/');
      path = slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
    }
  };
  if (!v1.empty()) {
    walk("/sys/fs/cgroup/memory", v1, "memory.limit_in_bytes", "memory.usage_in_bytes",
         "total_inactive_file");
  } else if (has_v2) {
    walk("/sys/fs/cgroup", v2, "memory.max", "memory.current", "inactive_file");
  }
  std::optional<CgroupRoom> best;
  for (const Level& l : levels) {
    const std::optional<std::size_t> limit = read_number(l.dir + "/" + l.limit_file);
    // v1 says "no limit" with a number near 2^63.
    if (!limit || *limit >= (std::size_t{1} << 62)) continue;
    const std::size_t usage = read_number(l.dir + "/" + l.usage_file).value_or(0);
    const std::size_t inactive = read_key(l.dir + "/memory.stat", l.inactive_key).value_or(0);
    const std::size_t used = usage > inactive ? usage - inactive : 0;
    const std::size_t room = *limit > used ? *limit - used : 0;
    if (!best || room < best->room) {
      best = CgroupRoom{room, "memory cgroup " + l.dir + ": limit " + format_bytes(*limit) + ", " +
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
