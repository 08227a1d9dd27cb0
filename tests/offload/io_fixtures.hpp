// tests/offload/io_fixtures.hpp — what the offload tests do I/O with: the per-test directory for
// swap files (tests/common/temp_dir.hpp: under TMPDIR, else /tmp, the work disk, where O_DIRECT
// works; removed with its content at the end of the test), and 4096-aligned memory for O_DIRECT
// requests. Thread safety: one Aligned per user.
#pragma once

#include <stdlib.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "common/temp_dir.hpp"

namespace zero::testing {

// Aligned memory for O_DIRECT requests.
struct Aligned {
  explicit Aligned(std::size_t n)
      : mem(static_cast<char*>(std::aligned_alloc(4096, n)), &std::free), p(mem.get()), size(n) {}
  std::unique_ptr<char, decltype(&std::free)> mem;
  char* p;
  std::size_t size;
};

}  // namespace zero::testing
