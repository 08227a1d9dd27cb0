// zero/comm/comm.hpp — collectives: one Communicator interface, three backends.
//
// A Communicator is one rank's handle on a group of ranks. It runs the collectives the ZeRO
// stages need (all_reduce, reduce_scatter, all_gather, broadcast, barrier) on f32 / f16 / bf16
// buffers, each in a blocking and an asynchronous form. Backends:
//   - in-process (ThreadGroup): N ranks as N threads of one process sharing memory. Reductions
//     run in a fixed rank order, accumulating in fp32, so results are deterministic and
//     all_reduce agrees bitwise with reduce_scatter followed by all_gather.
//   - MPI (built with ZERO_WITH_MPI): ranks as processes launched by mpirun / srun.
//   - NCCL (built with ZERO_WITH_CUDA): one GPU per rank; buffers are device pointers.
// make_communicator() picks the backend and the rank / world size from the launcher's
// environment (torchrun, OpenMPI, PMI, Slurm) or from explicit options (CommOptions). This layer
// knows nothing of the training Config: zero/config/comm_config.hpp builds CommOptions from one.
//
// Collective semantics (all backends; NCCL's rules):
//   - all_gather, broadcast and all_to_all move bytes unchanged (no conversion, NaN payloads
//     kept): a payload of another type (the packed int8 blocks of zero/comm/quantized_comm.hpp) may
//     travel as f32 elements.
//   - Every rank of the group must issue the same collectives, in the same order, with the same
//     count, dtype, op and root. Several asynchronous collectives may be in flight; they run and
//     complete in issue order.
//   - 16-bit reductions accumulate in fp32 (in-process: one rounding per element; MPI: one
//     rounding per combining step). NCCL uses its own 16-bit reduction kernels.
//   - ReduceOp::kAvg is the sum divided by size(). kMax propagates NaN (in-process, MPI; NCCL:
//     ncclMax).
//   - Buffers must stay valid and unmodified (recv: untouched) until the collective completes.
//   - Every wait has a deadline of timeout_s() (CommOptions::timeout_s; from a Config:
//     comm_timeout_s, env ZERO_COMM_TIMEOUT_S).
//     When it passes, or another rank has failed, the wait throws zero::Error with code kTimeout
//     or kRemoteFailure whose message names the collective, its element count, dtype, op and the
//     ranks involved. After such a failure the communicator is broken: every later collective on
//     it fails with kRemoteFailure (a collective that lost a participant cannot be resumed). In
//     process, a failure breaks every communicator of the ThreadGroup, its splits included.
//
// Thread safety: a Communicator belongs to one rank and is used by one thread at a time (the
// rank's thread); stats(), events(), rank(), size(), timeout_s() may be read from any thread.
// CommHandle is move-only and must be waited on by the thread that uses the communicator.
// ThreadGroup::run is safe to call from any thread; each call creates an independent group.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "zero/core/dtype.hpp"
#include "zero/core/error.hpp"

namespace zero {

class Tracer;  // zero/core/trace.hpp

// The default deadline of every collective wait, in seconds. Config::comm_timeout_s has the same
// default (config.hpp does not include this header; keep the two equal).
inline constexpr double kDefaultCommTimeoutS = 600.0;

// ---- operations

enum class ReduceOp : std::uint8_t { kSum, kAvg, kMax };
// "sum", "avg", "max".
std::string_view to_string(ReduceOp op) noexcept;

enum class Collective : std::uint8_t {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kBarrier,
  kAllToAll,
};
inline constexpr std::size_t kNumCollectives = 6;
// "all_reduce", "reduce_scatter", "all_gather", "broadcast", "barrier", "all_to_all".
std::string_view to_string(Collective c) noexcept;

// ---- communication volume

// Bytes one rank sends and receives, per collective. The figures are the algorithm-independent
// volumes of the bandwidth-optimal (ring) algorithms, identical for every backend, with B the
// buffer size in bytes and N = size():
//   all_reduce      sent = received = 2 (N-1)/N * B       (B = count * dtype size)
//   reduce_scatter  sent = received = (N-1) * B           (B = recv_count * dtype size)
//   all_gather      sent = received = (N-1) * B           (B = send_count * dtype size)
//   broadcast       root: sent = B; others: received = B
//   barrier         0
//   all_to_all      sent = received = (N-1) * B           (B = count * dtype size: one chunk)
// so that stage-k communication per step can be compared with DESIGN.md's formulas.
struct CommCounters {
  std::uint64_t calls = 0;
  std::uint64_t bytes_sent = 0;
  std::uint64_t bytes_received = 0;
};

struct CommStats {
  std::array<CommCounters, kNumCollectives> by_op{};
  // Time, in nanoseconds: collectives executing on this rank (each from the moment its backend
  // began it to its completion, overlapped with compute or not: the total communication time),
  // and this rank's calling thread blocked on collectives (blocking collectives whole, waits on
  // handles: the exposed communication time). Counted always (two clock reads a collective).
  std::uint64_t busy_ns = 0;
  std::uint64_t wait_ns = 0;
  // How many times reset_stats() ran: two readings with the same value can be subtracted.
  std::uint64_t resets = 0;
  const CommCounters& operator[](Collective c) const { return by_op[static_cast<std::size_t>(c)]; }
  std::uint64_t bytes_sent() const;
  std::uint64_t bytes_received() const;
};

// ---- collective timestamps

// One collective this rank ran, as Communicator::events() reports it (recording is opt-in:
// set_event_capacity()). Times are this process's steady_clock, so events of the ranks of one
// ThreadGroup compare directly; across processes only durations do.
//   issued    the caller issued it (the blocking or *_async call was entered).
//   started   this rank's backend began executing it: the in-process and MPI backends, when the
//             communicator's worker thread (or, for a blocking collective run inline, the
//             caller's thread) started the collective. This includes the time spent waiting for
//             the other ranks to join. NCCL: when it was enqueued on the GPU stream (the host
//             does not know when the GPU started it).
//   finished  this rank's backend had completed it (in-process, MPI: on the thread that ran
//             it). NCCL: when the host first observed completion, in CommHandle::test() or
//             wait(), so it is no earlier than the GPU's completion and may be much later.
// issued <= started <= finished.
struct CollectiveEvent {
  Collective kind = Collective::kBarrier;
  std::size_t count = 0;  // elements, as passed to the collective (see detail::CollectiveArgs)
  DType dtype = DType::kF32;
  // Index of this collective among all collectives issued on this communicator (0-based,
  // counted whether or not recording was on). The ranks of a group issue the same collectives
  // in the same order, so equal seq on two ranks is the same collective.
  std::uint64_t seq = 0;
  std::chrono::steady_clock::time_point issued{};
  std::chrono::steady_clock::time_point started{};
  std::chrono::steady_clock::time_point finished{};
  // What the caller said the collective is for (tag_next(): the engine passes the unit, or the
  // first unit of a bucket); -1: nothing.
  std::int64_t tag = -1;
};

// What the units a tagged collective moves are on this rank (Communicator::tag_next): their
// parameters' elements before padding and a digest of their shapes, groups and frozen flags
// (the engine's detail::UnitLayout). Ranks whose models differ by less than the padding move the
// same count; this is what tells them apart. {0, 0}: not said.
struct TagLayout {
  std::uint64_t elements = 0;
  std::uint64_t digest = 0;
};

// ---- asynchronous completion

namespace detail {
class EventLog;    // comm/event_log.hpp
class EventProbe;  // comm/event_log.hpp

// What a backend hands back for one issued collective. Implemented by WorkerRequest
// (comm/ordered_worker.hpp: the in-process and MPI backends) and NcclRequest
// (comm/nccl_communicator.cpp).
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  // True once the collective is complete; throws zero::Error if it failed.
  virtual bool test() = 0;
  // Blocks until complete or the communicator's timeout; throws zero::Error on failure.
  virtual void wait() = 0;
};

// The arguments of one collective as the front end has validated them.
struct CollectiveArgs {
  Collective kind = Collective::kBarrier;
  const void* send = nullptr;
  void* recv = nullptr;
  std::size_t count = 0;  // all_reduce, broadcast: elements; reduce_scatter: recv_count;
                          // all_gather: send_count; all_to_all: elements per chunk
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;  // broadcast
  // Set by the front end: the collective's CollectiveEvent::seq and tag, and whether the backend
  // checks the ranks' fingerprints of it before running it (CommDebug::kDetail).
  std::uint64_t seq = 0;
  std::int64_t tag = -1;
  TagLayout tag_layout{};
  bool verify = false;
};
}  // namespace detail

// A collective in flight. Move-only. An empty handle (default-constructed, moved-from or
// already waited) is complete.
class CommHandle {
 public:
  CommHandle() = default;
  explicit CommHandle(std::unique_ptr<detail::CommRequest> request);
  CommHandle(CommHandle&&) noexcept;
  CommHandle& operator=(CommHandle&&) noexcept;
  CommHandle(const CommHandle&) = delete;
  CommHandle& operator=(const CommHandle&) = delete;
  // A handle dropped while its collective is in flight waits for it; a failure is then logged,
  // not thrown (it is raised again by the communicator's next collective).
  ~CommHandle();

  // Blocks until the collective has completed; afterwards the handle is empty.
  // Throws zero::Error(kTimeout) after timeout_s() of the communicator, kRemoteFailure when
  // another rank failed, kCommunication when the backend failed. The handle is empty afterwards
  // either way.
  void wait();
  // Non-blocking: true when complete (the handle is then empty). Throws like wait().
  bool test();
  bool valid() const noexcept { return request_ != nullptr; }

 private:
  friend class Communicator;
  std::unique_ptr<detail::CommRequest> request_;
  // Where wait() reports the time it blocked (set by the communicator that issued it).
  std::shared_ptr<detail::EventLog> log_;
  Collective kind_ = Collective::kBarrier;
  std::size_t bytes_ = 0;
  std::uint64_t seq_ = 0;
  std::int64_t tag_ = -1;
};

// ---- debugging

// How much a communicator checks across ranks (CommOptions::debug; config comm_debug, env
// ZERO_COMM_DEBUG; the meaning PyTorch's users know from TORCH_DISTRIBUTED_DEBUG).
//   kOff     the default. The in-process backend still compares every collective's fingerprint
//            (comm/fingerprint.hpp: seq, kind, count, dtype, op, root, unit tag) across its
//            ranks: they share memory, so it costs nothing.
//   kDetail  MPI and NCCL also all-gather each rank's 48-byte fingerprint before every
//            collective (one small collective more each), so ranks that disagree — one skipped
//            a unit's gather, reduces another count, has another model — fail at the collective
//            where they diverged, every rank with the same kInvalidArgument error naming both
//            calls and their units, instead of hanging until the timeout.
enum class CommDebug : std::uint8_t { kOff, kDetail };
// "off", "detail".
std::string_view to_string(CommDebug d) noexcept;

// ---- the communicator

class Communicator {
 public:
  virtual ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  // "thread", "mpi" or "nccl".
  virtual std::string_view backend() const noexcept = 0;
  // Ranks of this group in the communicator it was split from, transitively down to the world
  // communicator (world_ranks()[rank()] is this rank's world rank). Used in error messages.
  const std::vector<int>& world_ranks() const noexcept { return world_ranks_; }
  double timeout_s() const noexcept { return timeout_s_.load(std::memory_order_relaxed); }
  // Changes the deadline of collectives issued afterwards. REQUIRES: seconds > 0.
  void set_timeout_s(double seconds);

  // Communication volume so far (see CommCounters for what is counted).
  CommStats stats() const;
  void reset_stats();

  // Keeps the timestamps (CollectiveEvent) of the last `n` collectives that completed
  // successfully on this rank; 0 (the default) turns recording off and drops the record (the
  // timestamps are taken either way: CommStats::busy_ns / wait_ns). Collectives already in
  // flight when the capacity changes may or may not be recorded; a failed collective is not.
  // A communicator made by split() starts with recording off. Call from the thread that uses
  // the communicator.
  void set_event_capacity(std::size_t n);
  std::size_t event_capacity() const noexcept { return event_capacity_; }
  // The recorded events, oldest (lowest seq) first. Safe from any thread, concurrently with the
  // backend's worker recording: it copies the record under a mutex.
  std::vector<CollectiveEvent> events() const;
  // Records every collective's execution, time in flight and the caller's waits on it into
  // `tracer` (zero/core/trace.hpp; null: stop). REQUIRES: the tracer outlives the communicator's
  // collectives. Call from the thread that uses the communicator.
  void set_tracer(Tracer* tracer);
  Tracer* tracer() const noexcept { return tracer_; }
  // Collectives issued so far: the seq the next collective will have (CollectiveEvent::seq).
  std::uint64_t issued() const noexcept { return seq_; }
  // The next collective issued carries `tag` in its event and trace regions (the unit it moves)
  // and in its fingerprint (CommDebug). `layout` says what the tagged units are on this rank
  // (TagLayout) so that ranks whose models differ by less than the padding still fail the
  // fingerprint check.
  void tag_next(std::int64_t tag, TagLayout layout = {}) noexcept {
    next_tag_ = tag;
    next_layout_ = layout;
  }
  // The cross-rank checks (CommDebug) of collectives issued afterwards; split() passes it on.
  // Every rank of the group must use the same level (MPI, NCCL: the levels' collectives differ).
  void set_debug(CommDebug level) noexcept { debug_ = level; }
  CommDebug debug() const noexcept { return debug_; }
  // The flight recorder: this rank keeps its last `capacity` collectives (fingerprint; issued,
  // started, finished times) and the engine phase (set_phase), and writes them when a collective
  // of this communicator fails (timeout, remote failure, disagreement: once, a summary to stderr,
  // and a file when `dir` is set) or, with `dir` set, when the process gets SIGUSR1 (written, the
  // process goes on) or SIGTERM (written, then the default action: the process ends). The files
  // are <dir>/flight_rank<world rank>.json, read by zero-doctor (zero/comm/flight_report.hpp).
  // The signal handlers are installed by the first recorder with a dir, once per process; they
  // only write a byte to a pipe, a thread of the recorder's does the writing. 0: off (the
  // default of a communicator; make_communicator() applies CommOptions::flight_recorder).
  // split() passes it on. Call from the thread that uses the communicator.
  void set_flight_recorder(std::size_t capacity, const std::string& dir = {});
  // What the engine is doing (a string literal: "gather", "backward", "step", ...) and on which
  // unit (-1: none), for the flight recorder. Cheap: two relaxed stores.
  void set_phase(const char* phase, std::int64_t unit = -1) noexcept;

  // ---- collectives. Buffers are host memory for the thread and MPI backends and device memory
  // of this rank's GPU for NCCL. A count of 0 is valid (the collective still synchronises).
  // Bad arguments (null buffer with a non-zero count, a partial overlap that is not the in-place
  // position, a root out of range) throw zero::Error(kInvalidArgument) before anything is issued.
  // The *_async forms return when the collective is enqueued; wait on the handle before touching
  // the buffers.

  // recv[i] = op over ranks of send[i], i < count. In-place when recv == send.
  void all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op);
  CommHandle all_reduce_async(const void* send, void* recv, std::size_t count, DType dtype,
                              ReduceOp op);

  // send holds size() * recv_count elements; rank r receives in recv the reduction of elements
  // [r * recv_count, (r + 1) * recv_count). In-place when recv == send + rank() * recv_count
  // (elements); the rest of send is then left as it was.
  void reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType dtype,
                      ReduceOp op);
  CommHandle reduce_scatter_async(const void* send, void* recv, std::size_t recv_count, DType dtype,
                                  ReduceOp op);

  // recv (size() * send_count elements) receives rank q's send at offset q * send_count.
  // In-place when send == recv + rank() * send_count (elements).
  void all_gather(const void* send, void* recv, std::size_t send_count, DType dtype);
  CommHandle all_gather_async(const void* send, void* recv, std::size_t send_count, DType dtype);

  // Every rank's recv receives root's send. In-place on the root when send == recv; send is
  // ignored (may be null) on the other ranks.
  void broadcast(const void* send, void* recv, std::size_t count, DType dtype, int root);
  CommHandle broadcast_async(const void* send, void* recv, std::size_t count, DType dtype,
                             int root);

  void barrier();
  CommHandle barrier_async();

  // send holds size() chunks of `count` elements: chunk q goes to rank q; recv (size() * count
  // elements) receives rank q's chunk for this rank at offset q * count. Not in place: send and
  // recv must not overlap.
  void all_to_all(const void* send, void* recv, std::size_t count, DType dtype);
  CommHandle all_to_all_async(const void* send, void* recv, std::size_t count, DType dtype);

  // Splits this group into sub-groups: ranks passing the same color form one group, ordered by
  // key, then by rank here. Collective: every rank of this group must call it (after waiting for
  // its pending collectives is not required; it is ordered after them). Returns null for
  // color == kNoColor. REQUIRES: color >= 0 or kNoColor.
  static constexpr int kNoColor = -1;
  std::unique_ptr<Communicator> split(int color, int key);

 protected:
  Communicator(int rank, int size, std::vector<int> world_ranks, double timeout_s);

  // Issues one validated collective. Backends implement these two.
  virtual CommHandle start(const detail::CollectiveArgs& args) = 0;
  virtual std::unique_ptr<Communicator> split_impl(int color, int key) = 0;
  // Runs one validated collective to completion (the blocking forms). Default: start + wait;
  // a backend may run it on the calling thread when nothing is in flight.
  virtual void run_blocking(const detail::CollectiveArgs& args);

  // "all_reduce(1000 x f32, sum) on ranks {0,1,2,3}, rank 1": the text every error names.
  std::string describe(const detail::CollectiveArgs& args) const;

  // The timestamps of the collective being issued, for start() / run_blocking() to stamp on the
  // thread that executes it (EventProbe::started() / finished()). Empty when recording is off.
  // Take it once per collective, where the collective is executed (start() takes it when
  // run_blocking() falls back to it).
  detail::EventProbe take_event_probe();

 private:
  void check(const detail::CollectiveArgs& args) const;  // throws kInvalidArgument
  CommHandle issue(detail::CollectiveArgs args);
  void run(detail::CollectiveArgs args);
  void count(const detail::CollectiveArgs& args);

  // Opens the event of the collective about to be issued and stamps its seq, tag and verify
  // into args (the flight recorder's issued time when it is on).
  void open_event(detail::CollectiveArgs& args);

  int rank_;
  int size_;
  std::vector<int> world_ranks_;
  std::atomic<double> timeout_s_;
  std::array<std::array<std::atomic<std::uint64_t>, 3>, kNumCollectives> stats_{};
  std::atomic<std::uint64_t> resets_{0};
  // Collective timestamps (owning thread: seq_, event_capacity_, the pending event).
  std::uint64_t seq_ = 0;
  std::size_t event_capacity_ = 0;
  bool event_pending_ = false;
  CollectiveEvent pending_event_;
  std::shared_ptr<detail::EventLog> event_log_;  // shared with tasks that outlive this object
  Tracer* tracer_ = nullptr;
  std::int64_t next_tag_ = -1;
  TagLayout next_layout_;
  CommDebug debug_ = CommDebug::kOff;
  std::size_t flight_capacity_ = 0;
  std::string flight_dir_;
};

// ---- the in-process backend

// ThreadGroup::run: how long ranks have to return after their group failed before the process
// is ended, and the exit status it then ends with.
inline constexpr double kRankExitGraceS = 5.0;
inline constexpr int kStuckRankExitCode = 3;
// Threads an in-process rank takes at least: its own and its communicator's worker (each split
// communicator adds a worker).
inline constexpr int kThreadsPerRank = 2;
// Ranks ThreadGroup::run names one by one in its line about ranks that did not return; the
// others it counts.
inline constexpr int kRanksNamed = 8;

// N ranks as N threads of this process. run() is the usual entry point; communicator() lets a
// caller that manages its own threads take rank r's communicator instead.
class ThreadGroup {
 public:
  // `timeout_s`: the deadline of every collective wait, in seconds (a Config's:
  // config.comm_timeout_s). REQUIRES: size >= 1, timeout_s > 0 (throws kInvalidArgument).
  explicit ThreadGroup(int size, double timeout_s = kDefaultCommTimeoutS);
  ~ThreadGroup();
  ThreadGroup(ThreadGroup&&) noexcept;
  ThreadGroup& operator=(ThreadGroup&&) noexcept;
  ThreadGroup(const ThreadGroup&) = delete;
  ThreadGroup& operator=(const ThreadGroup&) = delete;

  int size() const noexcept;
  // Rank r's communicator; each rank can be taken once (kInvalidArgument otherwise). It must be
  // used on one thread. Destroying it makes the rank leave the group: the other ranks' waits on
  // collectives it has not joined fail with kRemoteFailure.
  std::unique_ptr<Communicator> communicator(int rank);
  // Marks the group failed on behalf of `rank` (for callers running their own threads): every
  // pending and future wait of the other ranks throws kRemoteFailure naming `rank` and `what`.
  void fail(int rank, std::string_view what);

  // The most ranks run() can start in this process now: the threads the kernel lets it start
  // (detail::thread_room: threads-max, RLIMIT_NPROC, the pids cgroup, vm.max_map_count) over
  // kThreadsPerRank. `why`, when given, receives the limit that binds.
  static int max_size(std::string* why = nullptr);
  // Throws zero::Error(kInvalidArgument) when `size` > max_size(), in one line that starts with
  // `what` and `size` ("--ranks 100000: this process can start at most 16374 in-process ranks
  // (...)"). run() calls it before it starts any thread; a program calls it first to name its
  // flag.
  static void check_size(int size, std::string_view what);

  // Runs fn(comm) on `size` new threads, one per rank, and joins them: first check_size(), so
  // an impossible size starts no thread. If a rank throws, the group fails (the other ranks'
  // waits throw kRemoteFailure promptly, no further rank is started) and, after every thread
  // has finished, run() rethrows the exception of the rank that failed first (a thread the
  // kernel refused: kOutOfMemory naming the rank). `timeout_s` as for the constructor.
  // A rank stuck outside collectives (a hang in its own code): once the group has failed (a rank
  // threw, or a wait timed out waiting for the stuck rank, i.e. after timeout_s) every rank has
  // kRankExitGraceS to return. A rank that has not is a thread that cannot be stopped, and
  // returning while it runs would leave it using fn's captures after they are gone: run() then
  // writes one line to stderr that leads with the cause, the group's first failure, then names
  // the first kRanksNamed ranks that did not return with their last collective and counts the
  // others, and ends the process with std::_Exit(kStuckRankExitCode). So a stuck or failed
  // rank ends the process within timeout_s + kRankExitGraceS. Without a failure there is no
  // deadline on the join (a rank may work on alone after the others returned).
  static void run(int size, const std::function<void(Communicator&)>& fn,
                  double timeout_s = kDefaultCommTimeoutS);

  struct State;  // comm/thread_world.hpp

 private:
  std::shared_ptr<State> state_;
};

// ---- launch detection and the factory

// Where this process sits in the job.
struct LaunchInfo {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  // Ranks on this process's node (LOCAL_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS,
  // SLURM_NTASKS_PER_NODE); 0: the launcher did not say. local_size_from: "VAR=value".
  int local_size = 0;
  std::string local_size_from;
  // Which variables the values came from: "explicit", "torchrun", "openmpi", "pmi", "slurm" or
  // "none" (a single process), comma-separated when several agreed.
  std::string source = "none";
  bool mpi_launcher = false;  // OMPI_*, PMI_* or SLURM_* present: MPI can bootstrap
};

// What make_communicator() needs: the communicator layer's own options. From a training Config:
// comm_options() in zero/config/comm_config.hpp.
struct CommOptions {
  // Explicit placement; -1 = from the environment. When both are given they must agree.
  int rank = -1;
  int size = -1;
  int local_rank = -1;
  // auto | thread | mpi | nccl; empty = not set, which make_communicator() takes as "auto" (and
  // comm_options() fills from Config::comm_backend). Another value is a kConfig error.
  std::string backend;
  // Deadline of every collective wait, in seconds (Communicator::timeout_s()). REQUIRES: > 0.
  double timeout_s = kDefaultCommTimeoutS;
  // auto picks NCCL only for device buffers (a CPU trainer on a GPU machine still gets MPI).
  bool device_buffers = false;
  // NCCL: the CUDA stream (cudaStream_t) whose earlier work every collective waits for before it
  // starts; null = the legacy default stream. The collectives run on their own stream.
  void* cuda_stream = nullptr;
  // Cross-rank checks of every collective (see CommDebug).
  CommDebug debug = CommDebug::kOff;
  // The flight recorder (Communicator::set_flight_recorder): the last `flight_recorder`
  // collectives kept (0: off), written on a failure (a summary to stderr) and, with `flight_dir`
  // set, to <flight_dir>/flight_rank<world rank>.json on a failure or on SIGUSR1 / SIGTERM.
  std::size_t flight_recorder = 64;
  std::string flight_dir;
  // NCCL: the GPU of this rank; -1 = local_rank.
  int device = -1;
  // NCCL bootstrap without MPI: a file both ranks can see (shared file system). Empty = TCP at
  // MASTER_ADDR:MASTER_PORT, or the file named by ZERO_NCCL_ID_FILE.
  std::string rendezvous_file;
};

// Reads RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE (torchrun),
// OMPI_COMM_WORLD_RANK/_SIZE/_LOCAL_RANK/_LOCAL_SIZE, PMI_RANK/PMI_SIZE (and MPI_LOCALRANKID,
// MPI_LOCALNRANKS), SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID/SLURM_NTASKS_PER_NODE, and the
// explicit options. Values from different sources must agree: a conflict, a malformed number,
// a rank outside [0, size) or a rank without a size is zero::Error(kConfig) naming the
// variables. `getenv` defaults to std::getenv (tests pass their own).
LaunchInfo detect_launch(const CommOptions& options = {},
                         const std::function<const char*(const char*)>& getenv = nullptr);

// Creates this rank's world communicator. Backend "auto": NCCL for device buffers when built
// with CUDA and a GPU is present; else MPI under an MPI launcher when built with MPI; else the
// in-process backend for a single process. "thread" with size > 1 is a
// kConfig error (use ThreadGroup). A backend not built in is kConfig; a backend that fails to
// start is kCommunication (NCCL: kCuda). A backend other than auto, thread, mpi or nccl is kConfig
// naming it; timeout_s <= 0 is kInvalidArgument.
std::unique_ptr<Communicator> make_communicator(const CommOptions& options = {});

// ---- the flight recorder's files (Communicator::set_flight_recorder), read back

// The one-screen answer from the flight_rank<r>.json files in `dir` (what zero-doctor prints):
// a line per rank of the largest group (where it is: the collective it waits at or the last it
// finished, its phase, why its record was written), then which rank is behind and where the
// others wait, e.g. "rank 2 stopped after seq 40 all_gather(512 x f32) unit 7, phase backward;
// ranks 0, 1 wait at seq 41 reduce_scatter(256 x f32, sum) unit 6". A rank of the group without
// a file is named as such (stopped, killed, or writing no records). Throws zero::Error(kIO) when
// `dir` holds no record, kCorruption naming the file when one is not a flight record.
std::string flight_report(const std::string& dir);

}  // namespace zero
