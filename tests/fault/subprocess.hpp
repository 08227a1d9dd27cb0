// tests/fault/subprocess.hpp — runs a command as a subprocess with a watchdog, for the fault
// tests: its output (stdout and stderr together) goes to a file with no name (memfd: nothing to
// remove, whatever happens to the test), and the whole process group is killed when the watchdog
// expires. Thread safety: each call is independent (a test runs one per thread).
#pragma once

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace zero::testing {

struct SubprocessResult {
  bool watchdog_fired = false;
  bool exited = false;        // else killed by a signal
  int status = -1;            // exit status, or the signal
  double seconds = 0;         // from start to exit
  double end_realtime_s = 0;  // CLOCK_REALTIME at exit, comparable with the program's t=
  std::string output;
};

inline double realtime_now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Runs argv[0] (searched in PATH) with argv; kills its process group after `watchdog_s`.
inline SubprocessResult run_subprocess(const std::vector<std::string>& argv, double watchdog_s) {
  const int out_fd = ::memfd_create("zero-fault-out", 0);
  SubprocessResult r;
  if (out_fd < 0) {
    r.output = "memfd_create failed";
    return r;
  }
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    ::dup2(out_fd, 1);
    ::dup2(out_fd, 2);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    std::perror("execvp");
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here: no race with the child's own call
  int wstatus = 0;
  for (;;) {
    const pid_t done = ::waitpid(pid, &wstatus, WNOHANG);
    if (done == pid) break;
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (elapsed > watchdog_s && !r.watchdog_fired) {
      r.watchdog_fired = true;
      ::kill(-pid, SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  r.end_realtime_s = realtime_now_s();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.exited = WIFEXITED(wstatus);
  r.status = r.exited ? WEXITSTATUS(wstatus) : WTERMSIG(wstatus);
  if (!r.watchdog_fired) ::kill(-pid, SIGKILL);  // whatever it left behind in its group
  // The child's writes moved the offset it shares with out_fd: read from the start.
  ::lseek(out_fd, 0, SEEK_SET);
  char buf[4096];
  for (ssize_t n; (n = ::read(out_fd, buf, sizeof buf)) > 0;) {
    r.output.append(buf, static_cast<std::size_t>(n));
  }
  ::close(out_fd);
  return r;
}

// The value after "t=" on the first line that contains `marker`; -1 if none.
inline double time_on_line(const std::string& output, const std::string& marker) {
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    if (line.find(marker) == std::string::npos) continue;
    const std::size_t at = line.find(" t=");
    if (at != std::string::npos) return std::stod(line.substr(at + 3));
  }
  return -1;
}

// The first line containing `marker`, or "".
inline std::string line_with(const std::string& output, const std::string& marker) {
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    if (line.find(marker) != std::string::npos) return line;
  }
  return "";
}

}  // namespace zero::testing
