// What the kernel lets this process take (core/process_limits.hpp).
#include "core/process_limits.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include "zero/core/error.hpp"

namespace zero::detail {

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

CgroupDirs cgroup_dirs(const std::string& controller) {
  std::ifstream in("/proc/self/cgroup");
  std::string line, v1, v2;
  bool has_v2 = false;
  while (std::getline(in, line)) {
    const std::size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (controllers == controller) v1 = path;
    if (line.compare(0, 3, "0::") == 0) {
      v2 = path;
      has_v2 = true;
    }
  }
  CgroupDirs out;
  const auto walk = [&](const std::string& root, std::string path) {
    while (true) {
      out.dirs.push_back(root + path);
      if (path.empty() || path == "/") break;
      const std::size_t slash = path.rfind('/');
      path = slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
    }
  };
  if (!v1.empty()) {
    out.v1 = true;
    walk("/sys/fs/cgroup/" + controller, v1);
  } else if (has_v2) {
    walk("/sys/fs/cgroup", v2);
  }
  return out;
}

namespace {

// A "Key: value" line of a /proc status file.
std::optional<std::size_t> status_value(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, key.size(), key) != 0) continue;
    try {
      return static_cast<std::size_t>(std::stoull(line.substr(key.size())));
    } catch (...) {
      return std::nullopt;
    }
  }
  return std::nullopt;
}

std::size_t lines_of(const std::string& path) {
  std::ifstream in(path);
  std::size_t n = 0;
  for (std::string line; std::getline(in, line);) ++n;
  return n;
}

// Threads of every process whose real user is `uid` (what RLIMIT_NPROC counts).
std::size_t threads_of_user(uid_t uid) {
  std::size_t n = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string pid = e.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string status = e.path().string() + "/status";
    const std::optional<std::size_t> real = status_value(status, "Uid:");
    if (real && *real == uid) n += status_value(status, "Threads:").value_or(0);
  }
  return n;
}

}  // namespace

ThreadRoom thread_room() {
  ThreadRoom best{std::numeric_limits<std::size_t>::max(), "no limit found"};
  const auto consider = [&](std::size_t limit, std::size_t used, std::size_t per_thread,
                            const std::string& what) {
    const std::size_t room = (limit > used ? limit - used : 0) / per_thread;
    if (room < best.threads) best = {room, cat(what, " ", limit, ", ", used, " in use")};
  };
  // /proc/loadavg's fourth field: "running/total" scheduling entities (threads) of the system.
  {
    std::ifstream in("/proc/loadavg");
    std::string a, b, c, entities;
    const std::optional<std::size_t> max = read_number("/proc/sys/kernel/threads-max");
    if (max && (in >> a >> b >> c >> entities) && entities.find('/') != std::string::npos) {
      consider(*max, std::stoull(entities.substr(entities.find('/') + 1)), 1, "kernel.threads-max");
    }
  }
  rlimit nproc{};
  if (::geteuid() != 0 && ::getrlimit(RLIMIT_NPROC, &nproc) == 0 &&
      nproc.rlim_cur != RLIM_INFINITY) {
    consider(static_cast<std::size_t>(nproc.rlim_cur), threads_of_user(::getuid()), 1,
             "RLIMIT_NPROC (ulimit -u)");
  }
  const CgroupDirs pids = cgroup_dirs("pids");
  for (const std::string& dir : pids.dirs) {
    const std::optional<std::size_t> max = read_number(dir + "/pids.max");
    if (max)
      consider(*max, read_number(dir + "/pids.current").value_or(0), 1,
               "pids cgroup " + dir + ": pids.max");
  }
  if (const std::optional<std::size_t> maps = read_number("/proc/sys/vm/max_map_count")) {
    consider(*maps, lines_of("/proc/self/maps"), 2,
             "vm.max_map_count (2 mappings per thread stack)");
  }
  return best;
}

}  // namespace zero::detail
