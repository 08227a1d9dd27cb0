// tests/offload/io_fixtures.hpp — what the offload tests do I/O with: a fresh directory for swap
// files (under TMPDIR, else /tmp: the work disk, where O_DIRECT works), removed with its content
// at the end of the test, and 4096-aligned memory for O_DIRECT requests.
#pragma once

#include <stdlib.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include <gtest/gtest.h>

namespace zero::testing {

class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base != nullptr ? base : "/tmp") + "/zero-offload-XXXXXX";
    path_ = ::mkdtemp(tmpl.data());
    EXPECT_FALSE(path_.empty());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::permissions(path_, std::filesystem::perms::owner_all, ec);
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::vector<std::string> files() const {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(path_))
      out.push_back(e.path().string());
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  std::string path_;
};

// Aligned memory for O_DIRECT requests.
struct Aligned {
  explicit Aligned(std::size_t n)
      : mem(static_cast<char*>(std::aligned_alloc(4096, n)), &std::free), p(mem.get()), size(n) {}
  std::unique_ptr<char, decltype(&std::free)> mem;
  char* p;
  std::size_t size;
};

}  // namespace zero::testing
