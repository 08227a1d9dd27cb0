// core/process_limits.hpp — what the kernel lets this process take, read from /proc and
// /sys: the directories of its cgroup for a controller (leaf first, then each ancestor: a limit
// anywhere above binds too), and how many more threads it may start.
//
// Thread safety: pure functions (they read files).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace zero::detail {

// A number from the first word of a file ("max", missing, or not a number: nullopt).
std::optional<std::size_t> read_number(const std::string& path);

// The process's cgroup directories for `controller` ("memory", "pids"), leaf to root: under
// /sys/fs/cgroup/<controller> when the controller is mounted as cgroup v1, else the unified
// (v2) hierarchy. `v1` tells which (the limit files are named differently). Empty when neither.
struct CgroupDirs {
  std::vector<std::string> dirs;
  bool v1 = false;
};
CgroupDirs cgroup_dirs(const std::string& controller);

// How many more threads this process may start now, and the limit that binds: the smallest of
// kernel.threads-max less the threads running, RLIMIT_NPROC less this user's threads (not for
// root, whom it does not bind), the pids cgroup's pids.max less pids.current at every level,
// and vm.max_map_count less this process's mappings, over the two each thread's stack takes
// (the stack and its guard page). `from`: "vm.max_map_count 65530: 2 mappings per thread
// stack, 412 in use" and the like.
struct ThreadRoom {
  std::size_t threads = 0;
  std::string from;
};
ThreadRoom thread_room();

}  // namespace zero::detail
