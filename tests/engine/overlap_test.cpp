// Overlap that can be seen: with overlap_comm the gradient reducer leaves reduce-scatters
// running while the trainer computes the next units' backward, several at a time. Seen from the
// communicator's own execution timestamps (Communicator::events: when the backend actually ran
// each collective), not from when the engine issued or waited for it.
//
// The trainer's "backward" of a unit is a sleep (it must not take the cores the rank's
// communication worker runs on). Rank 1 reaches each grads_ready a fixed time after rank 0, so
// on rank 0 a reduce-scatter cannot start before that point: if it ran at issue or at the next
// wait, its timestamps would fall outside rank 0's compute window.
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "zero/comm/comm.hpp"
#include "zero/config/config.hpp"
#include "zero/engine/engine.hpp"

namespace zero {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr int kUnits = 4;
constexpr std::int64_t kElems = 64 * 1024;

Config config(bool overlap) {
  return parse_config(R"({"zero_optimization": {"stage": 2, "overlap_comm": )" +
                      std::string(overlap ? "true" : "false") + "}}");
}

void declare(Engine& e) {
  for (int u = 0; u < kUnits; ++u) e.add_unit({"u" + std::to_string(u), {{"w", {kElems}}}});
}

// Rank 0's reduce-scatters of the backward, in issue order (units kUnits-1 .. 0).
std::vector<CollectiveEvent> reduce_scatters(const Communicator& comm) {
  std::vector<CollectiveEvent> out;
  for (const CollectiveEvent& ev : comm.events()) {
    if (ev.kind == Collective::kReduceScatter) out.push_back(ev);
  }
  return out;
}

struct Window {
  Clock::time_point begin, end;
};

// One micro-step whose backward computes each unit for `compute`, rank 1 starting `skew` later
// (so it reaches every grads_ready `skew` after rank 0); rank 0's compute windows by unit and its
// reduce-scatter events.
void backward_with_compute(bool overlap, milliseconds compute, milliseconds skew,
                           std::vector<Window>& windows, std::vector<CollectiveEvent>& events) {
  std::mutex mu;
  ThreadGroup::run(2, [&](Communicator& comm) {
    Engine e(comm, config(overlap));
    declare(e);
    comm.set_event_capacity(64);
    std::vector<Window> mine(kUnits);
    if (comm.rank() == 1) std::this_thread::sleep_for(skew);
    for (int u = kUnits - 1; u >= 0; --u) {
      mine[static_cast<std::size_t>(u)].begin = Clock::now();
      static_cast<float*>(e.grad(u, 0).data)[0] = 1.0f;
      std::this_thread::sleep_for(compute);
      mine[static_cast<std::size_t>(u)].end = Clock::now();
      e.grads_ready(u);
    }
    e.step();
    if (comm.rank() == 0) {
      std::lock_guard<std::mutex> lock(mu);
      windows = mine;
      events = reduce_scatters(comm);
    }
  });
}

TEST(EngineOverlap, AUnitsReduceScatterRunsWhileTheTrainerComputesTheBackwardOfTheUnitBefore) {
  const milliseconds compute(80), skew(25);
  std::vector<Window> windows;
  std::vector<CollectiveEvent> rs;
  backward_with_compute(/*overlap=*/true, compute, skew, windows, rs);
  ASSERT_EQ(rs.size(), static_cast<std::size_t>(kUnits));
  // rs[k] is unit kUnits-1-k's; the trainer computes unit kUnits-2-k next. A collective's
  // `started` is when this rank's worker took it up (it then meets the other ranks), so what
  // shows where it ran is `finished`: after rank 1 joined, skew into the next unit's backward,
  // and before that backward ended.
  for (int k = 0; k + 1 < kUnits; ++k) {
    const Window& next = windows[static_cast<std::size_t>(kUnits - 2 - k)];
    const CollectiveEvent& ev = rs[static_cast<std::size_t>(k)];
    EXPECT_GE(ev.finished, next.begin + skew / 2)
        << "unit " << kUnits - 1 - k
        << ": its reduce-scatter ended before the next unit's backward";
    EXPECT_LE(ev.finished, next.end)
        << "unit " << kUnits - 1 - k << ": its reduce-scatter ended after the next unit's backward";
  }
  // Without overlap_comm each reduce-scatter completes inside grads_ready, before the next
  // unit's backward begins: the same check fails.
  backward_with_compute(/*overlap=*/false, compute, skew, windows, rs);
  ASSERT_EQ(rs.size(), static_cast<std::size_t>(kUnits));
  for (int k = 0; k + 1 < kUnits; ++k) {
    EXPECT_LT(rs[static_cast<std::size_t>(k)].finished,
              windows[static_cast<std::size_t>(kUnits - 2 - k)].begin)
        << "unit " << kUnits - 1 - k;
  }
}

TEST(EngineOverlap, TwoReduceScattersStayInFlightAndTheThirdWaitsForTheFirst) {
  const milliseconds late(150);
  std::vector<CollectiveEvent> rs;
  Clock::time_point after_two{}, after_three{};
  std::mutex mu;
  ThreadGroup::run(2, [&](Communicator& comm) {
    Engine e(comm, config(/*overlap=*/true));
    declare(e);
    comm.set_event_capacity(64);
    if (comm.rank() == 1) std::this_thread::sleep_for(late);  // the peer joins late
    e.grads_ready(3);
    e.grads_ready(2);
    const Clock::time_point two = Clock::now();
    e.grads_ready(1);  // beyond the limit: waits for unit 3's reduce-scatter
    const Clock::time_point three = Clock::now();
    e.grads_ready(0);
    e.step();
    if (comm.rank() == 0) {
      std::lock_guard<std::mutex> lock(mu);
      after_two = two;
      after_three = three;
      rs = reduce_scatters(comm);
    }
  });
  ASSERT_EQ(rs.size(), static_cast<std::size_t>(kUnits));
  // Both were issued and neither had completed when the second grads_ready returned (they
  // could not: the peer had not joined). With one in flight, the second would have waited.
  EXPECT_GT(rs[0].finished, after_two + late / 2) << "unit 3's reduce-scatter";
  EXPECT_GT(rs[1].finished, after_two + late / 2) << "unit 2's reduce-scatter";
  // The third grads_ready returned only after the first reduce-scatter had completed.
  EXPECT_GE(after_three, rs[0].finished);
}

}  // namespace
}  // namespace zero
