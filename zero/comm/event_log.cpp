#include "zero/comm/event_log.hpp"

#include <algorithm>
#include <iterator>

namespace zero::detail {

void EventLog::set_capacity(std::size_t n) {
  std::lock_guard lock(mu_);
  capacity_ = n;
  while (events_.size() > capacity_) events_.pop_front();
}

void EventLog::record(const CollectiveEvent& event) {
  std::lock_guard lock(mu_);
  if (capacity_ == 0) return;
  // Almost always appended at the back; an out-of-order completion goes to its seq's place.
  auto at = events_.end();
  while (at != events_.begin() && std::prev(at)->seq > event.seq) --at;
  if (at == events_.begin() && events_.size() == capacity_) return;  // older than all kept
  events_.insert(at, event);
  while (events_.size() > capacity_) events_.pop_front();
}

std::vector<CollectiveEvent> EventLog::snapshot() const {
  std::lock_guard lock(mu_);
  return {events_.begin(), events_.end()};
}

}  // namespace zero::detail
