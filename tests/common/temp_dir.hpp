// tests/common/temp_dir.hpp — the one place a test keeps its files: a fresh directory made with
// mkdtemp under $TMPDIR (/tmp when unset), named after the running test
// ("zero-<Suite>.<Test>[-tag]-XXXXXX"), and removed with everything in it when the object goes
// out of scope. Two runs of the suite at once never share a file, and a run leaves nothing
// behind; set ZERO_TEST_KEEP_TMP (to anything but "" or "0") to keep the directories for a
// look afterwards (their paths are printed).
//
// Programs a test starts (zero-train, mpirun, a child it kills) are given paths under path();
// a directory a killed child left half-written is still removed here, with any permissions
// the test took away given back first. A directory that cannot be removed is a test failure.
//
// Thread safety: one object per owner; path() may be read from any thread. Making and removing
// directories is safe from concurrent tests (mkdtemp picks a name no other process has).
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace zero::testing {

// The bytes of the file at `path` ("" when it cannot be read): what a program the test ran wrote.
inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Whether ZERO_TEST_KEEP_TMP asks to keep the test directories.
inline bool keep_test_tmp() {
  const char* v = std::getenv("ZERO_TEST_KEEP_TMP");
  return v != nullptr && *v != '\0' && std::string(v) != "0";
}

// `s` with every character a file name should not hold ('/' of parameterized tests above all,
// spaces) made '_', cut to `max` characters.
inline std::string file_name_part(std::string s, std::size_t max) {
  for (char& ch : s) {
    const bool plain = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                       (ch >= '0' && ch <= '9') || ch == '.' || ch == '-' || ch == '_';
    if (!plain) ch = '_';
  }
  if (s.size() > max) s.resize(max);
  return s;
}

// The running GoogleTest test as "Suite.Test" (in a suite's SetUpTestSuite: "Suite"; outside
// any: "test"), made a file name.
inline std::string test_dir_name() {
  std::string name = "test";
  const ::testing::UnitTest* unit = ::testing::UnitTest::GetInstance();
  if (const ::testing::TestInfo* t = unit->current_test_info()) {
    name = std::string(t->test_suite_name()) + "." + t->name();
  } else if (const ::testing::TestSuite* s = unit->current_test_suite()) {
    name = s->name();
  }
  // Room under NAME_MAX (255) for the prefix, a tag and mkdtemp's suffix.
  return file_name_part(name, 120);
}

class TempDir {
 public:
  // A directory named after the running test, plus `tag` when given (a test with several
  // directories names each).
  explicit TempDir(const std::string& tag = "") {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/zero-" +
                       test_dir_name() + (tag.empty() ? "" : "-" + file_name_part(tag, 100)) +
                       "-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) {
      ADD_FAILURE() << "mkdtemp(" << tmpl << "): " << std::strerror(errno);
      return;
    }
    path_ = std::move(tmpl);
  }
  ~TempDir() { remove(); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  // The directory ("" when it could not be made: the test has failed already).
  const std::string& path() const { return path_; }
  // path() + "/" + name.
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  // The full paths of what the directory holds, sorted.
  std::vector<std::string> files() const {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(path_)) {
      out.push_back(e.path().string());
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  // Removes the directory now (the destructor then does nothing); kept when ZERO_TEST_KEEP_TMP
  // is set.
  void remove() {
    if (path_.empty()) return;
    const std::string p = std::exchange(path_, std::string());
    if (keep_test_tmp()) {
      std::fprintf(stderr, "[zero test] kept %s (ZERO_TEST_KEEP_TMP)\n", p.c_str());
      return;
    }
    namespace fs = std::filesystem;
    std::error_code ec;
    fs::remove_all(p, ec);
    if (ec) {
      // A test may have taken the write or search permission away from a directory inside
      // (an unwritable checkpoint or swap folder): give it back everywhere, then try again.
      fs::permissions(p, fs::perms::owner_all, fs::perm_options::add, ec);
      for (auto it = fs::recursive_directory_iterator(
               p, fs::directory_options::skip_permission_denied, ec);
           !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
        std::error_code ignored;
        if (it->is_directory(ignored)) {
          fs::permissions(it->path(), fs::perms::owner_all, fs::perm_options::add, ignored);
        }
      }
      ec.clear();
      fs::remove_all(p, ec);
    }
    if (ec) ADD_FAILURE() << "could not remove the test directory " << p << ": " << ec.message();
  }

 private:
  std::string path_;
};

}  // namespace zero::testing
