#include "comm/ordered_worker.hpp"

#include <algorithm>
#include <thread>

#include "zero/core/log.hpp"

namespace zero::detail {

Clock::time_point deadline_after(double seconds) {
  // Cap at ~30 years: steady_clock + duration<double> must not overflow its int64 ticks.
  const double capped = std::min(seconds, 1e9);
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(std::max(capped, 0.0)));
}

bool OrderedWorker::Shared::wait_until(const Task& task, Clock::time_point deadline) {
  spin_until([&] { return task.done.load(std::memory_order_acquire); }, spin);
  std::unique_lock lock(mu);
  done_cv.wait_until(lock, deadline, [&] { return task.done.load() || broken; });
  if (!task.done.load()) return false;
  if (task.error) std::rethrow_exception(task.error);
  return true;
}

void OrderedWorker::Shared::mark_broken(const std::string& why) {
  {
    std::lock_guard lock(mu);
    if (!broken) broken_reason = why;
    broken = true;
  }
  done_cv.notify_all();
}

bool OrderedWorker::Shared::test(const Task& task) {
  if (!task.done.load(std::memory_order_acquire)) return false;
  if (task.error) std::rethrow_exception(task.error);  // written before done was released
  return true;
}

OrderedWorker::OrderedWorker(int rank, std::chrono::microseconds spin)
    : shared_(std::make_shared<Shared>()) {
  shared_->spin = spin;
  thread_ = std::thread(&OrderedWorker::loop, shared_, rank);
}

OrderedWorker::~OrderedWorker() { stop(std::chrono::hours(24 * 365)); }

void OrderedWorker::loop(std::shared_ptr<Shared> shared, int rank) {
  set_log_rank(rank);
  std::unique_lock lock(shared->mu);
  for (;;) {
    if (shared->queue.empty() && !shared->stopping.load()) {
      lock.unlock();
      spin_until(
          [&] {
            return shared->queued.load(std::memory_order_acquire) > 0 || shared->stopping.load();
          },
          shared->spin);
      lock.lock();
    }
    shared->work_cv.wait(lock, [&] { return shared->stopping.load() || !shared->queue.empty(); });
    if (shared->queue.empty()) break;  // stopping and drained
    std::shared_ptr<Task> task = std::move(shared->queue.front());
    shared->queue.pop_front();
    shared->queued.store(shared->queue.size(), std::memory_order_relaxed);
    shared->running = true;
    lock.unlock();
    std::exception_ptr error;
    try {
      task->run();
    } catch (...) {
      error = std::current_exception();
    }
    task->run = nullptr;  // drop captured state (buffers, shared pointers) promptly
    lock.lock();
    shared->running = false;
    task->error = error;
    task->done.store(true, std::memory_order_release);
    shared->done_cv.notify_all();
  }
  shared->exited = true;
  shared->done_cv.notify_all();
}

std::shared_ptr<OrderedWorker::Task> OrderedWorker::submit(std::function<void()> fn,
                                                           std::string what) {
  auto task = std::make_shared<Task>();
  task->run = std::move(fn);
  task->what = std::move(what);
  {
    std::lock_guard lock(shared_->mu);
    ZERO_CHECK(!shared_->stopping, kInternal, "collective ", task->what,
               " issued on a communicator that is shutting down");
    shared_->queue.push_back(task);
    shared_->queued.store(shared_->queue.size(), std::memory_order_release);
  }
  shared_->work_cv.notify_one();
  return task;
}

void OrderedWorker::run_sync(std::function<void()> fn, std::string what) {
  auto task = submit(std::move(fn), std::move(what));
  shared_->wait_until(*task, Clock::time_point::max());
}

bool OrderedWorker::stop(std::chrono::duration<double> give_up_after) {
  if (!thread_.joinable()) return true;
  std::unique_lock lock(shared_->mu);
  shared_->stopping = true;
  shared_->work_cv.notify_one();
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::min(
                                           give_up_after, std::chrono::duration<double>(1e9)));
  const bool exited = shared_->done_cv.wait_until(lock, deadline, [&] { return shared_->exited; });
  lock.unlock();
  if (exited) {
    thread_.join();
    return true;
  }
  ZERO_LOG(kWarn, "communicator worker still blocked in a collective after ", give_up_after.count(),
           " s; detaching it");
  thread_.detach();
  return false;
}

void WorkerRequest::wait() {
  if (worker_->wait_until(*task_, deadline_after(timeout_s_))) return;
  std::string broken_reason;
  {
    std::lock_guard lock(worker_->mu);
    if (worker_->broken) broken_reason = worker_->broken_reason;
  }
  if (!broken_reason.empty()) {
    throw Error(ErrorCode::kRemoteFailure,
                detail::cat(task_->what, ": not completed, an earlier collective broke the ",
                            "communicator: ", broken_reason),
                __FILE__, __LINE__);
  }
  throw on_timeout_(*task_, timeout_s_);
}

}  // namespace zero::detail
