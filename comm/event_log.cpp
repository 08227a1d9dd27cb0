#include "comm/event_log.hpp"

#include <algorithm>
#include <iterator>

namespace zero::detail {

void EventLog::set_capacity(std::size_t n) {
  std::lock_guard lock(mu_);
  capacity_ = n;
  while (events_.size() > capacity_) events_.pop_front();
}

namespace {
std::int64_t ns_between(std::chrono::steady_clock::time_point a,
                        std::chrono::steady_clock::time_point b) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count();
}
}  // namespace

void EventLog::record(const CollectiveEvent& event) {
  busy_ns_.fetch_add(static_cast<std::uint64_t>(
                         std::max<std::int64_t>(0, ns_between(event.started, event.finished))),
                     std::memory_order_relaxed);
  if (Tracer* t = tracer()) [[unlikely]] {
    const char* name = to_string(event.kind).data();  // a literal
    const auto bytes = static_cast<std::int64_t>(event.count * dtype_size(event.dtype));
    const auto seq = static_cast<std::int64_t>(event.seq);
    t->record(TraceLane::kComm, name, event.started, event.finished, event.tag, bytes, seq);
    t->record(TraceLane::kCommInFlight, name, event.issued, event.finished, event.tag, bytes, seq);
  }
  if (flight_.on()) flight_.finished(event.seq);
  std::lock_guard lock(mu_);
  if (capacity_ == 0) return;
  // Almost always appended at the back; an out-of-order completion goes to its seq's place.
  auto at = events_.end();
  while (at != events_.begin() && std::prev(at)->seq > event.seq) --at;
  if (at == events_.begin() && events_.size() == capacity_) return;  // older than all kept
  events_.insert(at, event);
  while (events_.size() > capacity_) events_.pop_front();
}

void EventLog::waited(Collective kind, std::size_t bytes, std::uint64_t seq, std::int64_t tag,
                      std::chrono::steady_clock::time_point begin,
                      std::chrono::steady_clock::time_point end) {
  wait_ns_.fetch_add(static_cast<std::uint64_t>(std::max<std::int64_t>(0, ns_between(begin, end))),
                     std::memory_order_relaxed);
  if (Tracer* t = tracer()) [[unlikely]] {
    t->record(TraceLane::kCommWait, to_string(kind).data(), begin, end, tag,
              static_cast<std::int64_t>(bytes), static_cast<std::int64_t>(seq));
  }
}

void EventLog::failed(std::uint64_t seq, const std::string& why) {
  if (!flight_.on() || !flight_.failed(seq, why)) return;
  write_flight_records(flight_.snapshot().world_rank, "failure: " + why);
}

std::vector<CollectiveEvent> EventLog::snapshot() const {
  std::lock_guard lock(mu_);
  return {events_.begin(), events_.end()};
}

}  // namespace zero::detail
