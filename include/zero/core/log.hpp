// zero/core/log.hpp — rank-prefixed, levelled logging to stderr; quiet by default.
//
// The level comes from ZERO_LOG_LEVEL (error | warn | info | debug | trace; default warn), read
// once, or set_log_level(). The rank prefix is per thread (in-process ranks are threads):
// set_log_rank() on each rank thread. Lines are written whole (one write per line).
//
// Thread safety: safe from any thread.
#pragma once

#include <string>
#include <string_view>

#include "zero/core/error.hpp"

namespace zero {

enum class LogLevel : int { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3, kTrace = 4 };

LogLevel log_level() noexcept;
void set_log_level(LogLevel level) noexcept;
// Throws zero::Error(kInvalidArgument) naming the string when it is not a level name.
LogLevel parse_log_level(std::string_view name);
// Rank printed in the prefix of this thread's lines; -1 = none.
void set_log_rank(int rank) noexcept;
int log_rank() noexcept;

void log_line(LogLevel level, std::string_view message);

}  // namespace zero

#define ZERO_LOG(level, ...)                                                                \
  do {                                                                                      \
    if (static_cast<int>(::zero::LogLevel::level) <= static_cast<int>(::zero::log_level())) \
      ::zero::log_line(::zero::LogLevel::level, ::zero::detail::cat(__VA_ARGS__));          \
  } while (0)
