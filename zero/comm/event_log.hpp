// zero/comm/event_log.hpp — the bounded record behind Communicator::events().
//
// The front end (communicator.cpp) opens one CollectiveEvent per collective when recording is
// on and hands it to the backend as an EventProbe; the backend stamps started / finished on the
// thread that executes the collective, and finished() records it in the communicator's
// EventLog. EventLog::record() is the one place every completed collective passes through: a
// tracer (issue 17) hangs off there, not in the backends.
//
// Thread safety: EventLog is safe for concurrent access from multiple threads (one mutex).
// An EventProbe is used by one thread at a time (it travels with its collective's task).
#pragma once

#include <chrono>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "zero/comm.hpp"

namespace zero::detail {

class EventLog {
 public:
  // Keeps at most n events, dropping the oldest; 0 drops everything and records nothing.
  void set_capacity(std::size_t n);
  // Adds a completed collective. Kept in seq order: a backend that observes completions out of
  // issue order (NCCL handles waited in another order) still reads back oldest first.
  void record(const CollectiveEvent& event);
  std::vector<CollectiveEvent> snapshot() const;

 private:
  mutable std::mutex mu_;
  std::size_t capacity_ = 0;
  std::deque<CollectiveEvent> events_;
};

// One collective's event on its way to the log. Empty (no log) when recording is off: then
// started() and finished() are one branch each.
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
