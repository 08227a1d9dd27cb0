// offload/aio.cpp — io_uring (liburing) and thread-pool engines behind AioQueue.
#include "offload/aio.hpp"

#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "zero/core/error.hpp"
#include "zero/core/log.hpp"

#if ZERO_WITH_IO_URING
#include <liburing.h>
#endif

namespace zero::offload {

namespace {

// One request as submitted; it completes when all its pieces have.
struct Op {
  IoKind kind;
  int fd;
  std::string file;
  char* buf;
  std::size_t bytes;
  std::uint64_t offset;
  std::size_t pieces_left = 0;
  bool failed = false;
  bool truncated = false;  // a read ended at end of file
  std::string error;
  std::int64_t unit = -1;              // its trace region's unit
  TraceClock::time_point submitted{};  // set when observed
};

struct Piece {
  Op* op;
  char* buf;
  std::size_t len;
  std::uint64_t off;
};

const char* verb(IoKind k) { return k == IoKind::kRead ? "read" : "write"; }

#if ZERO_WITH_IO_URING
// Held across every ring's set-up and tear-down in the process. liburing maps a ring's memory with
// raw mmap / munmap system calls, which ThreadSanitizer does not see: a ring closed by one thread
// (an in-process rank) and a ring opened by another at the address the kernel just freed look to
// it like one object touched by two unordered threads, and the new reaper's first read of the
// completion head was reported as a race with the old reaper's last write. The kernel orders the
// munmap before the mmap that reuses the address; taking this mutex around both says so in a form
// the sanitizer sees. Rings open and close once per queue, so it costs nothing measurable.
std::mutex& ring_lifetime_mutex() {
  static std::mutex m;
  return m;
}
#endif

}  // namespace

struct AioQueue::Impl {
  AioOptions o;
  std::mutex mu;
  std::condition_variable done_cv, work_cv;
  std::map<Ticket, std::unique_ptr<Op>> ops;
  Ticket next = 1;
  std::deque<Piece> queue;  // pieces not yet issued
  std::size_t inflight = 0;
  bool stop = false;
  bool uring = false;
  bool observed = false;             // o.observer has a tracer or counters
  std::vector<std::thread> threads;  // the reaper (io_uring) or the workers (pool)
#if ZERO_WITH_IO_URING
  io_uring ring{};
#endif

  // ---- completion bookkeeping (REQUIRES: mu held)
  void fail(Op& op, const Piece& p, int err) {
    if (op.failed) return;
    op.failed = true;
    op.error = detail::cat(verb(op.kind), " of ", op.bytes, " bytes at offset ", op.offset, " of '",
                           op.file, "' failed at offset ", p.off, ": ", std::strerror(err), " (",
                           "errno ", err, ")");
  }
  // A request's last piece is done (on the reaper / a worker, with mu held: the counters have
  // the bytes before wait() can wake).
  void observe(const Op& op) {
    const detail::Observer& ob = o.observer;
    const bool read = op.kind == IoKind::kRead;
    if (ob.tracer != nullptr) {
      ob.tracer->record(TraceLane::kNvme, read ? "nvme read" : "nvme write", op.submitted,
                        TraceClock::now(), op.unit,
                        op.failed ? -1 : static_cast<std::int64_t>(op.bytes));
    }
    if (!op.failed) {
      ob.count(read ? &detail::IoCounters::nvme_read : &detail::IoCounters::nvme_write, op.bytes);
    }
  }
  void complete(const Piece& p, long res) {
    Op& op = *p.op;
    --inflight;
    const std::size_t pieces_before = op.pieces_left;
    if (res == -EINTR || res == -EAGAIN) {
      queue.push_front(p);
    } else if (res < 0) {
      fail(op, p, static_cast<int>(-res));
      --op.pieces_left;
    } else if (static_cast<std::size_t>(res) < p.len) {
      if (res == 0) {
        if (!op.failed) {
          op.failed = true;
          op.truncated = op.kind == IoKind::kRead;
          op.error = detail::cat(verb(op.kind), " of ", op.bytes, " bytes at offset ", op.offset,
                                 " of '", op.file, "' stopped at offset ", p.off, ": ",
                                 op.kind == IoKind::kRead
                                     ? "end of file (the file is shorter than written: truncated?)"
                                     : "no bytes written (disk full or file size limit?)");
        }
        --op.pieces_left;
      } else {  // short: retry the remainder (its error, if any, is then reported)
        const auto n = static_cast<std::size_t>(res);
        queue.push_front({p.op, p.buf + n, p.len - n, p.off + n});
      }
    } else {
      --op.pieces_left;
    }
    if (observed && op.pieces_left == 0 && pieces_before > 0) {
      observe(op);  // this piece was the request's last
    }
    if (op.pieces_left == 0 || inflight == 0) done_cv.notify_all();
    issue();
  }

  // Issues queued pieces up to the queue depth. REQUIRES: mu held.
  void issue() {
    if (!uring) {
      if (!queue.empty()) work_cv.notify_all();
      return;
    }
#if ZERO_WITH_IO_URING
    unsigned added = 0;
    while (!queue.empty() && inflight < static_cast<std::size_t>(o.queue_depth)) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring);
      if (sqe == nullptr) break;
      auto* p = new Piece(queue.front());
      queue.pop_front();
      if (p->op->kind == IoKind::kRead) {
        io_uring_prep_read(sqe, p->op->fd, p->buf, static_cast<unsigned>(p->len), p->off);
      } else {
        io_uring_prep_write(sqe, p->op->fd, p->buf, static_cast<unsigned>(p->len), p->off);
      }
      io_uring_sqe_set_data(sqe, p);
      ++inflight;
      ++added;
    }
    if (added > 0) {
      int r;
      do {
        r = io_uring_submit(&ring);
      } while (r == -EINTR || r == -EAGAIN);
      // The SQEs stay queued and go with the next submit; this runs in the reaper too, so no throw.
      if (r < 0) ZERO_LOG(kError, "aio: io_uring_submit: ", std::strerror(-r));
    }
#endif
  }

  // ---- engines
  bool start_uring() {
#if ZERO_WITH_IO_URING
    const unsigned entries = static_cast<unsigned>(std::max(o.queue_depth, 1)) + 1;  // + stop NOP
    int r = 0;
    {
      std::lock_guard<std::mutex> lifetime(ring_lifetime_mutex());
      r = io_uring_queue_init(entries, &ring, 0);
    }
    if (r < 0) {
      ZERO_LOG(kInfo, "aio: io_uring unavailable (", std::strerror(-r), "); using ", o.thread_count,
               " pread/pwrite threads");
      return false;
    }
    uring = true;
    try {
      start_thread(0, 1, "io_uring reaper", [this] { reap(); });
    } catch (...) {
      std::lock_guard<std::mutex> lifetime(ring_lifetime_mutex());
      io_uring_queue_exit(&ring);
      uring = false;
      throw;
    }
    return true;
#else
    ZERO_LOG(kInfo, "aio: this build has no liburing; using ", o.thread_count,
             " pread/pwrite threads");
    return false;
#endif
  }

#if ZERO_WITH_IO_URING
  void reap() {
    for (;;) {
      io_uring_cqe* cqe = nullptr;
      const int r = io_uring_wait_cqe(&ring, &cqe);
      if (r == -EINTR || r == -EAGAIN) continue;
      if (r < 0) {  // cannot happen with a valid ring; fail what is in flight rather than hang
        std::lock_guard<std::mutex> lk(mu);
        ZERO_LOG(kError, "aio: io_uring_wait_cqe: ", std::strerror(-r));
        for (auto& [t, op] : ops) {
          if (op->pieces_left > 0) {
            op->failed = true;
            op->error = detail::cat("io_uring_wait_cqe: ", std::strerror(-r));
            op->pieces_left = 0;
          }
        }
        inflight = 0;
        done_cv.notify_all();
        return;
      }
      auto* p = static_cast<Piece*>(io_uring_cqe_get_data(cqe));
      const long res = cqe->res;
      io_uring_cqe_seen(&ring, cqe);
      if (p == nullptr) return;  // the stop NOP
      std::lock_guard<std::mutex> lk(mu);
      complete(*p, res);
      delete p;
    }
  }
#endif

  void start_pool() {
    const int n = std::max(o.thread_count, 1);
    try {
      for (int i = 0; i < n; ++i) start_thread(i, n, "pread/pwrite pool", [this] { work(); });
    } catch (...) {
      // The workers already started wait on work_cv: stop and join them, so the constructor's
      // error leaves no thread behind (a joinable std::thread destroyed would terminate).
      {
        std::lock_guard<std::mutex> lk(mu);
        stop = true;
      }
      work_cv.notify_all();
      for (auto& t : threads) t.join();
      threads.clear();
      throw;
    }
  }

  // std::thread's constructor throws std::system_error when the kernel refuses a thread (EAGAIN:
  // RLIMIT_NPROC, threads-max, memory for the stack); that is an error of the queue, naming it.
  template <typename Fn>
  void start_thread(int index, int count, const char* what, Fn&& fn) {
    try {
      threads.emplace_back(std::forward<Fn>(fn));
    } catch (const std::system_error& e) {
      ZERO_THROW(kOutOfMemory, "aio: cannot start thread ", index, " of ", count, " of the ", what,
                 " (", e.what(), "; errno ", e.code().value(), ")");
    }
  }

  void work() {
    std::unique_lock<std::mutex> lk(mu);
    for (;;) {
      work_cv.wait(lk, [&] { return stop || !queue.empty(); });
      if (queue.empty()) return;  // stop
      const Piece p = queue.front();
      queue.pop_front();
      ++inflight;
      lk.unlock();
      const ssize_t r = p.op->kind == IoKind::kRead
                            ? ::pread(p.op->fd, p.buf, p.len, static_cast<off_t>(p.off))
                            : ::pwrite(p.op->fd, p.buf, p.len, static_cast<off_t>(p.off));
      const long res = r < 0 ? -static_cast<long>(errno) : static_cast<long>(r);
      lk.lock();
      complete(p, res);
    }
  }

  void shutdown() {
    {
      std::unique_lock<std::mutex> lk(mu);
      done_cv.wait(lk, [&] { return inflight == 0 && queue.empty(); });
      stop = true;
    }
    if (uring) {
#if ZERO_WITH_IO_URING
      {
        std::lock_guard<std::mutex> lk(mu);
        io_uring_sqe* sqe = io_uring_get_sqe(&ring);
        io_uring_prep_nop(sqe);
        io_uring_sqe_set_data(sqe, nullptr);
        io_uring_submit(&ring);
      }
      for (auto& t : threads) t.join();
      std::lock_guard<std::mutex> lifetime(ring_lifetime_mutex());
      io_uring_queue_exit(&ring);
#endif
    } else {
      work_cv.notify_all();
      for (auto& t : threads) t.join();
    }
    threads.clear();
  }
};

AioQueue::AioQueue(AioOptions options) : impl_(std::make_unique<Impl>()) {
  ZERO_CHECK(options.block_size > 0 && options.queue_depth > 0 && options.thread_count > 0,
             kInvalidArgument, "aio: block_size, queue_depth and thread_count must be > 0");
  impl_->o = std::move(options);
  impl_->observed = impl_->o.observer.tracer != nullptr || impl_->o.observer.io != nullptr;
  const std::string& e = impl_->o.engine;
  ZERO_CHECK(e == "io_uring" || e == "threads", kConfig, "config key 'aio.engine' = \"", e,
             "\": expected io_uring or threads");
  if (e == "threads" || !impl_->start_uring()) impl_->start_pool();
}

AioQueue::~AioQueue() {
  impl_->shutdown();
  for (auto& [t, op] : impl_->ops) {
    if (op->failed) ZERO_LOG(kWarn, "aio: error never waited for: ", op->error);
  }
}

const char* AioQueue::engine() const noexcept { return impl_->uring ? "io_uring" : "threads"; }

AioQueue::Ticket AioQueue::submit(IoKind kind, int fd, const std::string& file, void* buf,
                                  std::size_t bytes, std::uint64_t offset, std::int64_t unit) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lk(m.mu);
  auto op = std::make_unique<Op>();
  op->kind = kind;
  op->fd = fd;
  op->file = file;
  op->buf = static_cast<char*>(buf);
  op->bytes = bytes;
  op->offset = offset;
  op->unit = unit;
  if (m.o.observer.tracer != nullptr) [[unlikely]] {
    op->submitted = TraceClock::now();
  }
  for (std::size_t at = 0; at < bytes; at += m.o.block_size) {
    m.queue.push_back({op.get(), op->buf + at, std::min(m.o.block_size, bytes - at), offset + at});
    ++op->pieces_left;
  }
  const Ticket t = m.next++;
  m.ops.emplace(t, std::move(op));
  m.issue();
  return t;
}

void AioQueue::wait(Ticket t) {
  Impl& m = *impl_;
  std::unique_lock<std::mutex> lk(m.mu);
  auto it = m.ops.find(t);
  ZERO_CHECK(it != m.ops.end(), kInvalidArgument, "aio: unknown or already waited ticket ", t);
  Op& op = *it->second;
  m.done_cv.wait(lk, [&] { return op.pieces_left == 0; });
  const std::unique_ptr<Op> done = std::move(it->second);
  m.ops.erase(it);
  if (!done->failed) return;
  if (done->truncated) ZERO_THROW(kCorruption, "NVMe swap: ", done->error);
  ZERO_THROW(kIO, "NVMe swap: ", done->error);
}

void AioQueue::wait_all() {
  std::vector<Ticket> ts;
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    for (const auto& [t, op] : impl_->ops) ts.push_back(t);
  }
  std::exception_ptr first;
  for (Ticket t : ts) {
    try {
      wait(t);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

void AioQueue::read(int fd, const std::string& file, void* buf, std::size_t bytes,
                    std::uint64_t offset, std::int64_t unit) {
  wait(submit(IoKind::kRead, fd, file, buf, bytes, offset, unit));
}

void AioQueue::write(int fd, const std::string& file, const void* buf, std::size_t bytes,
                     std::uint64_t offset, std::int64_t unit) {
  wait(submit(IoKind::kWrite, fd, file, const_cast<void*>(buf), bytes, offset, unit));
}

}  // namespace zero::offload
