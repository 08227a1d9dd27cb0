// tests/common/load_slack.hpp — the seconds a test allows for what a loaded machine adds to a
// duration it checks: starting and tearing down a process, a thread waiting for a core, a kernel
// worker freeing a process's files. The suite holds with two busy processes beside it on a 2-core
// machine. A check that something ended within a bound adds this slack to the bound; a check
// that something did not wait for a timeout sets that timeout above the slack, so the check
// still tells the two apart. ZERO_TEST_LOAD_SLACK_S overrides (a slower machine).
#pragma once

#include <cstdlib>

namespace zero::testing {

inline constexpr double kDefaultLoadSlackS = 10.0;

inline double load_slack_s() {
  if (const char* s = std::getenv("ZERO_TEST_LOAD_SLACK_S")) {
    const double v = std::atof(s);
    if (v > 0) return v;
  }
  return kDefaultLoadSlackS;
}

// A collective timeout that a prompt failure must beat: three slacks.
inline double timeout_above_slack_s() { return 3 * load_slack_s(); }

}  // namespace zero::testing
