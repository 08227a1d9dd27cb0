#include "zero/core/error.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>

namespace zero {

std::string_view to_string(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kConfig: return "config";
    case ErrorCode::kCommunication: return "communication";
    case ErrorCode::kTimeout: return "timeout";
    case ErrorCode::kRemoteFailure: return "remote failure";
    case ErrorCode::kIO: return "I/O";
    case ErrorCode::kCorruption: return "corruption";
    case ErrorCode::kOutOfMemory: return "out of memory";
    case ErrorCode::kCuda: return "CUDA";
    case ErrorCode::kInternal: return "internal";
  }
  return "unknown";
}

namespace {
std::string format_what(ErrorCode code, const std::string& message, const char* file, int line) {
  std::string out(to_string(code));
  out += ": ";
  out += message;
  if (file != nullptr && *file != '\0') {
    // Only the base name: full build paths make messages unreadable.
    const char* base = std::strrchr(file, '/');
    out += " [";
    out += base != nullptr ? base + 1 : file;
    out += ':';
    out += std::to_string(line);
    out += ']';
  }
  return out;
}
}  // namespace

Error::Error(ErrorCode code, std::string message, const char* file, int line)
    : std::runtime_error(format_what(code, message, file, line)),
      code_(code),
      message_(std::move(message)),
      file_(file != nullptr ? file : ""),
      line_(line) {}

int report_exception(std::string_view program) noexcept {
  try {
    std::string what = "unknown exception (not derived from std::exception)";
    if (const std::exception_ptr current = std::current_exception(); !current) {
      what = "failed (report_exception called with no exception in flight)";
    } else {
      try {
        std::rethrow_exception(current);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
    }
    constexpr std::size_t kMax = 2000;
    std::string line;
    line.reserve(std::min(what.size(), kMax) + 8);
    for (char c : what) {
      if (line.size() >= kMax) {
        line += " ...";
        break;
      }
      if (c == '\n' || c == '\r') {
        if (!line.empty() && line.back() != ' ') line += "; ";
      } else {
        line += c;
      }
    }
    std::fprintf(stderr, "%.*s: %s\n", static_cast<int>(program.size()), program.data(),
                 line.c_str());
  } catch (...) {  // no memory left for the line
    std::fprintf(stderr, "%.*s: failed (the error message could not be formatted)\n",
                 static_cast<int>(program.size()), program.data());
  }
  return 2;
}

namespace detail {
void throw_error(ErrorCode code, std::string message, const char* file, int line) {
  throw Error(code, std::move(message), file, line);
}
}  // namespace detail

}  // namespace zero
