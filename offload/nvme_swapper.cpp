// offload/nvme_swapper.cpp — exclusive swap files and the chunk pipeline over them.
#include "offload/nvme_swapper.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <utility>

#include "zero/error.hpp"
#include "zero/log.hpp"

namespace zero::offload {

// ---- SwapFile

SwapFile::SwapFile(const std::string& dir, const std::string& stem, const std::string& origin) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    const int e = errno;
    ZERO_THROW(kIO, origin, " = \"", dir, "\": ", std::strerror(e),
               e == ENOENT ? " (the directory for swap files must exist)" : "");
  }
  ZERO_CHECK(S_ISDIR(st.st_mode), kIO, origin, " = \"", dir, "\": not a directory");
  const std::string base = dir + (dir.empty() || dir.back() == '/' ? "" : "/") + "zero-" + stem +
                           "-" + std::to_string(::getpid()) + "-";
  for (int k = 0;; ++k) {
    std::string p = base + std::to_string(k) + ".swap";
    const int fd = ::open(p.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd >= 0) {
      fd_ = fd;
      path_ = std::move(p);
      break;
    }
    const int e = errno;
    if (e == EEXIST && k < 100000) continue;
    ZERO_THROW(kIO, origin, " = \"", dir, "\": cannot create swap file '", p,
               "': ", std::strerror(e));
  }
  // O_DIRECT set after an exclusive create, so a file system that refuses it (tmpfs) costs no
  // second create: the file is then used through the page cache.
  const int fl = ::fcntl(fd_, F_GETFL);
  direct_ = fl >= 0 && ::fcntl(fd_, F_SETFL, fl | O_DIRECT) == 0;
  if (!direct_) {
    ZERO_LOG(kInfo, "swap file '", path_, "': O_DIRECT refused (", std::strerror(errno),
             "); using the page cache");
  }
}

SwapFile::~SwapFile() { close_and_remove(); }

SwapFile::SwapFile(SwapFile&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)), path_(std::move(o.path_)), direct_(o.direct_) {}

SwapFile& SwapFile::operator=(SwapFile&& o) noexcept {
  if (this != &o) {
    close_and_remove();
    fd_ = std::exchange(o.fd_, -1);
    path_ = std::move(o.path_);
    direct_ = o.direct_;
  }
  return *this;
}

void SwapFile::close_and_remove() noexcept {
  if (fd_ < 0) return;
  ::close(fd_);
  fd_ = -1;
  if (::unlink(path_.c_str()) != 0) {
    ZERO_LOG(kWarn, "swap file '", path_, "' could not be removed: ", std::strerror(errno));
  }
}

// ---- ChunkSwapper

ChunkSwapper::ChunkSwapper(MemoryTracker& tracker, std::vector<std::size_t> chunk_elems,
                           std::vector<Part> parts, Options options)
    : elems_(std::move(chunk_elems)),
      parts_(std::move(parts)),
      o_(std::move(options)),
      tracker_(&tracker),
      aio_(o_.aio) {
  ZERO_CHECK(!parts_.empty() && parts_.size() <= kMaxParts, kInvalidArgument, "ChunkSwapper: 1 to ",
             kMaxParts, " parts, got ", parts_.size());
  const Footprint f = footprint(elems_, parts_);
  charged_ = f.part_bytes;
  file_bytes_ = f.file_bytes;
  for (std::size_t c = 0, at = 0; c < elems_.size(); ++c) {
    slot_offset_.push_back(at);
    for (std::size_t k = 0; k < parts_.size(); ++k) at += part_bytes(c, k);
  }
  for (std::size_t b = 0; b < o_.buffer_count; ++b) {
    staging_.push_back(Buffer::pinned(tracker, MemCategory::kOffloadStaging, f.staging_buffer_bytes,
                                      {.prefault = true}));
    auto p = reinterpret_cast<std::uintptr_t>(staging_.back().data());
    aligned_.push_back(reinterpret_cast<char*>(align_up(p)));
  }
  file_ = SwapFile(o_.dir, o_.stem, o_.origin);
  for (std::size_t k = 0; k < parts_.size(); ++k) {
    tracker_->charge(parts_[k].category, MemTier::kNvme, charged_[k]);
  }
}

ChunkSwapper::Footprint ChunkSwapper::footprint(const std::vector<std::size_t>& chunk_elems,
                                                const std::vector<Part>& parts) {
  Footprint f;
  f.part_bytes.assign(parts.size(), 0);
  std::size_t max_slot = 0;
  for (std::size_t n : chunk_elems) {
    std::size_t slot = 0;
    for (std::size_t k = 0; k < parts.size(); ++k) {
      const std::size_t b = align_up(n * parts[k].elem_bytes);
      slot += b;
      f.part_bytes[k] += b;
    }
    f.file_bytes += slot;
    max_slot = std::max(max_slot, slot);
  }
  f.staging_buffer_bytes = max_slot + kDirectAlignment;
  return f;
}

ChunkSwapper::~ChunkSwapper() {
  for (std::size_t k = 0; k < parts_.size(); ++k) {
    try {
      tracker_->release(parts_[k].category, MemTier::kNvme, charged_[k]);
    } catch (const std::exception& e) {
      ZERO_LOG(kError, e.what());
    }
  }
}

std::size_t ChunkSwapper::part_bytes(std::size_t c, std::size_t k) const {
  return align_up(elems_.at(c) * parts_.at(k).elem_bytes);
}

std::size_t ChunkSwapper::part_offset(std::size_t c, std::size_t k) const {
  std::size_t off = slot_offset_.at(c);
  for (std::size_t j = 0; j < k; ++j) off += part_bytes(c, j);
  return off;
}

std::size_t ChunkSwapper::slot_bytes(std::size_t c) const {
  return (c + 1 < elems_.size() ? slot_offset_.at(c + 1) : file_bytes_) - slot_offset_.at(c);
}

void ChunkSwapper::read_slot(std::size_t c, void* buf) {
  aio_.read(file_.fd(), file_.path(), buf, slot_bytes(c), slot_offset_.at(c));
}

AioQueue::Ticket ChunkSwapper::submit_read_slot(std::size_t c, void* buf) {
  return aio_.submit(IoKind::kRead, file_.fd(), file_.path(), buf, slot_bytes(c),
                     slot_offset_.at(c));
}

void ChunkSwapper::write_slot(std::size_t c, const void* buf) {
  aio_.write(file_.fd(), file_.path(), buf, slot_bytes(c), slot_offset_.at(c));
}

std::size_t ChunkSwapper::staging_bytes() const noexcept {
  std::size_t s = 0;
  for (const Buffer& b : staging_) s += b.size();
  return s;
}

void ChunkSwapper::run(std::size_t first, std::size_t last, bool read, bool write,
                       const std::function<void(const Staged&)>& fn) {
  ZERO_CHECK(first <= last && last <= elems_.size(), kInvalidArgument,
             "ChunkSwapper::run: chunks [", first, ", ", last, ") of ", elems_.size());
  const std::size_t nb = staging_.size();
  ZERO_CHECK(nb >= 1, kInvalidArgument, "ChunkSwapper::run: no staging buffers (buffer_count 0)");
  // Sets in use at once: the one fn works on, the reads ahead, and (pipelined writes) the one
  // being written back.
  std::size_t ahead = 0;
  if (read && o_.pipeline_read && nb > 1) {
    ahead = o_.pipeline_write && write ? std::max<std::size_t>(1, nb - 2) : nb - 1;
  }
  constexpr AioQueue::Ticket kNone = 0;
  std::vector<AioQueue::Ticket> reading(nb, kNone), writing(nb, kNone);
  const std::string& path = file_.path();
  auto settle_write = [&](std::size_t set) {
    if (writing[set] != kNone) aio_.wait(std::exchange(writing[set], kNone));
  };
  std::size_t next_read = first;
  try {
    for (std::size_t c = first; c < last; ++c) {
      const std::size_t set = c % nb;
      if (read) {
        for (; next_read < last && next_read <= c + ahead; ++next_read) {
          const std::size_t s = next_read % nb;
          settle_write(s);  // the set's previous chunk must have landed before it is reused
          reading[s] = aio_.submit(IoKind::kRead, file_.fd(), path, aligned_[s],
                                   slot_bytes(next_read), slot_offset_[next_read]);
        }
        aio_.wait(std::exchange(reading[set], kNone));
      } else {
        settle_write(set);
      }
      Staged st;
      st.chunk = c;
      st.count = elems_[c];
      char* p = aligned_[set];
      for (std::size_t k = 0; k < parts_.size(); ++k) {
        st.part[k] = p;
        p += part_bytes(c, k);
      }
      fn(st);
      if (write) {
        writing[set] = aio_.submit(IoKind::kWrite, file_.fd(), path, aligned_[set], slot_bytes(c),
                                   slot_offset_[c]);
        if (!o_.pipeline_write) settle_write(set);
      }
    }
    for (std::size_t s = 0; s < nb; ++s) settle_write(s);
  } catch (...) {
    // No request may outlive the call: the staging buffers are reused by the next one.
    try {
      aio_.wait_all();
    } catch (const std::exception& e) {
      ZERO_LOG(kWarn, "swap file '", path, "': a second error while unwinding: ", e.what());
    }
    throw;
  }
}

}  // namespace zero::offload
