// comm/ordered_worker.hpp — one thread that runs a communicator's collectives in issue order.
//
// The in-process and MPI backends issue every collective to an OrderedWorker: submit() returns
// at once with a Task; the worker thread runs the tasks one after the other (so several may be
// in flight and they complete in issue order), and WorkerRequest turns a Task into the
// CommHandle the caller waits on, with the communicator's deadline. What happens on a timeout
// (abort the group, name the missing ranks) is the backend's, through a callback.
//
// Thread safety: submit() and stop() from the owning rank's thread; Task state is guarded by the
// worker's mutex (done is also atomic, for polling); waiting from any thread is safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "zero/comm/comm.hpp"

namespace zero::detail {

using Clock = std::chrono::steady_clock;

// How long the worker and a waiter poll (yielding) before sleeping on a condition variable: a
// hand-off through a sleeping thread costs tens of microseconds, which small collectives notice.
inline constexpr std::chrono::microseconds kSpinBeforeSleep{100};

// Polls `ready` for up to `spin`, yielding the core between looks; returns ready().
template <typename Pred>
bool spin_until(Pred ready, std::chrono::microseconds spin = kSpinBeforeSleep) {
  if (spin.count() == 0) return ready();
  const auto until = Clock::now() + spin;
  do {
    if (ready()) return true;
    std::this_thread::yield();
  } while (Clock::now() < until);
  return ready();
}

// Seconds from now as a deadline, saturating (timeouts of 1e7 s must not overflow).
Clock::time_point deadline_after(double seconds);

class OrderedWorker {
 public:
  struct Task {
    std::function<void()> run;
    std::string what;               // the collective, for messages
    std::atomic<bool> done{false};  // set (release) after error, under the mutex
    std::exception_ptr error;
  };
  // Queue and task state; shared with the thread and with outstanding requests, so neither a
  // detached thread nor a handle that outlives its communicator touches freed memory.
  struct Shared {
    std::mutex mu;
    std::condition_variable work_cv;  // worker: a task was queued or stop was asked
    std::condition_variable done_cv;  // waiters: a task finished
    std::deque<std::shared_ptr<Task>> queue;
    std::atomic<std::size_t> queued{0};  // queue.size(), readable without the mutex
    std::atomic<bool> stopping{false};
    bool running = false;  // the worker is executing a task
    bool exited = false;
    std::chrono::microseconds spin{kSpinBeforeSleep};  // fixed at construction
    // Set by the backend when a collective timed out with the worker possibly stuck inside it
    // (MPI): the tasks queued behind it will not run, so their waits fail at once instead of
    // each waiting out its own deadline. Guarded by mu.
    bool broken = false;
    std::string broken_reason;

    // Marks the worker broken (first reason wins) and wakes every waiter.
    void mark_broken(const std::string& why);
    // Waits until task is done, the worker is broken, or `deadline`; false unless done.
    // Rethrows the task's error.
    bool wait_until(const Task& task, Clock::time_point deadline);
    // True when done; rethrows the task's error.
    bool test(const Task& task);
  };

  // `rank` is set as the thread's log rank. `spin`: how long the worker polls for the next task
  // and a waiter polls for completion before sleeping (0 when the backend itself busy-polls, as
  // MPI does: polling threads would then compete for the cores).
  explicit OrderedWorker(int rank, std::chrono::microseconds spin = kSpinBeforeSleep);
  // stop() with a generous grace period.
  ~OrderedWorker();
  OrderedWorker(const OrderedWorker&) = delete;
  OrderedWorker& operator=(const OrderedWorker&) = delete;

  std::shared_ptr<Task> submit(std::function<void()> fn, std::string what);
  // When nothing is queued or running, runs fn on the calling thread (saving two thread
  // hand-offs) and returns true; exceptions propagate. Otherwise returns false without running
  // it. Only the thread that submits may call this (so nothing can be queued meanwhile).
  template <typename Fn>
  bool try_run_inline(Fn&& fn) {
    {
      std::lock_guard lock(shared_->mu);
      if (!shared_->queue.empty() || shared_->running || shared_->stopping.load()) return false;
    }
    fn();
    return true;
  }
  // Runs fn on the worker after everything queued and waits for it without a deadline; rethrows
  // its exception. For setup steps (split) that are collectives themselves.
  void run_sync(std::function<void()> fn, std::string what);
  const std::shared_ptr<Shared>& shared() const { return shared_; }

  // Lets the queue drain and joins the thread. When `give_up_after` passes first (the thread is
  // stuck in a backend call that will never return) the thread is detached instead; it owns its
  // state, so that is safe, and the process can still exit. Returns true when it was joined.
  bool stop(std::chrono::duration<double> give_up_after);

 private:
  static void loop(std::shared_ptr<Shared> shared, int rank);
  std::shared_ptr<Shared> shared_;
  std::thread thread_;
};

// The CommRequest for a worker task. On timeout it calls on_timeout(task, timeout_s), which must
// return the zero::Error to throw (after aborting whatever the backend aborts). When the worker
// was marked broken before the task completed, wait() throws kRemoteFailure naming the task and
// the reason, without waiting for the deadline.
class WorkerRequest final : public CommRequest {
 public:
  using TimeoutHandler = std::function<Error(const OrderedWorker::Task&, double timeout_s)>;
  WorkerRequest(std::shared_ptr<OrderedWorker::Shared> worker,
                std::shared_ptr<OrderedWorker::Task> task, double timeout_s,
                TimeoutHandler on_timeout)
      : worker_(std::move(worker)),
        task_(std::move(task)),
        timeout_s_(timeout_s),
        on_timeout_(std::move(on_timeout)) {}
  bool test() override { return worker_->test(*task_); }
  void wait() override;

 private:
  std::shared_ptr<OrderedWorker::Shared> worker_;
  std::shared_ptr<OrderedWorker::Task> task_;
  double timeout_s_;
  TimeoutHandler on_timeout_;
};

}  // namespace zero::detail
