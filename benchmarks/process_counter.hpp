// benchmarks/process_counter.hpp — one perf_event_open counter summed over every thread of the
// process: instructions retired in user space (a hardware counter) or CPU time (task-clock, a
// software counter the kernel keeps, present in VMs too). One counter per thread that exists
// when the counter is made (make it after a warm-up, so that oneTBB's workers are there; threads
// started later are not counted). Where the host has no such counter (no PMU in a VM,
// perf_event_paranoid, a seccomp filter) available() is false and why_unavailable() says why: a
// benchmark says so rather than print a figure it did not measure.
//
// Thread safety: one thread drives a counter (start / stop / total); the counted threads may be
// any of the process's.
#pragma once

#include <dirent.h>
#include <linux/perf_event.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace zero::bench {

class ProcessCounter {
 public:
  enum class Kind { kInstructions, kTaskClockNs };

  explicit ProcessCounter(Kind kind) {
    const char* name =
        kind == Kind::kInstructions ? "PERF_COUNT_HW_INSTRUCTIONS" : "PERF_COUNT_SW_TASK_CLOCK";
    DIR* dir = opendir("/proc/self/task");
    if (dir == nullptr) {
      why_ = std::string("/proc/self/task: ") + std::strerror(errno);
      return;
    }
    while (const dirent* e = readdir(dir)) {
      if (e->d_name[0] == '.') continue;
      perf_event_attr attr{};
      attr.size = sizeof attr;
      attr.type = kind == Kind::kInstructions ? PERF_TYPE_HARDWARE : PERF_TYPE_SOFTWARE;
      attr.config = kind == Kind::kInstructions
                        ? static_cast<std::uint64_t>(PERF_COUNT_HW_INSTRUCTIONS)
                        : static_cast<std::uint64_t>(PERF_COUNT_SW_TASK_CLOCK);
      attr.disabled = 1;
      attr.exclude_kernel = 1;
      attr.exclude_hv = 1;
      const long fd = syscall(SYS_perf_event_open, &attr, std::atoi(e->d_name), -1, -1, 0);
      if (fd < 0) {
        const int err = errno;
        why_ = std::string("perf_event_open(") + name + "): " + std::strerror(err);
        if (err == ENOENT || err == ENODEV || err == EOPNOTSUPP) {
          why_ += " (no hardware counters: a VM without a virtual PMU?)";
        } else if (err == EACCES || err == EPERM) {
          why_ += " (see /proc/sys/kernel/perf_event_paranoid)";
        }
        break;
      }
      fds_.push_back(static_cast<int>(fd));
    }
    closedir(dir);
    if (!why_.empty()) close_all();
  }
  ~ProcessCounter() { close_all(); }
  ProcessCounter(const ProcessCounter&) = delete;
  ProcessCounter& operator=(const ProcessCounter&) = delete;

  bool available() const { return !fds_.empty(); }
  const std::string& why_unavailable() const { return why_; }
  void start() {
    for (int fd : fds_) ioctl(fd, PERF_EVENT_IOC_ENABLE, 0);
  }
  void stop() {
    for (int fd : fds_) ioctl(fd, PERF_EVENT_IOC_DISABLE, 0);
  }
  // What was counted while started, all threads: instructions, or nanoseconds of CPU time.
  double total() const {
    double sum = 0;
    for (int fd : fds_) {
      std::uint64_t v = 0;
      if (read(fd, &v, sizeof v) == static_cast<ssize_t>(sizeof v)) sum += static_cast<double>(v);
    }
    return sum;
  }

 private:
  void close_all() {
    for (int fd : fds_) close(fd);
    fds_.clear();
  }
  std::vector<int> fds_;
  std::string why_;
};

}  // namespace zero::bench
