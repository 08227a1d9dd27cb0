#include "zero/core/log.hpp"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace zero {

namespace {
std::atomic<int>& level_storage() {
  static std::atomic<int> level = [] {
    const char* env = std::getenv("ZERO_LOG_LEVEL");
    if (env == nullptr || *env == '\0') return static_cast<int>(LogLevel::kWarn);
    try {
      return static_cast<int>(parse_log_level(env));
    } catch (const Error&) {
      std::fprintf(
          stderr,
          "[zero] ZERO_LOG_LEVEL=%s is not a level (error|warn|info|debug|trace); using warn\n",
          env);
      return static_cast<int>(LogLevel::kWarn);
    }
  }();
  return level;
}
thread_local int t_rank = -1;

const char* level_name(LogLevel l) {
  switch (l) {
    case LogLevel::kError: return "E";
    case LogLevel::kWarn: return "W";
    case LogLevel::kInfo: return "I";
    case LogLevel::kDebug: return "D";
    case LogLevel::kTrace: return "T";
  }
  return "?";
}
}  // namespace

LogLevel log_level() noexcept {
  return static_cast<LogLevel>(level_storage().load(std::memory_order_relaxed));
}
void set_log_level(LogLevel level) noexcept { level_storage().store(static_cast<int>(level)); }

LogLevel parse_log_level(std::string_view name) {
  if (name == "error") return LogLevel::kError;
  if (name == "warn" || name == "warning") return LogLevel::kWarn;
  if (name == "info") return LogLevel::kInfo;
  if (name == "debug") return LogLevel::kDebug;
  if (name == "trace") return LogLevel::kTrace;
  ZERO_THROW(kInvalidArgument, "unknown log level '", std::string(name),
             "' (expected error, warn, info, debug or trace)");
}

void set_log_rank(int rank) noexcept { t_rank = rank; }
int log_rank() noexcept { return t_rank; }

void log_line(LogLevel level, std::string_view message) {
  std::string line = "[zero ";
  line += level_name(level);
  if (t_rank >= 0) {
    line += " rank ";
    line += std::to_string(t_rank);
  }
  line += "] ";
  line += message;
  line += '\n';
  // One write(2) per line so lines from rank threads never interleave.
  (void)!::write(STDERR_FILENO, line.data(), line.size());
}

}  // namespace zero
