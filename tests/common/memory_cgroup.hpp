// tests/common/memory_cgroup.hpp — a child memory cgroup of this process's own, with a limit, to
// run a command in (cgroup v1 or v2): for the tests that show a run is refused at start instead of
// being killed by the kernel. `usable()` false (with why()) where cgroups cannot be made here (no
// memory controller, read-only, no permission): the tests skip saying so.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "common/run_command.hpp"
#include "core/process_limits.hpp"

namespace zero::testing {

class MemoryCgroup {
 public:
  explicit MemoryCgroup(std::size_t limit_bytes) {
    const detail::CgroupDirs cg = detail::cgroup_dirs("memory");
    if (cg.dirs.empty()) {
      why_ = "no memory cgroup in /proc/self/cgroup";
      return;
    }
    const std::string parent = cg.dirs.front();  // this process's own
    const std::string limit_file = cg.v1 ? "memory.limit_in_bytes" : "memory.max";
    dir_ = parent + "/zero_test_" + std::to_string(::getpid());
    if (::mkdir(dir_.c_str(), 0755) != 0) {
      why_ = "cannot create " + dir_;
      dir_.clear();
      return;
    }
    std::ofstream limit(dir_ + "/" + limit_file);
    limit << limit_bytes;
    limit.close();
    if (!limit) {
      why_ = "cannot set " + dir_ + "/" + limit_file;
      return;
    }
    usable_ = true;
  }
  ~MemoryCgroup() {
    if (!dir_.empty()) ::rmdir(dir_.c_str());
  }
  MemoryCgroup(const MemoryCgroup&) = delete;
  MemoryCgroup& operator=(const MemoryCgroup&) = delete;

  bool usable() const { return usable_; }
  const std::string& why() const { return why_; }
  const std::string& dir() const { return dir_; }

  // `cmd` (a shell command line) run inside the cgroup: the shell moves itself in, then execs.
  CmdResult run(const std::string& cmd) const {
    return run_command("sh -c 'echo $$ > " + dir_ + "/cgroup.procs && exec " + cmd + "'");
  }

 private:
  std::string dir_, why_;
  bool usable_ = false;
};

}  // namespace zero::testing
