#include "ckpt/file_io.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "zero/core/error.hpp"

namespace zero::ckpt::detail {

namespace {
std::string errno_text() { return std::strerror(errno); }
XXH3_state_t* st(void* p) { return static_cast<XXH3_state_t*>(p); }
}  // namespace

std::string to_hex(std::uint64_t v) {
  static const char* digits = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[static_cast<std::size_t>(i)] = digits[v & 15];
  return s;
}

std::uint64_t from_hex(const std::string& s, const std::string& what) {
  ZERO_CHECK(s.size() == 16, kCorruption, what, ": '", s.substr(0, 40),
             "' is not a 16-digit hex checksum");
  std::uint64_t v = 0;
  for (char c : s) {
    int d = -1;
    if (c >= '0' && c <= '9') d = c - '0';
    if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    ZERO_CHECK(d >= 0, kCorruption, what, ": '", s, "' is not a 16-digit hex checksum");
    v = (v << 4) | static_cast<std::uint64_t>(d);
  }
  return v;
}

std::uint64_t xxh3(const void* data, std::size_t bytes) { return XXH3_64bits(data, bytes); }

// ---- FileWriter

FileWriter::FileWriter(std::string path, std::size_t buffer_bytes)
    : path_(std::move(path)), buf_(buffer_bytes) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ZERO_CHECK(fd_ >= 0, kIO, "checkpoint: cannot create '", path_, "': ", errno_text());
  state_ = XXH3_createState();
  ZERO_CHECK(state_ != nullptr, kOutOfMemory, "checkpoint: XXH3 state for '", path_, "'");
  XXH3_64bits_reset(st(state_));
}

FileWriter::~FileWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(path_.c_str());
  }
  if (state_ != nullptr) XXH3_freeState(st(state_));
}

void FileWriter::flush() {
  std::size_t done = 0;
  while (done < used_) {
    const ssize_t n = ::write(fd_, buf_.data() + done, used_ - done);
    if (n < 0 && errno == EINTR) continue;
    ZERO_CHECK(n > 0, kIO, "checkpoint: writing '", path_, "' at byte ", size_ - used_ + done,
               " failed: ", n < 0 ? errno_text() : std::string("no progress"));
    done += static_cast<std::size_t>(n);
  }
  used_ = 0;
}

void FileWriter::write(const void* data, std::size_t bytes) {
  ZERO_CHECK(fd_ >= 0, kInvalidArgument, "checkpoint: '", path_, "' is already finished");
  XXH3_64bits_update(st(state_), data, bytes);
  const char* p = static_cast<const char*>(data);
  size_ += bytes;
  while (bytes > 0) {
    const std::size_t take = std::min(bytes, buf_.size() - used_);
    std::memcpy(buf_.data() + used_, p, take);
    used_ += take;
    p += take;
    bytes -= take;
    if (used_ == buf_.size()) flush();
  }
}

Digest FileWriter::finish() {
  flush();
  ZERO_CHECK(::fsync(fd_) == 0, kIO, "checkpoint: fsync of '", path_, "' failed: ", errno_text());
  const int rc = ::close(fd_);
  fd_ = -1;
  ZERO_CHECK(rc == 0, kIO, "checkpoint: closing '", path_, "' failed: ", errno_text());
  return {size_, XXH3_64bits_digest(st(state_))};
}

// ---- reading

Digest digest_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ZERO_CHECK(fd >= 0, kIO, "checkpoint file '", path, "' cannot be opened: ", errno_text());
  XXH3_state_t* s = XXH3_createState();
  XXH3_64bits_reset(s);
  std::vector<char> buf(std::size_t{8} << 20);
  Digest d;
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::string e = errno_text();
      ::close(fd);
      XXH3_freeState(s);
      ZERO_THROW(kIO, "checkpoint file '", path, "': read failed: ", e);
    }
    if (n == 0) break;
    XXH3_64bits_update(s, buf.data(), static_cast<std::size_t>(n));
    d.size += static_cast<std::size_t>(n);
  }
  ::close(fd);
  d.xxh3 = XXH3_64bits_digest(s);
  XXH3_freeState(s);
  return d;
}

void verify_file(const std::string& path, const Digest& expected) {
  struct stat sb {};
  ZERO_CHECK(::stat(path.c_str(), &sb) == 0, kIO, "checkpoint file '", path,
             "' is missing: ", errno_text());
  ZERO_CHECK(static_cast<std::size_t>(sb.st_size) == expected.size, kCorruption,
             "checkpoint file '", path, "' has ", sb.st_size, " bytes; the manifest says ",
             expected.size, " (truncated or overwritten)");
  const Digest got = digest_file(path);
  ZERO_CHECK(got.size == expected.size, kCorruption, "checkpoint file '", path, "': read ",
             got.size, " bytes; the manifest says ", expected.size);
  ZERO_CHECK(got.xxh3 == expected.xxh3, kCorruption, "checkpoint file '", path,
             "' is corrupted: XXH3-64 ", to_hex(got.xxh3), ", the manifest says ",
             to_hex(expected.xxh3));
}

FileReader::FileReader(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  ZERO_CHECK(fd_ >= 0, kIO, "checkpoint file '", path_, "' cannot be opened: ", errno_text());
  struct stat sb {};
  ::fstat(fd_, &sb);
  size_ = static_cast<std::size_t>(sb.st_size);
}

FileReader::~FileReader() {
  if (fd_ >= 0) ::close(fd_);
}

void FileReader::read(std::size_t offset, void* dst, std::size_t bytes) const {
  char* p = static_cast<char*>(dst);
  std::size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::pread(fd_, p + done, bytes - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    ZERO_CHECK(n >= 0, kIO, "checkpoint file '", path_, "': read at byte ", offset + done,
               " failed: ", errno_text());
    ZERO_CHECK(n > 0, kCorruption, "checkpoint file '", path_, "' ends at byte ", offset + done,
               "; ", offset + bytes, " expected (truncated)");
    done += static_cast<std::size_t>(n);
  }
}

std::string read_file(const std::string& path, std::size_t max_bytes) {
  FileReader r(path);
  ZERO_CHECK(r.size() <= max_bytes, kCorruption, "checkpoint file '", path, "' has ", r.size(),
             " bytes, more than the ", max_bytes, " expected");
  std::string s(r.size(), '\0');
  r.read(0, s.data(), s.size());
  return s;
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ZERO_CHECK(fd >= 0, kIO, "checkpoint: cannot open directory '", dir, "': ", errno_text());
  const int rc = ::fsync(fd);
  const std::string e = rc != 0 ? errno_text() : std::string();
  ::close(fd);
  ZERO_CHECK(rc == 0, kIO, "checkpoint: fsync of directory '", dir, "' failed: ", e);
}

void write_file_atomic(const std::string& dir, const std::string& name, const std::string& bytes) {
  const std::string tmp = dir + "/" + name + ".tmp";
  {
    FileWriter w(tmp, std::max<std::size_t>(bytes.size(), 1));
    w.write(bytes.data(), bytes.size());
    w.finish();
  }
  const std::string dst = dir + "/" + name;
  ZERO_CHECK(::rename(tmp.c_str(), dst.c_str()) == 0, kIO, "checkpoint: renaming '", tmp, "' to '",
             dst, "' failed: ", errno_text());
  fsync_dir(dir);
}

}  // namespace zero::ckpt::detail
