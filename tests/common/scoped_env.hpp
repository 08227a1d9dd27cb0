// tests/common/scoped_env.hpp — environment variables set for one scope and put back as they were
// after it (the earlier value, or unset), for the tests of what the library reads from the
// environment (ZERO_STAGE, ZERO_SET, the launcher's RANK / WORLD_SIZE, ...).
//
// Thread safety: none. setenv/getenv race with every thread that reads the environment; make and
// destroy a ScopedEnv on the test's thread while no other thread of the test runs.
#pragma once

#include <stdlib.h>

#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace zero::testing {

class ScopedEnv {
 public:
  // Sets each (name, value) in order.
  ScopedEnv(std::initializer_list<std::pair<std::string, std::string>> vars) {
    for (const auto& [k, v] : vars) {
      const char* old = ::getenv(k.c_str());
      saved_.emplace_back(k, old != nullptr ? std::optional<std::string>(old) : std::nullopt);
      ::setenv(k.c_str(), v.c_str(), 1);
    }
  }
  ScopedEnv(const char* name, const std::string& value) : ScopedEnv({{name, value}}) {}
  // Restores in reverse order, so a name set twice gets its first earlier value back.
  ~ScopedEnv() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->second) {
        ::setenv(it->first.c_str(), it->second->c_str(), 1);
      } else {
        ::unsetenv(it->first.c_str());
      }
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

}  // namespace zero::testing
