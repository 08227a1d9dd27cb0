// tests/common/expect_error.hpp — the one check that a call fails with a zero::Error of a given
// code whose message names what was wrong. Thread safety: GoogleTest's assertions (any thread).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "zero/core/error.hpp"

namespace zero::testing {

// f() must throw zero::Error with `code` and a message containing `needle`.
template <typename F>
void expect_error(F&& f, ErrorCode code, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(e.message().find(needle), std::string::npos) << e.what();
  }
}

}  // namespace zero::testing
