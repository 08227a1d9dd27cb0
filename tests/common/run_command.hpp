// tests/common/run_command.hpp — runs a program as a user would (through the shell) and keeps its
// exit status and its output (stdout and stderr together), for the tests of the programs and the
// examples. Files the program writes go where the test says (tests/common/temp_dir.hpp).
// Thread safety: popen/pclose; one call per thread.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace zero::testing {

struct CmdResult {
  int status = -1;  // exit status; -1: did not exit normally (signal) or could not start
  std::string out;
};

inline CmdResult run_command(const std::string& cmd) {
  CmdResult r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  std::size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

}  // namespace zero::testing
