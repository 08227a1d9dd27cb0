// The in-process backend: N ranks as N threads sharing memory.
//
// Each rank's communicator runs its collectives on its own worker thread (OrderedWorker), so the
// async forms overlap with the rank's compute and complete in issue order. A collective is three
// steps on every rank's worker: post its arguments and meet at an entry barrier; do this rank's
// share of the work straight from / into the other ranks' buffers; meet at an exit barrier (after
// which no rank touches another's buffers, so the collective is complete everywhere).
//
// Work split (bandwidth-efficient for shared memory, no staging copies):
//   reduce_scatter  rank r reduces shard r from every rank's send into its recv.
//   all_reduce      rank r reduces piece r (count split into N balanced pieces) from every send
//                   and writes the result into every rank's recv.
//   all_gather      rank r copies every rank's send into its own recv.
//   broadcast       rank r copies the root's send into its own recv.
// Reductions visit ranks in the order 0..N-1 with an fp32 accumulator and round once, so every
// element's value depends only on the inputs: all_reduce == reduce_scatter + all_gather bitwise.
//
// Failure: every group of one ThreadGroup (splits included) shares a World. The first failure (a
// rank that threw, a timed-out wait, a rank that left) is recorded there and wakes every barrier
// of every group, so the other ranks fail promptly with kRemoteFailure naming it. Only mutexes
// and condition variables synchronise (no TBB, no lock-free tricks): the backend is TSan-clean.
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <mutex>
#include <system_error>
#include <thread>

#include "comm/event_log.hpp"
#include "comm/fingerprint.hpp"
#include "comm/host_reduce.hpp"
#include "comm/ordered_worker.hpp"
#include "comm/thread_world.hpp"
#include "core/process_limits.hpp"
#include "zero/comm/comm.hpp"
#include "zero/core/log.hpp"

namespace zero {

namespace {

using detail::Clock;
using detail::CollectiveArgs;

using detail::Group;
using detail::make_group;
using detail::rank_list;
using detail::World;

// ---------------------------------------------------------------------------------------------
// The work of one rank in one collective (between the barriers)

char* elem_ptr(void* base, std::size_t elements, DType t) {
  return static_cast<char*>(base) + elements * dtype_size(t);
}

// Reduces elements [begin, end) of every rank's send and stores the result at dst_offset
// (elements) of every target buffer.
void reduce_range(const Group& g, DType dtype, ReduceOp op, std::size_t begin, std::size_t end,
                  void* const* targets, int n_targets, std::size_t dst_offset) {
  std::vector<const void*> srcs(g.n);
  for (int q = 0; q < g.n; ++q) srcs[q] = g.posted[q].send;
  std::vector<float> buffers(2 * detail::kReduceBlock);
  float* acc = buffers.data();
  float* scratch = acc + detail::kReduceBlock;
  std::vector<std::uint16_t> narrow(dtype == DType::kF32 ? 0 : detail::kReduceBlock);
  const bool streaming =
      (end - begin) * dtype_size(dtype) * n_targets >= detail::kStreamingThreshold;
  for (std::size_t i = begin; i < end; i += detail::kReduceBlock) {
    const std::size_t len = std::min(detail::kReduceBlock, end - i);
    detail::reduce_block(srcs.data(), g.n, i, len, dtype, op, acc, scratch);
    const void* result = acc;
    if (dtype != DType::kF32) {
      convert(acc, DType::kF32, narrow.data(), dtype, len);
      result = narrow.data();
    }
    for (int t = 0; t < n_targets; ++t) {
      detail::copy_out(elem_ptr(targets[t], dst_offset + (i - begin), dtype), result,
                       len * dtype_size(dtype), streaming);
    }
  }
  if (streaming) detail::stream_fence();  // before the exit barrier publishes the results
}

// The fingerprint rule of every backend (fingerprint.hpp), on the arguments the ranks posted.
void check_same_collective(const Group& g, const std::string& what) {
  const detail::Fingerprint first = detail::fingerprint_of(g.posted[0]);
  for (int q = 1; q < g.n; ++q) {
    if (detail::same_call(first, detail::fingerprint_of(g.posted[q]))) continue;
    std::vector<detail::Fingerprint> all(g.n);
    for (int p = 0; p < g.n; ++p) all[p] = detail::fingerprint_of(g.posted[p]);
    detail::check_same_call(all, g.world_ranks, what);
  }
}

void do_share(const Group& g, int r, const CollectiveArgs& a) {
  const std::size_t n = static_cast<std::size_t>(g.n);
  const DType t = a.dtype;
  const std::size_t es = dtype_size(t);
  switch (a.kind) {
    case Collective::kReduceScatter: {
      void* target = a.recv;
      reduce_range(g, t, a.op, r * a.count, (r + 1) * a.count, &target, 1, 0);
      break;
    }
    case Collective::kAllReduce: {
      const std::size_t base = a.count / n;
      const std::size_t rem = a.count % n;
      const std::size_t begin = r * base + std::min<std::size_t>(r, rem);
      const std::size_t end = begin + base + (static_cast<std::size_t>(r) < rem ? 1 : 0);
      std::vector<void*> targets(n);
      for (std::size_t q = 0; q < n; ++q) targets[q] = g.posted[q].recv;
      reduce_range(g, t, a.op, begin, end, targets.data(), g.n, begin);
      break;
    }
    case Collective::kAllGather:
      for (std::size_t q = 0; q < n; ++q) {
        char* dst = elem_ptr(a.recv, q * a.count, t);
        if (dst != g.posted[q].send && a.count > 0) {
          std::memcpy(dst, g.posted[q].send, a.count * es);
        }
      }
      break;
    case Collective::kBroadcast: {
      const void* src = g.posted[a.root].send;
      if (a.recv != src && a.count > 0) std::memcpy(a.recv, src, a.count * es);
      break;
    }
    case Collective::kAllToAll:  // rank q's chunk r into this rank's slot q
      for (std::size_t q = 0; q < n && a.count > 0; ++q) {
        std::memcpy(elem_ptr(a.recv, q * a.count, t),
                    static_cast<const char*>(g.posted[q].send) + r * a.count * es, a.count * es);
      }
      break;
    case Collective::kBarrier: break;
  }
}

// One collective on rank r: post, meet, do this rank's share, meet again.
void execute(Group& g, int r, const CollectiveArgs& args, const std::string& what, double timeout) {
  g.check_failed(what);
  g.posted[r] = args;
  g.arrive_and_wait(r, timeout, what);
  std::exception_ptr error;
  try {
    check_same_collective(g, what);
    do_share(g, r, args);
  } catch (...) {
    error = std::current_exception();
  }
  g.arrive_and_wait(r, timeout, what);
  if (error) std::rethrow_exception(error);
}

// ---------------------------------------------------------------------------------------------
// The communicator of one rank

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<Group> group, int rank, double timeout_s)
      : Communicator(rank, group->n, group->world_ranks, timeout_s),
        group_(std::move(group)),
        worker_(group_->world_ranks[rank]) {}

  ~ThreadCommunicator() override {
    // Queued collectives still run (each fails fast if the group has failed); then the rank
    // leaves, so peers waiting for it at a later collective fail instead of hanging.
    worker_.stop(std::chrono::hours(24 * 365));
    group_->leave(rank(), std::uncaught_exceptions() > 0);
  }

  std::string_view backend() const noexcept override { return "thread"; }

 protected:
  CommHandle start(const CollectiveArgs& args) override {
    std::string what = describe(args);
    group_->check_failed(what);
    const double timeout = timeout_s();
    const int me = group_->world_ranks[rank()];
    group_->world->issued(me, what);
    auto task = worker_.submit(
        [g = group_, r = rank(), me, args, what, timeout, probe = take_event_probe()]() mutable {
          probe.started();
          execute(*g, r, args, what, timeout);
          probe.finished();
          g->world->completed(me);
        },
        what);
    return CommHandle(std::make_unique<detail::WorkerRequest>(
        worker_.shared(), std::move(task), timeout,
        [g = group_, r = rank()](const detail::OrderedWorker::Task& t, double s) {
          return g->timed_out(r, s, t.what, g->missing());
        }));
  }

  // Blocking collectives run on the rank's own thread when its worker is idle: the same steps,
  // two thread hand-offs fewer. The barriers' deadlines still bound the wait.
  void run_blocking(const CollectiveArgs& args) override {
    const std::string what = describe(args);
    group_->check_failed(what);
    const double timeout = timeout_s();
    const int me = group_->world_ranks[rank()];
    if (!worker_.try_run_inline([&] {
          detail::EventProbe probe = take_event_probe();
          group_->world->issued(me, what);
          probe.started();
          execute(*group_, rank(), args, what, timeout);
          probe.finished();
          group_->world->completed(me);
        })) {
      start(args).wait();
    }
  }

  std::unique_ptr<Communicator> split_impl(int color, int key) override {
    std::shared_ptr<Group> child;
    int child_rank = -1;
    const std::string what =
        detail::cat("split(color ", color, ", key ", key, ") of ranks ", rank_list(world_ranks()));
    const double timeout = timeout_s();
    const int me = group_->world_ranks[rank()];
    group_->world->issued(me, what);
    worker_.run_sync(
        [&, g = group_, r = rank()] {
          g->check_failed(what);
          g->split_keys[r] = {color, key};
          g->arrive_and_wait(r, timeout, what);
          // Members of my color ordered by (key, rank); the first creates the shared group.
          std::vector<int> members;
          if (color != kNoColor) {
            for (int q = 0; q < g->n; ++q) {
              if (g->split_keys[q].first == color) members.push_back(q);
            }
            std::stable_sort(members.begin(), members.end(), [&](int x, int y) {
              return g->split_keys[x].second < g->split_keys[y].second;
            });
            if (members.front() == r) {
              std::vector<int> ranks;
              for (int q : members) ranks.push_back(g->world_ranks[q]);
              g->split_out[r] = make_group(g->world, std::move(ranks));
            }
          }
          g->arrive_and_wait(r, timeout, what);
          if (color != kNoColor) {
            child = g->split_out[members.front()];
            child_rank =
                static_cast<int>(std::find(members.begin(), members.end(), r) - members.begin());
          }
          g->arrive_and_wait(r, timeout, what);
          if (!members.empty() && members.front() == r) g->split_out[r].reset();  // all took it
        },
        what);
    group_->world->completed(me);
    if (!child) return nullptr;
    return std::make_unique<ThreadCommunicator>(std::move(child), child_rank, timeout);
  }

 private:
  std::shared_ptr<Group> group_;
  detail::OrderedWorker worker_;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// ThreadGroup

ThreadGroup::ThreadGroup(int size, double timeout_s) {
  ZERO_CHECK(size >= 1, kInvalidArgument, "ThreadGroup size must be >= 1, got ", size);
  ZERO_CHECK(timeout_s > 0, kInvalidArgument, "ThreadGroup timeout must be > 0 s, got ", timeout_s);
  state_ = std::make_shared<State>();
  state_->world = std::make_shared<World>(size);
  std::vector<int> ranks(size);
  for (int r = 0; r < size; ++r) ranks[r] = r;
  state_->group = make_group(state_->world, std::move(ranks));
  state_->timeout_s = timeout_s;
}

ThreadGroup::~ThreadGroup() = default;
ThreadGroup::ThreadGroup(ThreadGroup&&) noexcept = default;
ThreadGroup& ThreadGroup::operator=(ThreadGroup&&) noexcept = default;

int ThreadGroup::size() const noexcept { return state_ ? state_->group->n : 0; }

std::unique_ptr<Communicator> ThreadGroup::communicator(int rank) {
  ZERO_CHECK(state_ != nullptr, kInvalidArgument, "ThreadGroup was moved from");
  Group& g = *state_->group;
  ZERO_CHECK(rank >= 0 && rank < g.n, kInvalidArgument, "ThreadGroup rank ", rank,
             " is out of range for size ", g.n);
  {
    std::lock_guard lock(g.mu);
    ZERO_CHECK(!g.taken[rank], kInvalidArgument, "ThreadGroup rank ", rank,
               "'s communicator was already taken");
    g.taken[rank] = 1;
  }
  return std::make_unique<ThreadCommunicator>(state_->group, rank, state_->timeout_s);
}

void ThreadGroup::fail(int rank, std::string_view what) {
  ZERO_CHECK(state_ != nullptr, kInvalidArgument, "ThreadGroup was moved from");
  state_->world->fail(ErrorCode::kRemoteFailure, rank,
                      detail::cat("rank ", rank, " failed: ", what));
}

namespace {

// Ends the process because ranks did not return after the group failed: a thread cannot be
// stopped, and returning to the caller while it runs would leave it using the caller's captures
// (and, at exit, statics) after they are destroyed. One line on stderr, written with write(2) so
// that a rank stuck holding stdio's lock cannot block it: the cause (the group's first failure)
// first, then its consequence, the ranks that did not return — the first kRanksNamed by name
// with what each did last, the others counted — so that the line stays short at any size.
[[noreturn]] void end_process_for_stuck_ranks(World& world, const std::vector<int>& stuck, int size,
                                              double grace_s) {
  std::string line =
      detail::cat("zero: ThreadGroup::run: the group failed: ", world.failure(), "; then ",
                  stuck.size(), " of ", size, " ranks did not return within ", grace_s, " s: ");
  const std::size_t named = std::min(stuck.size(), static_cast<std::size_t>(kRanksNamed));
  for (std::size_t k = 0; k < named; ++k) {
    line += detail::cat(k == 0 ? "" : "; ", "rank ", stuck[k], " did not return (",
                        world.doing(stuck[k]), ")");
  }
  if (stuck.size() > named) line += detail::cat("; and ", stuck.size() - named, " more");
  line += detail::cat("; a rank thread cannot be stopped, so the process ends with status ",
                      kStuckRankExitCode, "\n");
  if (::ftrylockfile(stdout) == 0) {  // keep what the ranks printed, unless a rank holds stdout
    std::fflush(stdout);
    ::funlockfile(stdout);
  }
  for (std::size_t done = 0; done < line.size();) {
    const ssize_t k = ::write(2, line.data() + done, line.size() - done);
    if (k <= 0) break;
    done += static_cast<std::size_t>(k);
  }
  std::_Exit(kStuckRankExitCode);
}

// Which ranks of run() have returned, for its join (guarded by mu).
struct Returns {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<char> returned;
  explicit Returns(int size) : returned(static_cast<std::size_t>(size), 0) {}
  // REQUIRES: mu held. Whether the first `started` ranks have all returned.
  bool all(std::size_t started) const {
    for (std::size_t r = 0; r < started; ++r) {
      if (!returned[r]) return false;
    }
    return true;
  }
};

// Rank r's thread of run(): fn on its communicator; a failure is kept in `error` and fails the
// group (with its message) before the rank leaves it.
void run_rank(ThreadGroup& group, int r, int size, const std::function<void(Communicator&)>& fn,
              std::exception_ptr& error, Returns& returns) {
  set_log_rank(r);
  {
    // The communicator outlives the catch: the group learns of the failure (with its message)
    // before this rank leaves it.
    std::unique_ptr<Communicator> comm;
    try {
      try {
        comm = group.communicator(r);
      } catch (const std::system_error& e) {  // the kernel refused its worker thread
        ZERO_THROW(kOutOfMemory, "could not start the communicator thread of rank ", r, " of ",
                   size, ": ", e.what());
      }
      fn(*comm);
    } catch (...) {
      error = std::current_exception();
      std::string what = "unknown exception";
      try {
        throw;
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      group.fail(r, what);
    }
  }
  std::lock_guard lock(returns.mu);
  returns.returned[static_cast<std::size_t>(r)] = 1;
  returns.cv.notify_all();
}

// Starts rank r's thread (`rank_main(r)`) for every rank until the group fails. A thread the
// kernel refuses fails the group; its error is returned (null: every rank started).
template <typename RankMain>
std::exception_ptr start_ranks(ThreadGroup& group, World& world, int size,
                               std::vector<std::thread>& threads, RankMain& rank_main) {
  threads.reserve(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) {
    // Once the group has failed, a rank started now would only fail in turn.
    if (world.failed.load(std::memory_order_acquire)) break;
    try {
      threads.emplace_back(rank_main, r);
    } catch (const std::exception& e) {
      const std::string why =
          detail::cat("could not start the thread of rank ", r, " of ", size, ": ", e.what());
      std::exception_ptr error =
          std::make_exception_ptr(Error(ErrorCode::kOutOfMemory, why, __FILE__, __LINE__));
      group.fail(r, why);
      return error;
    }
  }
  return nullptr;
}

// Waits until the `started` ranks have returned, but once the group has failed gives the ranks
// still running kRankExitGraceS to notice (at their next collective) and return, then ends the
// process. Without a failure there is no deadline: a rank may legitimately work on alone after
// the others returned (rank 0 evaluating, saving).
void await_ranks(World& world, Returns& returns, std::size_t started, int size) {
  const auto grace =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(kRankExitGraceS));
  std::unique_lock lock(returns.mu);
  while (!returns.all(started)) {
    returns.cv.wait_for(lock, std::chrono::milliseconds(20));  // also polls world.failed
    if (returns.all(started) || !world.failed.load(std::memory_order_acquire)) continue;
    Clock::time_point failed_at;
    {
      std::lock_guard world_lock(world.mu);
      failed_at = world.failed_at;
    }
    if (Clock::now() < failed_at + grace) continue;
    std::vector<int> stuck;
    for (std::size_t r = 0; r < started; ++r) {
      if (!returns.returned[r]) stuck.push_back(static_cast<int>(r));
    }
    end_process_for_stuck_ranks(world, stuck, size, kRankExitGraceS);
  }
}

// The root cause is the rank that failed first; the others' errors are consequences.
void rethrow_first_failure(World& world, const std::vector<std::exception_ptr>& errors,
                           const std::exception_ptr& spawn_error) {
  int first = -1;
  {
    std::lock_guard lock(world.mu);
    first = world.failed_rank;
  }
  const auto size = static_cast<int>(errors.size());
  if (first >= 0 && first < size && errors[static_cast<std::size_t>(first)]) {
    std::rethrow_exception(errors[static_cast<std::size_t>(first)]);
  }
  if (spawn_error) std::rethrow_exception(spawn_error);
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace

int ThreadGroup::max_size(std::string* why) {
  const detail::ThreadRoom room = detail::thread_room();
  if (why != nullptr) *why = room.from;
  return static_cast<int>(
      std::min<std::size_t>(room.threads / kThreadsPerRank, std::numeric_limits<int>::max()));
}

void ThreadGroup::check_size(int size, std::string_view what) {
  std::string why;
  const int most = max_size(&why);
  ZERO_CHECK(size <= most, kInvalidArgument, what, " ", size, ": this process can start at most ",
             most, " in-process ranks (", kThreadsPerRank, " threads each; ", why, ")");
}

void ThreadGroup::run(int size, const std::function<void(Communicator&)>& fn, double timeout_s) {
  check_size(size, "ThreadGroup::run: size");
  ThreadGroup group(size, timeout_s);
  World& world = *group.state_->world;
  std::vector<std::exception_ptr> errors(size);
  Returns returns(size);
  // Every capture is a local of this frame: run() neither returns nor throws while a rank thread
  // is alive (it joins them all, or ends the process), so the references stay valid.
  auto rank_main = [&](int r) {
    run_rank(group, r, size, fn, errors[static_cast<std::size_t>(r)], returns);
  };
  std::vector<std::thread> threads;
  const std::exception_ptr spawn_error = start_ranks(group, world, size, threads, rank_main);
  await_ranks(world, returns, threads.size(), size);
  for (auto& t : threads) t.join();
  rethrow_first_failure(world, errors, spawn_error);
}

}  // namespace zero
