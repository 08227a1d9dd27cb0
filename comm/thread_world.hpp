// comm/thread_world.hpp — the state the in-process backend's ranks share (internal): the
// World of one ThreadGroup (its first failure, what each rank was last doing) and each
// communicator Group's reusable barrier and posted arguments. The collectives that use them are
// comm/thread_group.cpp's; the definitions of the out-of-line members thread_world.cpp's.
//
// Thread safety: World's fields under World::mu (activity under activity_mu, `failed` atomic);
// Group's under Group::mu, except `posted` / split scratch, which rank r writes before the
// entry barrier and everyone reads until the exit barrier.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "comm/ordered_worker.hpp"
#include "zero/comm/comm.hpp"
#include "zero/core/error.hpp"

namespace zero::detail {

// "{0,2,3}".
std::string rank_list(const std::vector<int>& ranks);

struct Group;

// What one rank was last doing in collectives, for the launcher's message about a rank that
// does not return (ThreadGroup::run).
struct RankActivity {
  std::string last;  // describe() of its last collective; empty: none issued yet
  std::uint64_t issued = 0;
  std::uint64_t completed = 0;  // issued - completed: in flight (or failed)
};

// Shared by every group of one ThreadGroup: the first failure, and who to wake on it.
struct World {
  explicit World(int size) : activity(static_cast<std::size_t>(size)) {}

  std::mutex mu;
  std::atomic<bool> failed{false};
  ErrorCode code = ErrorCode::kRemoteFailure;
  int failed_rank = -1;  // world rank
  std::string reason;
  Clock::time_point failed_at{};
  std::vector<std::weak_ptr<Group>> groups;

  // By world rank. Its own mutex: every collective of every rank touches it twice.
  std::mutex activity_mu;
  std::vector<RankActivity> activity;
  void issued(int world_rank, const std::string& what) {
    std::lock_guard lock(activity_mu);
    RankActivity& a = activity[static_cast<std::size_t>(world_rank)];
    a.last = what;
    ++a.issued;
  }
  void completed(int world_rank) {
    std::lock_guard lock(activity_mu);
    ++activity[static_cast<std::size_t>(world_rank)].completed;
  }
  // "its last collective, all_reduce(...) on ranks {0,1}, rank 1, completed" and the like.
  std::string doing(int world_rank) {
    std::lock_guard lock(activity_mu);
    const RankActivity& a = activity[static_cast<std::size_t>(world_rank)];
    if (a.issued == 0) return "it has issued no collective";
    if (a.issued == a.completed) {
      return detail::cat("its last collective, ", a.last,
                         ", completed: it is in its own code since");
    }
    return detail::cat(a.issued - a.completed, " collective(s) not completed, the last ", a.last);
  }

  // Records the first failure and wakes every barrier. Later failures are consequences.
  void fail(ErrorCode c, int world_rank, std::string why);
  std::string failure() {
    std::lock_guard lock(mu);
    return reason;
  }
};

// One communicator group: a reusable barrier, the posted arguments, split scratch.
struct Group {
  std::shared_ptr<World> world;
  int n;
  std::vector<int> world_ranks;

  std::mutex mu;
  std::condition_variable cv;
  std::uint64_t generation = 0;
  std::atomic<std::uint64_t> released_generation{0};  // == generation, for polling
  int arrived_count = 0;
  std::vector<char> arrived;  // in the current generation
  std::vector<char> left;     // the rank's communicator was destroyed
  std::vector<char> taken;    // ThreadGroup::communicator() handed this rank out

  // Written by rank r before the entry barrier, read by everyone until the exit barrier.
  std::vector<CollectiveArgs> posted;
  std::vector<std::pair<int, int>> split_keys;  // (color, key)
  std::vector<std::shared_ptr<Group>> split_out;

  Group(std::shared_ptr<World> w, std::vector<int> ranks)
      : world(std::move(w)),
        n(static_cast<int>(ranks.size())),
        world_ranks(std::move(ranks)),
        arrived(n, 0),
        left(n, 0),
        taken(n, 0),
        posted(n),
        split_keys(n),
        split_out(n) {}

  [[noreturn]] void throw_failed(const std::string& what) {
    ZERO_THROW(kRemoteFailure, what, ": ", world->failure());
  }

  void check_failed(const std::string& what) {
    if (world->failed.load(std::memory_order_acquire)) throw_failed(what);
  }

  // Ranks (world numbering) that have not reached the current barrier generation.
  std::vector<int> missing_locked() const {
    std::vector<int> out;
    for (int q = 0; q < n; ++q) {
      if (!arrived[q]) out.push_back(world_ranks[q]);
    }
    return out;
  }
  std::vector<int> missing() {
    std::lock_guard lock(mu);
    return missing_locked();
  }

  int left_before_arriving_locked() const {
    for (int q = 0; q < n; ++q) {
      if (left[q] && !arrived[q]) return q;
    }
    return -1;
  }

  // The reusable barrier every collective step meets at. Throws kRemoteFailure when the world
  // failed or a rank left without arriving, kTimeout when `timeout_s` passes.
  void arrive_and_wait(int r, double timeout_s, const std::string& what);
  // Rank r's wait for `what` ran past timeout_s (at the barrier, or waiting on its handle):
  // records the failure in the world and returns the kTimeout error naming the missing ranks.
  Error timed_out(int r, double timeout_s, const std::string& what,
                  const std::vector<int>& missing_ranks);

  // `unwinding`: the communicator was destroyed by an exception (1 = normal exit, 2 = unwinding).
  void leave(int r, bool unwinding) {
    std::lock_guard lock(mu);
    left[r] = unwinding ? 2 : 1;
    cv.notify_all();
  }
};

std::shared_ptr<Group> make_group(const std::shared_ptr<World>& world, std::vector<int> ranks);

}  // namespace zero::detail

namespace zero {

struct ThreadGroup::State {
  std::shared_ptr<detail::World> world;
  std::shared_ptr<detail::Group> group;
  double timeout_s;
};

}  // namespace zero
