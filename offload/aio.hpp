// offload/aio.hpp — asynchronous file I/O for the NVMe swapper: io_uring, or a pread/pwrite
// thread pool where io_uring is unavailable.
//
// A request (read or write of `bytes` at `offset` of one open file) is split into pieces of
// `block_size` bytes; up to `queue_depth` pieces are in flight at once. Pieces complete in the
// background (a reaper thread for io_uring, `thread_count` workers for the pool), so I/O
// proceeds while the caller computes. A short transfer is retried for the remainder; an error
// (EIO, ENOSPC, EFBIG, ...) or an end of file before the request's end is kept with its
// request and raised by wait() as zero::Error naming the operation, file, offset and bytes
// (kIO; kCorruption for a read past the end of a file, i.e. a truncated file).
//
// O_DIRECT files need `buf`, `bytes` and `offset` aligned to kDirectAlignment; the queue does
// not check (the kernel answers EINVAL, which is raised like any other error).
//
// Observed (AioOptions::observer): each request is one TraceLane::kNvme region, "nvme read" /
// "nvme write", from submit() to the completion of its last piece, stamped on the thread that
// sees it complete (the reaper or a pool worker), not when wait() is called; and its bytes are
// added to IoCounters::nvme_read / nvme_write before wait() can return. A failed request is a
// region without bytes (-1) and is not counted; a request of 0 bytes is neither. Without an
// observer: a branch on a flag per request and per piece.
//
// Thread safety: one AioQueue is used by one thread at a time (submit / wait); its background
// threads are internal. Distinct queues are independent.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/observe.hpp"

namespace zero {
struct AioConfig;
}  // namespace zero

namespace zero::offload {

// Alignment of O_DIRECT buffers, offsets and sizes on the machines we run on (4 KiB logical
// blocks; TOOLCHAIN.md: a 1-byte misalignment gives EINVAL).
inline constexpr std::size_t kDirectAlignment = 4096;

inline std::size_t align_up(std::size_t n, std::size_t a = kDirectAlignment) {
  return (n + a - 1) / a * a;
}

enum class IoKind : std::uint8_t { kRead, kWrite };

struct AioOptions {
  std::size_t block_size = std::size_t{1} << 20;  // bytes per piece
  int queue_depth = 8;                            // pieces in flight
  int thread_count = 1;                           // workers of the thread-pool engine
  std::string engine = "io_uring";                // io_uring (threads where refused) | threads
  // Where requests are traced and counted (see above); the tracer and counters must outlive the
  // queue. Default: neither. Not from the config: the engine passes its own.
  detail::Observer observer;
  // From the config's aio block (config/from_config.cpp).
  static AioOptions from_config(const AioConfig& c);
};

class AioQueue {
 public:
  using Ticket = std::uint64_t;

  // engine = io_uring: a ring of queue_depth entries, or, where the kernel (or the build) has
  // none, the thread pool with a log line saying why. Throws kInvalidArgument for a zero block
  // size, depth or thread count, kConfig for an unknown engine, kOutOfMemory naming the engine
  // and the thread's index when the kernel refuses a thread (EAGAIN: RLIMIT_NPROC, threads-max);
  // the threads already started are then joined and the ring closed.
  explicit AioQueue(AioOptions options = {});
  // Waits for every request in flight; errors not yet raised are dropped (logged).
  ~AioQueue();
  AioQueue(const AioQueue&) = delete;
  AioQueue& operator=(const AioQueue&) = delete;

  // "io_uring" or "threads".
  const char* engine() const noexcept;

  // Starts reading/writing [offset, offset + bytes) of `fd` from/to `buf`. Returns when
  // enqueued; wait on the ticket. `file` names the file in errors; `unit` is what the request
  // is for in its trace region (the swapper's chunk / slot index; -1: none). REQUIRES: buf stays
  // valid and untouched (for writes: unchanged) until the ticket is waited for.
  Ticket submit(IoKind kind, int fd, const std::string& file, void* buf, std::size_t bytes,
                std::uint64_t offset, std::int64_t unit = -1);
  // Blocks until the request is complete; throws its error (once). Each ticket is waited for
  // at most once; an unknown ticket is kInvalidArgument.
  void wait(Ticket t);
  // Waits for every request in flight; throws the first error among them.
  void wait_all();

  // Convenience: submit + wait.
  void read(int fd, const std::string& file, void* buf, std::size_t bytes, std::uint64_t offset,
            std::int64_t unit = -1);
  void write(int fd, const std::string& file, const void* buf, std::size_t bytes,
             std::uint64_t offset, std::int64_t unit = -1);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zero::offload
