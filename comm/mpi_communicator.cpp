// The MPI backend: ranks as processes (mpirun / srun), one duplicated MPI communicator each.
//
// Asynchrony: each communicator owns a progress thread (OrderedWorker) that runs the blocking MPI
// collectives in issue order. Chosen over MPI_I* nonblocking collectives because Open MPI only
// progresses those inside MPI calls (so a rank computing between test() calls makes no
// progress) and its nonblocking algorithms are slower (bench_comm: raw_nb_GBps vs raw_GBps).
// Small blocking collectives skip the thread (run_blocking). Needs MPI_THREAD_MULTIPLE (splits
// have their own threads).
//
// 16-bit types travel as MPI_UINT16_T and reduce through user-defined ops that combine in fp32
// (host_reduce.hpp); f32 max is a user op too, so max propagates NaN on every backend. avg is a
// sum followed by a division by the group size on every rank.
//
// Failure: errors come back as codes (MPI_ERRORS_RETURN) and become zero::Error(kCommunication).
// A wait that times out marks the communicator broken (later collectives fail at once); its
// progress thread may stay blocked inside MPI, so it is detached at destruction and the MPI
// communicator is leaked rather than freed under a pending call.
#include <mpi.h>

#include <climits>
#include <cstring>
#include <mutex>
#include <thread>

#include "comm/backends.hpp"
#include "comm/event_log.hpp"
#include "comm/fingerprint.hpp"
#include "comm/host_reduce.hpp"
#include "comm/ordered_worker.hpp"
#include "zero/comm/comm.hpp"
#include "zero/core/log.hpp"

namespace zero::detail {

namespace {

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return detail::cat("MPI error ", code);
  return std::string(text, static_cast<std::size_t>(len));
}

// Every MPI call goes through here.
#define ZERO_MPI_CHECK(call, what)                                                              \
  do {                                                                                          \
    const int zero_mpi_rc_ = (call);                                                            \
    if (zero_mpi_rc_ != MPI_SUCCESS) [[unlikely]] {                                             \
      ZERO_THROW(kCommunication, what, ": ", #call, " failed: ", mpi_error_text(zero_mpi_rc_)); \
    }                                                                                           \
  } while (0)

// ---- user-defined reductions (MPI_User_function signature)
template <DType T, ReduceOp Op>
void combine_op(void* in, void* inout, int* len, MPI_Datatype*) {
  combine(in, inout, static_cast<std::size_t>(*len), T, Op);
}

// MPI initialisation and the user ops, once per process. Finalizes at exit when it initialised.
class MpiRuntime {
 public:
  static MpiRuntime& get() {
    static MpiRuntime runtime;
    return runtime;
  }

  MPI_Op op(DType t, ReduceOp o) const {
    const bool max = o == ReduceOp::kMax;
    switch (t) {
      case DType::kF32: return max ? max_f32_ : MPI_SUM;
      case DType::kF16: return max ? max_f16_ : sum_f16_;
      case DType::kBF16: return max ? max_bf16_ : sum_bf16_;
    }
    return MPI_OP_NULL;
  }
  static MPI_Datatype type(DType t) { return t == DType::kF32 ? MPI_FLOAT : MPI_UINT16_T; }

  // A progress thread was left blocked inside MPI: finalising would hang.
  void abandon() { abandoned_.store(true); }

 private:
  MpiRuntime() {
    int initialized = 0;
    ZERO_MPI_CHECK(MPI_Initialized(&initialized), "MPI start");
    int provided = 0;
    if (initialized) {
      ZERO_MPI_CHECK(MPI_Query_thread(&provided), "MPI start");
    } else {
      ZERO_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided),
                     "MPI start");
      owns_ = true;
    }
    ZERO_CHECK(provided >= MPI_THREAD_MULTIPLE, kCommunication, "MPI provides thread level ",
               provided, "; the MPI backend needs MPI_THREAD_MULTIPLE (its progress threads call ",
               "MPI); initialise MPI with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...)");
    ZERO_MPI_CHECK(MPI_Op_create(&combine_op<DType::kF16, ReduceOp::kSum>, 1, &sum_f16_), "MPI");
    ZERO_MPI_CHECK(MPI_Op_create(&combine_op<DType::kBF16, ReduceOp::kSum>, 1, &sum_bf16_), "MPI");
    ZERO_MPI_CHECK(MPI_Op_create(&combine_op<DType::kF32, ReduceOp::kMax>, 1, &max_f32_), "MPI");
    ZERO_MPI_CHECK(MPI_Op_create(&combine_op<DType::kF16, ReduceOp::kMax>, 1, &max_f16_), "MPI");
    ZERO_MPI_CHECK(MPI_Op_create(&combine_op<DType::kBF16, ReduceOp::kMax>, 1, &max_bf16_), "MPI");
  }
  ~MpiRuntime() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (abandoned_.load()) {
      // Neither the ops (a pending call may be using one) nor MPI (MPI_Finalize could wait
      // forever for the pending call) are released.
      ZERO_LOG(kWarn, "not finalising MPI: a timed-out collective is still blocked in MPI");
      return;
    }
    for (MPI_Op* o : {&sum_f16_, &sum_bf16_, &max_f32_, &max_f16_, &max_bf16_}) MPI_Op_free(o);
    if (!owns_) return;
    MPI_Finalize();
  }

  bool owns_ = false;
  std::atomic<bool> abandoned_{false};
  MPI_Op sum_f16_ = MPI_OP_NULL, sum_bf16_ = MPI_OP_NULL, max_f32_ = MPI_OP_NULL,
         max_f16_ = MPI_OP_NULL, max_bf16_ = MPI_OP_NULL;
};

// What the progress thread and the timeout handler share.
struct MpiState {
  MPI_Comm comm = MPI_COMM_NULL;
  std::vector<int> world_ranks;  // of the group, for the fingerprint check's errors
  std::mutex mu;
  bool broken = false;
  std::string broken_reason;
  std::vector<char> scratch;                 // in-place reduce_scatter; one collective at a time
  MPI_Request abandoned = MPI_REQUEST_NULL;  // a timed-out nonblocking call; caller's thread only

  void check_usable(const std::string& what) {
    std::lock_guard lock(mu);
    ZERO_CHECK(!broken, kRemoteFailure, what, ": the communicator is broken: ", broken_reason);
  }
  void mark_broken(std::string why) {
    std::lock_guard lock(mu);
    if (!broken) broken_reason = std::move(why);
    broken = true;
  }
  bool is_broken() {
    std::lock_guard lock(mu);
    return broken;
  }
};

int to_int_count(std::size_t n, const std::string& what) {
  ZERO_CHECK(n <= static_cast<std::size_t>(INT_MAX), kInvalidArgument, what,
             ": the MPI backend takes at most ", INT_MAX, " elements per rank here");
  return static_cast<int>(n);
}

// How run_collective completes each MPI call: blocking (on the progress thread, where the
// caller's wait holds the deadline), or nonblocking polled with MPI_Test until `deadline` (a
// blocking collective run on the caller's thread while nothing else is in flight: no thread
// hand-off, and the deadline still holds).
struct Completion {
  bool poll = false;
  Clock::time_point deadline{};
  double timeout_s = 0;
  int world_rank = 0;
};

// Polls one nonblocking request to completion or the deadline. On the deadline the request is
// left pending (MPI cannot cancel a collective): the communicator is marked broken and the
// buffers stay in MPI's hands.
void poll_request(MpiState& st, MPI_Request& req, const Completion& how, const std::string& what) {
  for (unsigned spins = 0;; ++spins) {
    int done = 0;
    ZERO_MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE), what);
    if (done) return;
    if ((spins & 255u) == 255u && Clock::now() > how.deadline) {
      const std::string why =
          detail::cat("rank ", how.world_rank, " timed out after ", how.timeout_s, " s in ", what,
                      " (a peer has not joined, has failed, or is far behind)");
      st.mark_broken(why);
      st.abandoned = req;  // the destructor gives it a last chance to finish
      ZERO_THROW(kTimeout, why);
    }
  }
}

// Either the blocking call, or the nonblocking one (last argument: the request) polled.
#define ZERO_MPI_RUN(how, st, what, blocking_fn, nonblocking_fn, ...) \
  do {                                                                \
    if ((how).poll) {                                                 \
      MPI_Request zero_req_ = MPI_REQUEST_NULL;                       \
      ZERO_MPI_CHECK(nonblocking_fn(__VA_ARGS__, &zero_req_), what);  \
      poll_request(st, zero_req_, how, what);                         \
    } else {                                                          \
      ZERO_MPI_CHECK(blocking_fn(__VA_ARGS__), what);                 \
    }                                                                 \
  } while (0)

// CommDebug::kDetail: every rank's fingerprint of this collective, all-gathered before it runs,
// checked by the one rule (fingerprint.hpp). Always the nonblocking all-gather, polled to the
// deadline: MPI does not match a blocking collective with a nonblocking one, and ranks that
// disagree may run this from different paths (a small collective inline, a large one on the
// progress thread).
void verify_same_call(MpiState& st, const CollectiveArgs& a, const std::string& what,
                      const Completion& how) {
  const Fingerprint mine = fingerprint_of(a);
  std::vector<Fingerprint> all(st.world_ranks.size());
  Completion polled = how;
  polled.poll = true;
  ZERO_MPI_RUN(polled, st, what, MPI_Allgather, MPI_Iallgather, &mine, sizeof(Fingerprint),
               MPI_BYTE, all.data(), sizeof(Fingerprint), MPI_BYTE, st.comm);
  check_same_call(all, st.world_ranks, what);
}

// The MPI call(s) of one collective.
void run_collective(MpiState& st, int rank, int size, const CollectiveArgs& a,
                    const std::string& what, const Completion& how) {
  st.check_usable(what);
  if (a.verify) verify_same_call(st, a, what, how);
  const MpiRuntime& rt = MpiRuntime::get();
  const MPI_Datatype type = MpiRuntime::type(a.dtype);
  const std::size_t es = dtype_size(a.dtype);
  const MPI_Op op = rt.op(a.dtype, a.op);
  switch (a.kind) {
    case Collective::kAllReduce: {
      // Chunks of at most INT_MAX elements (MPI counts are int).
      for (std::size_t done = 0; done < a.count;) {
        const std::size_t n = std::min<std::size_t>(a.count - done, INT_MAX);
        char* out = static_cast<char*>(a.recv) + done * es;
        const void* in =
            a.send == a.recv ? MPI_IN_PLACE : static_cast<const char*>(a.send) + done * es;
        ZERO_MPI_RUN(how, st, what, MPI_Allreduce, MPI_Iallreduce, in, out, static_cast<int>(n),
                     type, op, st.comm);
        done += n;
      }
      if (a.count == 0) ZERO_MPI_RUN(how, st, what, MPI_Barrier, MPI_Ibarrier, st.comm);
      break;
    }
    case Collective::kReduceScatter: {
      const int n = to_int_count(a.count, what);
      const bool in_place = a.recv == static_cast<const char*>(a.send) + rank * a.count * es;
      // MPI_IN_PLACE would leave the result at the start of send, not at this rank's shard.
      void* out = a.recv;
      if (in_place) {
        st.scratch.resize(a.count * es);
        out = st.scratch.data();
      }
      ZERO_MPI_RUN(how, st, what, MPI_Reduce_scatter_block, MPI_Ireduce_scatter_block, a.send, out,
                   n, type, op, st.comm);
      if (in_place && n > 0) std::memcpy(a.recv, out, a.count * es);
      break;
    }
    case Collective::kAllGather: {
      const int n = to_int_count(a.count, what);
      const bool in_place = a.send == static_cast<const char*>(a.recv) + rank * a.count * es;
      if (in_place) {
        ZERO_MPI_RUN(how, st, what, MPI_Allgather, MPI_Iallgather, MPI_IN_PLACE, 0,
                     MPI_DATATYPE_NULL, a.recv, n, type, st.comm);
      } else {
        ZERO_MPI_RUN(how, st, what, MPI_Allgather, MPI_Iallgather, a.send, n, type, a.recv, n, type,
                     st.comm);
      }
      break;
    }
    case Collective::kBroadcast: {
      if (rank == a.root && a.send != a.recv && a.count > 0) {
        std::memcpy(a.recv, a.send, a.count * es);
      }
      for (std::size_t done = 0; done < a.count;) {
        const std::size_t n = std::min<std::size_t>(a.count - done, INT_MAX);
        ZERO_MPI_RUN(how, st, what, MPI_Bcast, MPI_Ibcast, static_cast<char*>(a.recv) + done * es,
                     static_cast<int>(n), type, a.root, st.comm);
        done += n;
      }
      if (a.count == 0) ZERO_MPI_RUN(how, st, what, MPI_Barrier, MPI_Ibarrier, st.comm);
      break;
    }
    case Collective::kAllToAll: {
      const int n = to_int_count(a.count, what);
      ZERO_MPI_RUN(how, st, what, MPI_Alltoall, MPI_Ialltoall, a.send, n, type, a.recv, n, type,
                   st.comm);
      break;
    }
    case Collective::kBarrier:
      ZERO_MPI_RUN(how, st, what, MPI_Barrier, MPI_Ibarrier, st.comm);
      break;
  }
  if (a.op == ReduceOp::kAvg &&
      (a.kind == Collective::kAllReduce || a.kind == Collective::kReduceScatter)) {
    divide_by(a.recv, a.count, a.dtype, static_cast<float>(size));
  }
}

std::vector<int> world_ranks_of(MPI_Comm comm) {
  int size = 0;
  ZERO_MPI_CHECK(MPI_Comm_size(comm, &size), "MPI group");
  MPI_Group group, world;
  ZERO_MPI_CHECK(MPI_Comm_group(comm, &group), "MPI group");
  ZERO_MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &world), "MPI group");
  std::vector<int> local(size), global(size);
  for (int r = 0; r < size; ++r) local[r] = r;
  ZERO_MPI_CHECK(MPI_Group_translate_ranks(group, size, local.data(), world, global.data()),
                 "MPI group");
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  return global;
}

// How long a broken communicator's destructor waits, in all, for the collective that timed out
// to finish after all (a peer that was late rather than dead completes it, and the
// communicator can then be freed and MPI finalised); after that the call is left behind. The
// collective was already given comm_timeout_s, and a dead peer never completes it: this is all
// a rank adds after its timeout before it can exit (it was 10 s twice). 3 s: comm_mpi_test's late
// rank arrives 1.5 s after the others' timeout, and MPI is then still finalised cleanly.
constexpr std::chrono::milliseconds kBrokenGrace{3000};
// Per-rank bytes up to which a blocking collective runs inline (see run_blocking).
constexpr std::size_t kInlineMaxBytes = 8 << 10;

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of comm.
  MpiCommunicator(MPI_Comm comm, int rank, int size, double timeout_s)
      : Communicator(rank, size, world_ranks_of(comm), timeout_s),
        state_(std::make_shared<MpiState>()),
        worker_(world_ranks()[rank], std::chrono::microseconds(0)) {  // MPI polls itself
    state_->comm = comm;
    state_->world_ranks = world_ranks();
    ZERO_MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), "MPI communicator");
  }

  ~MpiCommunicator() override {
    // A timed-out collective may never return: give a late peer kBrokenGrace (one deadline for
    // the progress thread and the abandoned request together) to complete it, then leave it
    // behind.
    const auto until = Clock::now() + kBrokenGrace;
    const bool joined =
        worker_.stop(state_->is_broken() ? std::chrono::duration<double>(kBrokenGrace)
                                         : std::chrono::hours(24 * 365));
    bool settled = true;
    if (state_->abandoned != MPI_REQUEST_NULL) {
      settled = false;
      while (!settled && Clock::now() < until) {
        int done = 0;
        if (MPI_Test(&state_->abandoned, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
        settled = done != 0;
        if (!settled) std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    }
    if (!joined || !settled) {
      MpiRuntime::get().abandon();  // MPI_Finalize could wait forever for the pending call
      return;  // the MPI communicator is leaked: freeing it under a pending call is undefined
    }
    MPI_Comm_free(&state_->comm);
  }

  std::string_view backend() const noexcept override { return "mpi"; }

 protected:
  CommHandle start(const CollectiveArgs& args) override {
    std::string what = describe(args);
    state_->check_usable(what);  // a broken communicator fails at once, not behind a stuck call
    const double timeout = timeout_s();
    // Blocking or nonblocking MPI is chosen by the size alone, never by which thread runs the
    // call: MPI does not match a nonblocking collective with a blocking one, and ranks may take
    // different paths (inline on one, the progress thread on another) for the same collective.
    const bool polled = small(args);
    auto task = worker_.submit(
        [st = state_, r = rank(), n = size(), args, what, polled, timeout,
         me = world_ranks()[rank()], probe = take_event_probe()]() mutable {
          probe.started();
          Completion how;  // the deadline also bounds a fingerprint check (verify_same_call)
          how.poll = polled;
          how.timeout_s = timeout;
          how.deadline = deadline_after(timeout);
          how.world_rank = me;
          run_collective(*st, r, n, args, what, how);
          probe.finished();
        },
        what);
    return CommHandle(std::make_unique<WorkerRequest>(
        worker_.shared(), std::move(task), timeout,
        [st = state_, worker = worker_.shared(), me = world_ranks()[rank()]](
            const OrderedWorker::Task& t, double s) {
          const std::string why =
              detail::cat("rank ", me, " timed out after ", s, " s in ", t.what,
                          " (a peer has not joined, has failed, or is far behind)");
          st->mark_broken(why);
          // The progress thread may be stuck in this call: what is queued behind it fails now.
          worker->mark_broken(why);
          return Error(ErrorCode::kTimeout, why, __FILE__, __LINE__);
        }));
  }

  // Small collectives (up to kInlineMaxBytes per rank) are nonblocking MPI calls polled up to
  // the deadline; a blocking one runs on the caller's thread when nothing is in flight (no
  // hand-off to the progress thread: tens of microseconds on a busy machine), else after what is
  // queued on the progress thread. Larger ones are the tuned blocking algorithms on the progress
  // thread: Open MPI's nonblocking algorithms (libnbc) were measured 2-30x slower than those
  // from 16 KiB up (bench_comm, raw_nb_GBps vs raw_GBps), where a hand-off costs nothing.
  bool small(const CollectiveArgs& args) const {
    const std::size_t per_rank =
        args.kind == Collective::kReduceScatter || args.kind == Collective::kAllGather
            ? args.count * dtype_size(args.dtype) * static_cast<std::size_t>(size())
            : args.count * dtype_size(args.dtype);
    return per_rank <= kInlineMaxBytes;
  }

  void run_blocking(const CollectiveArgs& args) override {
    if (!small(args)) {
      start(args).wait();
      return;
    }
    const std::string what = describe(args);
    state_->check_usable(what);
    Completion how;
    how.poll = true;
    how.timeout_s = timeout_s();
    how.deadline = deadline_after(how.timeout_s);
    how.world_rank = world_ranks()[rank()];
    if (!worker_.try_run_inline([&] {
          detail::EventProbe probe = take_event_probe();
          probe.started();
          run_collective(*state_, rank(), size(), args, what, how);
          probe.finished();
        })) {
      start(args).wait();  // polled too: the same MPI call as inline
    }
  }

  std::unique_ptr<Communicator> split_impl(int color, int key) override {
    MPI_Comm child = MPI_COMM_NULL;
    const std::string what = detail::cat("split(color ", color, ", key ", key, ")");
    worker_.run_sync(
        [&, st = state_] {
          st->check_usable(what);
          ZERO_MPI_CHECK(
              MPI_Comm_split(st->comm, color == kNoColor ? MPI_UNDEFINED : color, key, &child),
              what);
        },
        what);
    if (child == MPI_COMM_NULL) return nullptr;
    int r = 0, n = 0;
    MPI_Comm_rank(child, &r);
    MPI_Comm_size(child, &n);
    return std::make_unique<MpiCommunicator>(child, r, n, timeout_s());
  }

 private:
  std::shared_ptr<MpiState> state_;
  OrderedWorker worker_;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(const LaunchInfo& launch, double timeout_s) {
  MpiRuntime::get();
  int rank = 0, size = 0;
  ZERO_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "MPI start");
  ZERO_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size), "MPI start");
  ZERO_CHECK(launch.source == "none" || (launch.rank == rank && launch.size == size), kConfig,
             "MPI places this process at rank ", rank, " of ", size, " but ", launch.source,
             " says rank ", launch.rank, " of ", launch.size);
  MPI_Comm comm = MPI_COMM_NULL;
  ZERO_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm), "MPI start");
  return std::make_unique<MpiCommunicator>(comm, rank, size, timeout_s);
}

}  // namespace zero::detail
