// The shared state of the in-process backend (comm/thread_world.hpp): the barrier's wait
// and its failure paths, the World's first failure waking every group.
#include "comm/thread_world.hpp"

#include <algorithm>

namespace zero::detail {

std::string rank_list(const std::vector<int>& ranks) {
  std::string s = "{";
  for (std::size_t i = 0; i < ranks.size(); ++i) s += detail::cat(i == 0 ? "" : ",", ranks[i]);
  return s + "}";
}

void Group::arrive_and_wait(int r, double timeout_s, const std::string& what) {
  std::unique_lock lock(mu);
  if (world->failed.load(std::memory_order_acquire)) {
    lock.unlock();
    throw_failed(what);
  }
  arrived[r] = 1;
  if (++arrived_count == n) {
    arrived_count = 0;
    std::fill(arrived.begin(), arrived.end(), 0);
    ++generation;
    released_generation.store(generation, std::memory_order_release);
    cv.notify_all();
    return;
  }
  const std::uint64_t my_generation = generation;
  // Poll briefly before sleeping: the others are often microseconds behind.
  lock.unlock();
  detail::spin_until([&] {
    return released_generation.load(std::memory_order_acquire) != my_generation ||
           world->failed.load(std::memory_order_acquire);
  });
  lock.lock();
  const auto deadline = detail::deadline_after(timeout_s);
  const bool released = cv.wait_until(lock, deadline, [&] {
    return generation != my_generation || world->failed.load(std::memory_order_acquire) ||
           left_before_arriving_locked() >= 0;
  });
  if (generation != my_generation) return;
  if (world->failed.load(std::memory_order_acquire)) {
    lock.unlock();
    throw_failed(what);
  }
  if (const int q = left_before_arriving_locked(); released && q >= 0) {
    const std::string why = detail::cat(
        "rank ", world_ranks[q], " left (its communicator was destroyed",
        left[q] == 2 ? " while an exception unwound its stack" : "", ") before joining ", what);
    lock.unlock();
    world->fail(ErrorCode::kRemoteFailure, world_ranks[q], why);
    ZERO_THROW(kRemoteFailure, what, ": ", why);
  }
  const std::vector<int> missing_ranks = missing_locked();
  lock.unlock();
  throw timed_out(r, timeout_s, what, missing_ranks);
}

Error Group::timed_out(int r, double timeout_s, const std::string& what,
                       const std::vector<int>& missing_ranks) {
  const std::string why =
      detail::cat("rank ", world_ranks[r], " timed out after ", timeout_s, " s in ", what,
                  "; ranks not at the collective: ", rank_list(missing_ranks));
  world->fail(ErrorCode::kTimeout, world_ranks[r], why);
  return Error(ErrorCode::kTimeout, why, __FILE__, __LINE__);
}

void World::fail(ErrorCode c, int world_rank, std::string why) {
  std::vector<std::shared_ptr<Group>> to_wake;
  {
    std::lock_guard lock(mu);
    if (failed.load(std::memory_order_relaxed)) return;
    code = c;
    failed_rank = world_rank;
    reason = std::move(why);
    failed_at = Clock::now();
    failed.store(true, std::memory_order_release);
    for (auto& g : groups) {
      if (auto p = g.lock()) to_wake.push_back(std::move(p));
    }
  }
  // Taking each group's mutex before notifying: a waiter has either seen `failed` or is asleep.
  for (auto& g : to_wake) {
    std::lock_guard lock(g->mu);
    g->cv.notify_all();
  }
}

std::shared_ptr<Group> make_group(const std::shared_ptr<World>& world, std::vector<int> ranks) {
  auto g = std::make_shared<Group>(world, std::move(ranks));
  std::lock_guard lock(world->mu);
  std::erase_if(world->groups, [](const std::weak_ptr<Group>& w) { return w.expired(); });
  world->groups.push_back(g);
  return g;
}

}  // namespace zero::detail
