// common/files.hpp — the files zero-train and zero-bench write at the end of a run (traces,
// charts, tables): checked at the start, so that a mistyped directory fails before the run.
#pragma once

#include <filesystem>
#include <string>

#include "zero/core/error.hpp"

namespace zero::common {

// Throws kIO naming `what` and the path when the directory `path` would be written in does not
// exist (a bare file name: the working directory).
inline void require_directory_of(const std::string& path, const std::string& what) {
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  ZERO_CHECK(dir.empty() || std::filesystem::is_directory(dir), kIO, what, ": the directory of '",
             path, "' does not exist");
}

}  // namespace zero::common
