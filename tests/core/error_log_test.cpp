// zero::Error carries code, message and throw site; logging levels parse and filter.
#include <gtest/gtest.h>

#include <string>

#include "zero/core/error.hpp"
#include "zero/core/log.hpp"

namespace zero {
namespace {

TEST(Error, CarriesCodeMessageAndThrowSite) {
  try {
    ZERO_THROW(kIO, "short write to '", "/tmp/x", "' at offset ", 4096);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIO);
    EXPECT_EQ(e.message(), "short write to '/tmp/x' at offset 4096");
    EXPECT_EQ(std::string(e.file()).find("error_log_test.cpp") != std::string::npos, true);
    EXPECT_GT(e.line(), 0);
    const std::string w = e.what();
    EXPECT_EQ(w.rfind("I/O: short write", 0), 0u) << w;
    EXPECT_NE(w.find("[error_log_test.cpp:"), std::string::npos) << w;
  }
}

TEST(Error, CheckThrowsOnlyWhenTheConditionFails) {
  EXPECT_NO_THROW(ZERO_CHECK(1 + 1 == 2, kInternal, "never"));
  EXPECT_THROW(ZERO_CHECK(1 + 1 == 3, kInternal, "always"), Error);
  for (auto c :
       {ErrorCode::kInvalidArgument, ErrorCode::kConfig, ErrorCode::kCommunication,
        ErrorCode::kTimeout, ErrorCode::kRemoteFailure, ErrorCode::kIO, ErrorCode::kCorruption,
        ErrorCode::kOutOfMemory, ErrorCode::kCuda, ErrorCode::kInternal}) {
    EXPECT_NE(to_string(c), "unknown");
  }
}

TEST(Log, LevelsParseFilterAndCarryTheRank) {
  EXPECT_EQ(parse_log_level("debug"), LogLevel::kDebug);
  EXPECT_THROW(parse_log_level("loud"), Error);
  const LogLevel saved = log_level();
  set_log_level(LogLevel::kInfo);
  set_log_rank(3);
  testing::internal::CaptureStderr();
  ZERO_LOG(kInfo, "hello ", 42);
  ZERO_LOG(kDebug, "hidden");
  const std::string out = testing::internal::GetCapturedStderr();
  EXPECT_EQ(out, "[zero I rank 3] hello 42\n");
  set_log_rank(-1);
  set_log_level(saved);
}

}  // namespace
}  // namespace zero
