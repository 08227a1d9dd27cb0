// offload/nvme_swapper.hpp — state that lives in files under nvme_path, streamed chunk by chunk
// through a few aligned staging buffers: read chunk i+1 while chunk i is used while chunk i-1
// is written back (ZeRO-Infinity's pipelined swapper).
//
// File layout: one file per swapper; chunk c owns one slot, its parts (e.g. fp32 master, Adam m,
// Adam v) one after another, each padded to kDirectAlignment so every request is O_DIRECT-able.
// With Options::slots = 2 the file holds two copies of the slot sequence and chunk c has a
// current slot (read and written by run()) and an alternate one (run()'s to_alternate writes
// there; flip() makes it current): a speculative update lands beside the state it may have to
// be redone from. The file's size after the first full write is exactly file_bytes(); those
// bytes are charged to the tracker's NVMe tier by part category for the swapper's lifetime.
//
// Files are created with exclusive names (O_CREAT | O_EXCL), unlinked right after the open and
// used through their descriptor only (O_DIRECT where the file system allows it): the kernel
// frees their blocks when the process ends, however it ends (exit, SIGINT, SIGTERM, SIGKILL),
// and the library installs no signal handler. While the run lives, `df` counts the bytes and
// `ls` shows no file; /proc/<pid>/fd (or `lsof +L1`) names them, "(deleted)". At each start the
// directory is scanned for swap-file names a dead process left behind (a crash between create
// and unlink, or a version that kept the names): they are removed and named in a warning.
// Every I/O error, short transfer or truncated file is a zero::Error naming the file and offset
// (see aio.hpp).
//
// Thread safety: a swapper is used by one thread at a time.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "offload/aio.hpp"
#include "zero/device/memory.hpp"

namespace zero::offload {

// A swap-file name left in `dir` by another process, found by clean_stale_swap_files().
struct StaleSwapFile {
  std::string path;
  pid_t owner = 0;       // the pid in its name
  bool removed = false;  // false: its owner runs (or it could not be removed; `why` says)
  std::string why;       // e.g. "its owner, process 4242, is not running"
};

// Scans `dir` for names zero-<stem>-<pid>-<k>.swap and removes those whose owner is gone: no
// process <pid> runs, or the one that runs started after the file was made (a reused pid, as in
// containers where the trainer is pid 1 every time). Files of other live processes are reported,
// not touched; this process's own are skipped. Never throws; an unreadable dir gives nothing.
// Caveat: on a directory shared between machines (NFS) a remote owner counts as dead here.
std::vector<StaleSwapFile> clean_stale_swap_files(const std::string& dir);

// A file created exclusively under `dir`, unlinked at once (see above) and closed on
// destruction. Move-only.
class SwapFile {
 public:
  SwapFile() = default;
  // Runs clean_stale_swap_files(dir) (each finding a warning naming `origin`), then creates
  // <dir>/zero-<stem>-<pid>-<k>.swap for the first free k and unlinks it. `origin` names what
  // chose `dir` in errors (e.g. "config key '…nvme_path'"). Throws kIO naming the directory and
  // why. Where the file system refuses to unlink an open file the name stays until destruction
  // (a warning says so).
  SwapFile(const std::string& dir, const std::string& stem, const std::string& origin);
  ~SwapFile();
  SwapFile(SwapFile&& other) noexcept;
  SwapFile& operator=(SwapFile&& other) noexcept;
  SwapFile(const SwapFile&) = delete;
  SwapFile& operator=(const SwapFile&) = delete;

  int fd() const noexcept { return fd_; }
  // The name it was created with (gone from the directory once unlinked()).
  const std::string& path() const noexcept { return path_; }
  // What errors call it: "<path> (unlinked; fd <n>)".
  const std::string& label() const noexcept { return label_; }
  bool unlinked() const noexcept { return unlinked_; }
  // O_DIRECT is on (false on file systems that refuse it: the page cache is used).
  bool direct() const noexcept { return direct_; }
  // The file system keeps every block written (ext4, xfs, btrfs, tmpfs): a hole where data was
  // written means the data was lost. False elsewhere (ZFS stores zero blocks as holes).
  bool holes_are_lost_data() const noexcept { return holes_are_lost_data_; }

 private:
  void close_and_remove() noexcept;
  int fd_ = -1;
  std::string path_;
  std::string label_;
  bool direct_ = false;
  bool unlinked_ = false;
  bool holes_are_lost_data_ = false;
};

class ChunkSwapper {
 public:
  static constexpr std::size_t kMaxParts = 4;
  struct Part {
    MemCategory category;    // what the bytes are (charged to the NVMe tier)
    std::size_t elem_bytes;  // bytes per element
    // Plus block_bytes per block of `block` elements begun (int8 moments: each block's absmax
    // beside its codes; a chunk then starts on a block).
    std::size_t block = 1;
    std::size_t block_bytes = 0;
    // Bytes of a chunk of n elements (before padding).
    std::size_t bytes(std::size_t n) const {
      return n * elem_bytes + block_bytes * ((n + block - 1) / block);
    }
  };
  struct Options {
    std::string dir;
    std::string stem;    // file name stem, e.g. "optim-r0"
    std::string origin;  // what chose dir, for errors: "config key '…nvme_path'", a flag
    std::size_t buffer_count = 4;
    std::size_t slots = 1;  // 2: a current and an alternate slot per chunk (see above)
    // The leading parts run() reads of a slot (0: all); the others are left to fn, which fills
    // them before the slot is written (a part only ever written, like a copy read elsewhere).
    std::size_t read_parts = 0;
    bool pipeline_read = true;
    bool pipeline_write = true;
    // aio.observer: each slot read / write is a kNvme region whose unit is the chunk (slot)
    // index, and is counted in nvme_read / nvme_write (see aio.hpp).
    AioOptions aio;
  };
  // A chunk in a staging buffer: part k of chunk `chunk` at part[k] (count elements).
  struct Staged {
    std::size_t chunk = 0;
    std::size_t count = 0;
    char* part[kMaxParts] = {};
  };

  // What a swapper of these chunks and parts takes: file bytes per part (each part of each chunk
  // padded to kDirectAlignment) and the pinned bytes of one staging buffer (the largest slot,
  // plus room to align its start). The constructor charges exactly this; the planner sums it.
  struct Footprint {
    std::vector<std::size_t> part_bytes;  // per part, over all chunks
    std::size_t file_bytes = 0;
    std::size_t staging_buffer_bytes = 0;
  };
  static Footprint footprint(const std::vector<std::size_t>& chunk_elems,
                             const std::vector<Part>& parts, std::size_t slots = 1);

  // REQUIRES: 1 <= parts.size() <= kMaxParts. Allocates buffer_count staging buffers (pinned
  // tier, kOffloadStaging) of the largest slot (none for 0: then only read_slot / write_slot
  // with the caller's buffers) and creates the file.
  ChunkSwapper(MemoryTracker& tracker, std::vector<std::size_t> chunk_elems,
               std::vector<Part> parts, Options options);
  ~ChunkSwapper();
  ChunkSwapper(const ChunkSwapper&) = delete;
  ChunkSwapper& operator=(const ChunkSwapper&) = delete;

  std::size_t num_chunks() const noexcept { return elems_.size(); }
  std::size_t chunk_elems(std::size_t c) const { return elems_.at(c); }
  std::size_t file_bytes() const noexcept { return file_bytes_; }
  // Byte offset of part k of chunk c's current slot in the file.
  std::size_t part_offset(std::size_t c, std::size_t k) const;
  std::size_t part_bytes(std::size_t c, std::size_t k) const;  // padded
  const SwapFile& file() const noexcept { return file_; }
  const char* engine() const noexcept { return aio_.engine(); }
  std::size_t staging_bytes() const noexcept;
  std::size_t slot_bytes(std::size_t c) const;  // all parts of chunk c, padded

  // Reads / writes chunk c's whole slot from / to `buf` (kDirectAlignment-aligned, slot_bytes(c)
  // long), synchronously. Throws as run() does.
  void read_slot(std::size_t c, void* buf);
  void write_slot(std::size_t c, const void* buf);
  // The asynchronous read: returns when enqueued; wait() on the ticket before using `buf`.
  AioQueue::Ticket submit_read_slot(std::size_t c, void* buf);
  void wait(AioQueue::Ticket t) { aio_.wait(t); }

  // Runs fn over chunks [first, last) in order through the pipeline (REQUIRES buffer_count >= 1).
  // read: each slot is read into its staging buffer before fn sees it (else the buffer's content is
  // unspecified and fn fills every part); write: the slot is written back after fn (to_alternate:
  // to the chunk's alternate slot, REQUIRES slots == 2; the current one is left as it was). With
  // pipeline_read the reads of the next chunks are in flight while fn runs; with pipeline_write the
  // write of a chunk goes on while the next chunks are used. Returns when every write has landed.
  // Throws the first I/O error (after waiting for all requests in flight) or fn's exception.
  void run(std::size_t first, std::size_t last, bool read, bool write,
           const std::function<void(const Staged&)>& fn, bool to_alternate = false);
  // slots == 2: chunk c's alternate slot becomes its current one (a committed speculative write).
  void flip(std::size_t c);
  // Reads part k of each of `chunks` (current slots) through the staging buffers, reads ahead in
  // flight, and calls fn(c, data) in order; data is valid during the call only.
  void read_part(const std::vector<std::size_t>& chunks, std::size_t k,
                 const std::function<void(std::size_t c, const char* data)>& fn);

 private:
  // After an error: waits for every request in flight (no request may outlive the call that made
  // it: the staging buffers are reused by the next), logging a second error rather than throwing.
  void drain_after_error() noexcept;
  // A read of chunks [first, last) whose slots have all been written finds no hole in them: a
  // file truncated and then written past its new end (by a later slot's write) would read back
  // zeros where the data was, with no short read to tell. kCorruption naming the read and the
  // hole's offset. REQUIRES: no write in flight over the range.
  void check_no_hole(std::size_t first, std::size_t last) const;
  std::size_t read_bytes(std::size_t c) const;  // what run() reads of chunk c's slot
  // The file offset of chunk c's current slot (alternate: its other one).
  std::size_t slot_at(std::size_t c, bool alternate = false) const;
  bool written(std::size_t c) const { return written_[c * o_.slots + current_[c]]; }
  void mark_written(std::size_t c, bool alternate = false) {
    written_[c * o_.slots + (current_[c] ^ static_cast<unsigned char>(alternate))] = true;
  }

  std::vector<std::size_t> elems_;
  std::vector<Part> parts_;
  std::vector<std::size_t> slot_offset_;  // in the first copy of the slot sequence
  std::size_t copy_bytes_ = 0;            // one copy of the slot sequence
  std::size_t file_bytes_ = 0;
  std::vector<unsigned char> current_;  // per chunk: its current slot (0 or 1)
  Options o_;
  MemoryTracker* tracker_;
  std::vector<std::size_t> charged_;  // per part
  std::vector<Buffer> staging_;
  std::vector<char*> aligned_;
  std::vector<bool> written_;  // per chunk and slot: written (so holds no hole)
  SwapFile file_;
  AioQueue aio_;
};

}  // namespace zero::offload
