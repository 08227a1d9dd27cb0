// comm/event_log.hpp — the bounded record behind Communicator::events().
//
// The front end (communicator.cpp) opens one CollectiveEvent per collective when recording is
// on and hands it to the backend as an EventProbe; the backend stamps started / finished on the
// thread that executes the collective, and finished() records it in the communicator's
// EventLog. EventLog::record() is the one place every completed collective passes through: the
// tracer (zero/core/trace.hpp) hangs off there, not in the backends.
//
// Thread safety: EventLog is safe for concurrent access from multiple threads (one mutex).
// An EventProbe is used by one thread at a time (it travels with its collective's task).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "comm/flight_recorder.hpp"
#include "zero/comm/comm.hpp"
#include "zero/core/trace.hpp"

namespace zero::detail {

class EventLog {
 public:
  // Keeps at most n events, dropping the oldest; 0 drops everything and keeps none.
  void set_capacity(std::size_t n);
  // Where the collectives' regions go as well (null: nowhere). REQUIRES: outlives its use here.
  void set_tracer(Tracer* tracer) { tracer_.store(tracer, std::memory_order_release); }
  Tracer* tracer() const { return tracer_.load(std::memory_order_acquire); }
  // Adds a completed collective: its execution time to busy_ns(), its regions to the tracer,
  // the event to the record when one is kept. Kept in seq order: a backend that observes
  // completions out of issue order (NCCL handles waited in another order) still reads back
  // oldest first.
  void record(const CollectiveEvent& event);
  // The caller's thread was blocked on collective `seq` from begin to end (a wait on its handle,
  // or a blocking collective): wait_ns() and the tracer's comm-wait lane.
  void waited(Collective kind, std::size_t bytes, std::uint64_t seq, std::int64_t tag,
              std::chrono::steady_clock::time_point begin,
              std::chrono::steady_clock::time_point end);
  std::vector<CollectiveEvent> snapshot() const;
  // Nanoseconds of collectives executing / of the caller blocked on them, since the last reset.
  std::uint64_t busy_ns() const { return busy_ns_.load(std::memory_order_relaxed); }
  std::uint64_t wait_ns() const { return wait_ns_.load(std::memory_order_relaxed); }
  // The flight recorder fed from the same path (flight_recorder.hpp).
  FlightRecorder& flight() noexcept { return flight_; }
  // The caller's wait on collective `seq` failed with `why`: the flight recorder marks it, and
  // the first failure writes the records of this rank (stderr, and the file when configured).
  void failed(std::uint64_t seq, const std::string& why);
  void reset_times() {
    busy_ns_.store(0, std::memory_order_relaxed);
    wait_ns_.store(0, std::memory_order_relaxed);
  }

 private:
  std::atomic<Tracer*> tracer_{nullptr};
  std::atomic<std::uint64_t> busy_ns_{0}, wait_ns_{0};
  mutable std::mutex mu_;
  std::size_t capacity_ = 0;
  std::deque<CollectiveEvent> events_;
  FlightRecorder flight_;
};

// One collective's event on its way to the log. Every collective has one (its execution time
// is always counted: two clock reads); empty only for a collective issued before the log.
class EventProbe {
 public:
  EventProbe() = default;
  EventProbe(std::shared_ptr<EventLog> log, const CollectiveEvent& event)
      : log_(std::move(log)), event_(event) {}

  explicit operator bool() const noexcept { return log_ != nullptr; }
  // The backend began executing the collective on this thread.
  void started() {
    if (log_) [[unlikely]] {
      event_.started = std::chrono::steady_clock::now();
      if (log_->flight().on()) log_->flight().started(event_.seq);
    }
  }
  // The collective completed successfully: stamps finished and records the event (once).
  void finished() {
    if (!log_) [[likely]] {
      return;
    }
    event_.finished = std::chrono::steady_clock::now();
    if (event_.started < event_.issued) event_.started = event_.issued;  // started() not called
    log_->record(event_);
    log_.reset();
  }

 private:
  std::shared_ptr<EventLog> log_;
  CollectiveEvent event_;
};

}  // namespace zero::detail
