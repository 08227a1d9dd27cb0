// zero/core/error.hpp — the one exception type of the library.
//
// Every failure the library reports is a zero::Error carrying a code (what kind of failure) and
// a message that names what was wrong (config key, file and offset, rank, size). All throws go
// through ZERO_THROW / ZERO_CHECK, which record the file and line of the throw site.
// The library never ends the process (no exit, no abort) on a user error.
//
// Thread safety: Error is an immutable value; copying and reading it is safe from any thread.
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace zero {

enum class ErrorCode : std::uint8_t {
  kInvalidArgument,  // a caller passed a bad value (size, pointer, dtype, unit id, ...)
  kConfig,           // a configuration key is unknown, mistyped, out of range or contradictory
  kCommunication,    // a collective failed in its backend (MPI/NCCL error)
  kTimeout,          // a wait ran past its deadline
  kRemoteFailure,    // another rank failed; this rank cannot go on with the collective
  kIO,               // a file operation failed (open, short read/write, ENOSPC, EIO)
  kCorruption,       // data read back is not what was written (size, checksum, truncation)
  kOutOfMemory,      // an allocation failed
  kCuda,             // a CUDA / cuBLAS runtime call failed
  kInternal,         // a broken invariant inside the library: a bug
};

// Stable lower-case name of a code ("invalid argument", "config", ...).
std::string_view to_string(ErrorCode code) noexcept;

class Error : public std::runtime_error {
 public:
  // what() is "<code>: <message> [<file>:<line>]".
  Error(ErrorCode code, std::string message, const char* file = "", int line = 0);

  ErrorCode code() const noexcept { return code_; }
  // The message without the code prefix and the location suffix.
  const std::string& message() const noexcept { return message_; }
  const char* file() const noexcept { return file_; }
  int line() const noexcept { return line_; }

 private:
  ErrorCode code_;
  std::string message_;
  const char* file_;
  int line_;
};

// For a program's main, called inside `catch (...)`: writes the exception in flight as one line,
// "<program>: <what>" on stderr (line breaks folded into "; ", at most ~2 KB: a message that
// echoes hostile input stays bounded), and returns the exit status 2. Any exception type:
// zero::Error, std::exception, anything else. Every binary of the project ends its main with
//   int main(int argc, char** argv) try { ... } catch (...) { return zero::report_exception("x"); }
int report_exception(std::string_view program) noexcept;

namespace detail {
// The single throw path (oneTBB funnels its throws the same way): keeps the throw out of line.
[[noreturn]] void throw_error(ErrorCode code, std::string message, const char* file, int line);

// Builds a message from stream-able pieces: ZERO_THROW(kConfig, "key ", key, " = ", value).
template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace zero

// Throws zero::Error with code zero::ErrorCode::<code> and the concatenated message pieces.
#define ZERO_THROW(code, ...)                                                                      \
  ::zero::detail::throw_error(::zero::ErrorCode::code, ::zero::detail::cat(__VA_ARGS__), __FILE__, \
                              __LINE__)

// Throws unless cond holds.
#define ZERO_CHECK(cond, code, ...)  \
  do {                               \
    if (!(cond)) [[unlikely]] {      \
      ZERO_THROW(code, __VA_ARGS__); \
    }                                \
  } while (0)
