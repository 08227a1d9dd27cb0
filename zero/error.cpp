#include "zero/error.hpp"

#include <cstring>

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

namespace detail {
void throw_error(ErrorCode code, std::string message, const char* file, int line) {
  throw Error(code, std::move(message), file, line);
}
}  // namespace detail

}  // namespace zero
