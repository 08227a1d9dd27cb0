// ckpt/file_io.hpp — the checkpoint's file primitives: a checksummed sequential writer that
// fsyncs, a whole-file digest, positioned reads, atomic small files and directory fsync. Every
// error is zero::Error(kIO or kCorruption) naming the file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace zero::ckpt::detail {

// Size and XXH3-64 of a file's bytes.
struct Digest {
  std::size_t size = 0;
  std::uint64_t xxh3 = 0;
};
std::string to_hex(std::uint64_t v);
// Parses 16 hex digits; throws kCorruption naming `what` otherwise.
std::uint64_t from_hex(const std::string& s, const std::string& what);
std::uint64_t xxh3(const void* data, std::size_t bytes);

// Writes a new file sequentially through a buffer, hashing as it goes. finish() flushes,
// fsyncs and closes; the destructor of an unfinished writer closes and removes the file.
class FileWriter {
 public:
  explicit FileWriter(std::string path, std::size_t buffer_bytes = std::size_t{8} << 20);
  ~FileWriter();
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;
  void write(const void* data, std::size_t bytes);
  std::size_t offset() const noexcept { return size_; }
  Digest finish();
  const std::string& path() const noexcept { return path_; }

 private:
  void flush();
  std::string path_;
  int fd_ = -1;
  std::vector<char> buf_;
  std::size_t used_ = 0;
  std::size_t size_ = 0;
  void* state_ = nullptr;  // XXH3_state_t
};

// The whole file's digest, read sequentially. kIO naming the file when it cannot be read.
Digest digest_file(const std::string& path);
// Checks `path` against an expected size and checksum: kIO (missing), kCorruption (a size or
// checksum mismatch), each naming the file.
void verify_file(const std::string& path, const Digest& expected);

// Positioned reads from one file; a short read is kCorruption naming the file.
class FileReader {
 public:
  explicit FileReader(std::string path);
  ~FileReader();
  FileReader(const FileReader&) = delete;
  FileReader& operator=(const FileReader&) = delete;
  void read(std::size_t offset, void* dst, std::size_t bytes) const;
  std::size_t size() const noexcept { return size_; }

 private:
  std::string path_;
  int fd_ = -1;
  std::size_t size_ = 0;
};

// Reads a whole (small) file; kIO naming it when missing, kCorruption when over `max_bytes`.
std::string read_file(const std::string& path, std::size_t max_bytes = std::size_t{256} << 20);
// Writes `bytes` to dir/name atomically: dir/name.tmp written and fsync'd, renamed over
// dir/name, the directory fsync'd.
void write_file_atomic(const std::string& dir, const std::string& name, const std::string& bytes);
void fsync_dir(const std::string& dir);

}  // namespace zero::ckpt::detail
