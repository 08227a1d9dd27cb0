// offload/nvme_swapper.cpp — exclusive swap files and the chunk pipeline over them.
#include "offload/nvme_swapper.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <fstream>
#include <limits>
#include <sstream>
#include <string_view>
#include <utility>

#include "zero/core/error.hpp"
#include "zero/core/log.hpp"

namespace zero::offload {

// ---- stale swap files

namespace {

// The owner pid in "zero-<stem>-<pid>-<k>.swap" (stem not empty), or 0 for any other name.
pid_t swap_file_owner(std::string_view name) {
  constexpr std::string_view kPrefix = "zero-", kSuffix = ".swap";
  if (name.size() <= kPrefix.size() + kSuffix.size() || name.substr(0, kPrefix.size()) != kPrefix ||
      name.substr(name.size() - kSuffix.size()) != kSuffix) {
    return 0;
  }
  const std::string_view core =
      name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
  const std::size_t dash_k = core.rfind('-');
  if (dash_k == std::string_view::npos || dash_k == 0) return 0;
  const std::size_t dash_pid = core.rfind('-', dash_k - 1);
  if (dash_pid == std::string_view::npos || dash_pid == 0) return 0;
  auto number = [](std::string_view d) -> long {
    if (d.empty() || d.size() > 9) return -1;
    long v = 0;
    for (char c : d) {
      if (c < '0' || c > '9') return -1;
      v = v * 10 + (c - '0');
    }
    return v;
  };
  const long pid = number(core.substr(dash_pid + 1, dash_k - dash_pid - 1));
  if (pid <= 0 || number(core.substr(dash_k + 1)) < 0) return 0;
  return static_cast<pid_t>(pid);
}

// When process `pid` started, in seconds since the epoch, or -1 when no such process runs:
// /proc/<pid>/stat field 22 (clock ticks after boot) plus /proc/stat's btime.
double process_start_time(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return -1;
  const std::size_t paren = line.rfind(')');  // the command name may hold spaces and ')'
  if (paren == std::string::npos) return -1;
  std::istringstream fields(line.substr(paren + 1));
  std::string field;
  for (int k = 3; k <= 22 && fields >> field; ++k) {
    if (k == 3 && field == "Z") return -1;  // a zombie: dead, not yet reaped
  }
  std::ifstream proc_stat("/proc/stat");
  std::string key;
  double btime = -1;
  while (proc_stat >> key) {
    if (key == "btime") {
      proc_stat >> btime;
      break;
    }
    proc_stat.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  if (btime < 0 || field.empty()) return -1;
  return btime + std::stod(field) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// The older of the file's birth time (where the file system keeps one) and its mtime.
double file_time(int dirfd, const char* name) {
  struct statx sx {};
  if (::statx(dirfd, name, AT_SYMLINK_NOFOLLOW, STATX_BTIME | STATX_MTIME, &sx) != 0) return -1;
  double t = static_cast<double>(sx.stx_mtime.tv_sec);
  if ((sx.stx_mask & STATX_BTIME) != 0) t = std::min(t, static_cast<double>(sx.stx_btime.tv_sec));
  return t;
}

}  // namespace

std::vector<StaleSwapFile> clean_stale_swap_files(const std::string& dir) {
  std::vector<StaleSwapFile> found;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return found;
  const std::string sep = dir.empty() || dir.back() == '/' ? "" : "/";
  // btime is whole seconds and the start time is derived from it: a margin against rounding.
  constexpr double kSlackS = 2.0;
  while (const dirent* e = ::readdir(d)) {
    const pid_t owner = swap_file_owner(e->d_name);
    if (owner == 0) continue;
    StaleSwapFile f;
    f.path = dir + sep + e->d_name;
    f.owner = owner;
    const double started = process_start_time(owner);
    const double born = file_time(::dirfd(d), e->d_name);
    if (started < 0) {
      f.why = detail::cat("its owner, process ", owner, ", is not running");
    } else if (born >= 0 && born < started - kSlackS) {
      f.why =
          detail::cat("it is older than the process ", owner, " now running (the pid was reused)");
    } else if (owner == ::getpid()) {
      continue;  // ours, between its create and its unlink (another rank's swapper)
    } else {
      f.why = detail::cat("it belongs to the running process ", owner, "; left in place");
      found.push_back(std::move(f));
      continue;
    }
    if (::unlinkat(::dirfd(d), e->d_name, 0) == 0) {
      f.removed = true;
    } else if (errno == ENOENT) {
      continue;  // another scanner removed it first
    } else {
      f.why += detail::cat("; cannot remove it: ", std::strerror(errno));
    }
    found.push_back(std::move(f));
  }
  ::closedir(d);
  return found;
}

// ---- SwapFile

SwapFile::SwapFile(const std::string& dir, const std::string& stem, const std::string& origin) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    const int e = errno;
    ZERO_THROW(kIO, origin, " = \"", dir, "\": ", std::strerror(e),
               e == ENOENT ? " (the directory for swap files must exist)" : "");
  }
  ZERO_CHECK(S_ISDIR(st.st_mode), kIO, origin, " = \"", dir, "\": not a directory");
  for (const StaleSwapFile& f : clean_stale_swap_files(dir)) {
    ZERO_LOG(kWarn, f.removed ? "removed stale swap file '" : "swap file '", f.path, "' in ",
             origin, ": ", f.why);
  }
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
  // Unlinked at once: the kernel frees the blocks when the last descriptor closes, however the
  // process ends (SIGKILL included), and nothing needs the name again. Where a file system
  // refuses to unlink an open file, the name stays until the destructor.
  if (::unlink(path_.c_str()) == 0) {
    unlinked_ = true;
  } else {
    ZERO_LOG(kWarn, "swap file '", path_, "' cannot be unlinked while open (", std::strerror(errno),
             "); it is removed at the end of the run, but not if the process is killed");
  }
  label_ = unlinked_ ? detail::cat(path_, " (unlinked; fd ", fd_, ")") : path_;
  // File systems that store every written block (no zero-block elision, which ZFS does under
  // compression): there, a hole in a written range means the data is gone.
  struct statfs fs {};
  if (::fstatfs(fd_, &fs) == 0) {
    constexpr long kExt4 = 0xEF53, kXfs = 0x58465342, kBtrfs = 0x9123683E, kTmpfs = 0x01021994;
    const auto type = static_cast<long>(fs.f_type);
    holes_are_lost_data_ = type == kExt4 || type == kXfs || type == kBtrfs || type == kTmpfs;
  }
  // O_DIRECT set after an exclusive create, so a file system that refuses it costs no second
  // create: the file is then used through the page cache.
  const int fl = ::fcntl(fd_, F_GETFL);
  direct_ = fl >= 0 && ::fcntl(fd_, F_SETFL, fl | O_DIRECT) == 0;
  if (!direct_) {
    ZERO_LOG(kInfo, "swap file '", path_, "': O_DIRECT refused (", std::strerror(errno),
             "); using the page cache");
  }
}

SwapFile::~SwapFile() { close_and_remove(); }

SwapFile::SwapFile(SwapFile&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)),
      path_(std::move(o.path_)),
      label_(std::move(o.label_)),
      direct_(o.direct_),
      unlinked_(o.unlinked_),
      holes_are_lost_data_(o.holes_are_lost_data_) {}

SwapFile& SwapFile::operator=(SwapFile&& o) noexcept {
  if (this != &o) {
    close_and_remove();
    fd_ = std::exchange(o.fd_, -1);
    path_ = std::move(o.path_);
    label_ = std::move(o.label_);
    direct_ = o.direct_;
    unlinked_ = o.unlinked_;
    holes_are_lost_data_ = o.holes_are_lost_data_;
  }
  return *this;
}

void SwapFile::close_and_remove() noexcept {
  if (fd_ < 0) return;
  ::close(fd_);
  fd_ = -1;
  if (!unlinked_ && ::unlink(path_.c_str()) != 0) {
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
  ZERO_CHECK(o_.slots == 1 || o_.slots == 2, kInvalidArgument, "ChunkSwapper: 1 or 2 slots, got ",
             o_.slots);
  const Footprint f = footprint(elems_, parts_, o_.slots);
  charged_ = f.part_bytes;
  file_bytes_ = f.file_bytes;
  copy_bytes_ = f.file_bytes / o_.slots;
  for (std::size_t c = 0, at = 0; c < elems_.size(); ++c) {
    slot_offset_.push_back(at);
    for (std::size_t k = 0; k < parts_.size(); ++k) at += part_bytes(c, k);
  }
  current_.assign(elems_.size(), 0);
  for (std::size_t b = 0; b < o_.buffer_count; ++b) {
    staging_.push_back(Buffer::pinned(tracker, MemCategory::kOffloadStaging, f.staging_buffer_bytes,
                                      {.prefault = true}));
    auto p = reinterpret_cast<std::uintptr_t>(staging_.back().data());
    aligned_.push_back(reinterpret_cast<char*>(align_up(p)));
  }
  written_.assign(elems_.size() * o_.slots, false);
  file_ = SwapFile(o_.dir, o_.stem, o_.origin);
  for (std::size_t k = 0; k < parts_.size(); ++k) {
    tracker_->charge(parts_[k].category, MemTier::kNvme, charged_[k]);
  }
}

ChunkSwapper::Footprint ChunkSwapper::footprint(const std::vector<std::size_t>& chunk_elems,
                                                const std::vector<Part>& parts, std::size_t slots) {
  Footprint f;
  f.part_bytes.assign(parts.size(), 0);
  std::size_t max_slot = 0;
  for (std::size_t n : chunk_elems) {
    std::size_t slot = 0;
    for (std::size_t k = 0; k < parts.size(); ++k) {
      const std::size_t b = align_up(parts[k].bytes(n));
      slot += b;
      f.part_bytes[k] += b;
    }
    f.file_bytes += slot;
    max_slot = std::max(max_slot, slot);
  }
  for (std::size_t& b : f.part_bytes) b *= slots;
  f.file_bytes *= slots;
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
  return align_up(parts_.at(k).bytes(elems_.at(c)));
}

std::size_t ChunkSwapper::part_offset(std::size_t c, std::size_t k) const {
  std::size_t off = slot_at(c);
  for (std::size_t j = 0; j < k; ++j) off += part_bytes(c, j);
  return off;
}

std::size_t ChunkSwapper::slot_bytes(std::size_t c) const {
  return (c + 1 < elems_.size() ? slot_offset_.at(c + 1) : copy_bytes_) - slot_offset_.at(c);
}

std::size_t ChunkSwapper::read_bytes(std::size_t c) const {
  if (o_.read_parts == 0 || o_.read_parts >= parts_.size()) return slot_bytes(c);
  return part_offset(c, o_.read_parts) - slot_at(c);
}

std::size_t ChunkSwapper::slot_at(std::size_t c, bool alternate) const {
  const std::size_t slot = current_.at(c) ^ static_cast<unsigned char>(alternate);
  return slot_offset_.at(c) + slot * copy_bytes_;
}

void ChunkSwapper::flip(std::size_t c) {
  ZERO_CHECK(o_.slots == 2, kInternal, "ChunkSwapper::flip without an alternate slot");
  current_.at(c) ^= 1;
}

void ChunkSwapper::check_no_hole(std::size_t first, std::size_t last) const {
  if (first >= last || !file_.holes_are_lost_data()) return;
  for (std::size_t c = first; c < last; ++c) {
    if (!written(c)) return;
  }
  // Two slots: the current ones need not be consecutive; each is checked on its own.
  if (o_.slots > 1 && last - first > 1) {
    for (std::size_t c = first; c < last; ++c) check_no_hole(c, c + 1);
    return;
  }
  const std::size_t begin = slot_at(first);
  const std::size_t end = slot_at(last - 1) + slot_bytes(last - 1);
  // SEEK_HOLE: the first hole at or after `begin` (the end of the file where there is none; a
  // file system without hole tracking reports the end of the file). A short file is left to the
  // read, which stops at its end and says so.
  const off_t hole = ::lseek(file_.fd(), static_cast<off_t>(begin), SEEK_HOLE);
  struct stat st {};
  if (hole < 0 || ::fstat(file_.fd(), &st) != 0) return;
  const auto at = static_cast<std::size_t>(hole);
  if (at < end && at < static_cast<std::size_t>(st.st_size)) {
    ZERO_THROW(kCorruption, "NVMe swap: read of ", end - begin, " bytes at offset ", begin, " of '",
               file_.label(), "': the file has a hole at offset ", at,
               " (the data written there is gone: truncated, then written past its end?)");
  }
}

void ChunkSwapper::read_slot(std::size_t c, void* buf) {
  check_no_hole(c, c + 1);
  aio_.read(file_.fd(), file_.label(), buf, slot_bytes(c), slot_at(c),
            static_cast<std::int64_t>(c));
}

AioQueue::Ticket ChunkSwapper::submit_read_slot(std::size_t c, void* buf) {
  check_no_hole(c, c + 1);
  return aio_.submit(IoKind::kRead, file_.fd(), file_.label(), buf, slot_bytes(c), slot_at(c),
                     static_cast<std::int64_t>(c));
}

void ChunkSwapper::write_slot(std::size_t c, const void* buf) {
  aio_.write(file_.fd(), file_.label(), buf, slot_bytes(c), slot_at(c),
             static_cast<std::int64_t>(c));
  mark_written(c);
}

std::size_t ChunkSwapper::staging_bytes() const noexcept {
  std::size_t s = 0;
  for (const Buffer& b : staging_) s += b.size();
  return s;
}

void ChunkSwapper::run(std::size_t first, std::size_t last, bool read, bool write,
                       const std::function<void(const Staged&)>& fn, bool to_alternate) {
  ZERO_CHECK(first <= last && last <= elems_.size(), kInvalidArgument,
             "ChunkSwapper::run: chunks [", first, ", ", last, ") of ", elems_.size());
  ZERO_CHECK(!to_alternate || o_.slots == 2, kInternal,
             "ChunkSwapper::run: to_alternate without an alternate slot");
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
  const std::string& path = file_.label();
  auto settle_write = [&](std::size_t set) {
    if (writing[set] != kNone) aio_.wait(std::exchange(writing[set], kNone));
  };
  std::size_t next_read = first;
  if (read) check_no_hole(first, last);
  try {
    for (std::size_t c = first; c < last; ++c) {
      const std::size_t set = c % nb;
      if (read) {
        for (; next_read < last && next_read <= c + ahead; ++next_read) {
          const std::size_t s = next_read % nb;
          settle_write(s);  // the set's previous chunk must have landed before it is reused
          reading[s] =
              aio_.submit(IoKind::kRead, file_.fd(), path, aligned_[s], read_bytes(next_read),
                          slot_at(next_read), static_cast<std::int64_t>(next_read));
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
                                   slot_at(c, to_alternate), static_cast<std::int64_t>(c));
        mark_written(c, to_alternate);
        if (!o_.pipeline_write) settle_write(set);
      }
    }
    for (std::size_t s = 0; s < nb; ++s) settle_write(s);
  } catch (...) {
    // No request may outlive the call: the staging buffers are reused by the next one.
    drain_after_error();
    throw;
  }
}

void ChunkSwapper::drain_after_error() noexcept {
  try {
    aio_.wait_all();
  } catch (const std::exception& e) {
    ZERO_LOG(kWarn, "swap file '", file_.label(), "': a second error while unwinding: ", e.what());
  } catch (...) {
    ZERO_LOG(kWarn, "swap file '", file_.label(), "': a second error while unwinding");
  }
}

void ChunkSwapper::read_part(const std::vector<std::size_t>& chunks, std::size_t k,
                             const std::function<void(std::size_t, const char*)>& fn) {
  const std::size_t nb = staging_.size();
  ZERO_CHECK(nb >= 1, kInvalidArgument, "ChunkSwapper::read_part: no staging buffers");
  ZERO_CHECK(k < parts_.size(), kInvalidArgument, "ChunkSwapper::read_part: part ", k, " of ",
             parts_.size());
  constexpr AioQueue::Ticket kNone = 0;
  std::vector<AioQueue::Ticket> reading(nb, kNone);
  const std::string& path = file_.label();
  std::size_t next = 0;
  try {
    for (std::size_t i = 0; i < chunks.size(); ++i) {
      for (; next < chunks.size() && next < i + nb; ++next) {
        const std::size_t c = chunks[next];
        check_no_hole(c, c + 1);
        reading[next % nb] =
            aio_.submit(IoKind::kRead, file_.fd(), path, aligned_[next % nb], part_bytes(c, k),
                        part_offset(c, k), static_cast<std::int64_t>(c));
      }
      aio_.wait(std::exchange(reading[i % nb], kNone));
      fn(chunks[i], aligned_[i % nb]);
    }
  } catch (...) {
    drain_after_error();
    throw;
  }
}

}  // namespace zero::offload
