// EngineOptions::check_fit: the engine checks its planned bytes (its own placement and pools)
// plus the trainer's declared bytes against the budget at lay-out, before it allocates.
//  - the tracker's budget: a rank that cannot fit is kOutOfMemory naming the shortfall, with
//    nothing allocated; one that fits trains within it;
//  - the machine's: in a child process inside a 256 MiB memory cgroup, an engine of 3 GiB of
//    planned state is refused at lay-out naming the cgroup (without the check the child's first
//    allocation would be killed by the kernel); skipped where no cgroup can be made.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "common/expect_error.hpp"
#include "common/memory_cgroup.hpp"
#include "zero/comm/comm.hpp"
#include "zero/config/config.hpp"
#include "zero/engine/engine.hpp"

namespace zero {
namespace {

Config stage(int s) {
  return parse_config(R"({"zero_optimization": {"stage": )" + std::to_string(s) + "}}");
}

TEST(EngineFit, TheTrackersBudgetRefusesBeforeAnyAllocation) {
  ThreadGroup::run(2, [](Communicator& comm) {
    // 1M f32 parameters at stage 0: 4 MB of parameters, 4 of gradients, 8 of AdamW moments.
    MemoryTracker tracker(comm.rank());
    tracker.set_memory_budget(std::size_t{8} << 20);
    EngineOptions o;
    o.tracker = &tracker;
    o.check_fit = true;
    o.trainer_bytes = std::size_t{1} << 20;
    Engine e(comm, stage(0), o);
    e.add_unit({"w", {{"w", {1024, 1024}}}});
    testing::expect_error([&] { e.gather(0); }, ErrorCode::kOutOfMemory, "cannot fit: it needs ");
    testing::expect_error([&] { e.gather(0); }, ErrorCode::kOutOfMemory,
                          "of its memory budget 8.00 MiB: short by ");
    EXPECT_EQ(tracker.current_memory(), 0u) << "allocated before refusing";
  });
  ThreadGroup::run(2, [](Communicator& comm) {
    // Stage 2 at N = 2 within 16 MiB: fits, and trains within it.
    MemoryTracker tracker(comm.rank());
    tracker.set_memory_budget(std::size_t{16} << 20);
    EngineOptions o;
    o.tracker = &tracker;
    o.check_fit = true;
    Engine e(comm, stage(2), o);
    e.add_unit({"w", {{"w", {1024, 1024}}}});
    std::vector<float> v(1024 * 1024, 0.5f);
    e.set_param(0, 0, v.data(), v.size());
    {
      GatherGuard g = e.gather(0);
      auto* grad = static_cast<float*>(e.grad(0, 0).data);
      for (std::size_t i = 0; i < v.size(); ++i) grad[i] = 1e-3f;
      e.grads_ready(0);
    }
    EXPECT_TRUE(e.step().applied);
    EXPECT_LE(tracker.peak_memory(), tracker.memory_budget());
  });
}

// Without the check, the budget stops the first allocation past it, in the middle of lay-out:
// the engine is left as before lay-out, so the next call fails the same way (not a crash on a
// room that was never made).
TEST(EngineFit, WithoutTheCheckALayOutThatFailsFailsTheSameWayAgain) {
  ThreadGroup::run(2, [](Communicator& comm) {
    MemoryTracker tracker(comm.rank());
    tracker.set_memory_budget(std::size_t{8} << 20);
    EngineOptions o;
    o.tracker = &tracker;
    Engine e(comm, stage(0), o);
    e.add_unit({"w", {{"w", {1024, 1024}}}});
    for (int attempt = 0; attempt < 2; ++attempt) {
      testing::expect_error([&] { e.gather(0); }, ErrorCode::kOutOfMemory,
                            "memory budget exceeded");
    }
    EXPECT_EQ(tracker.current_memory(), 0u) << "a failed lay-out kept memory";
  });
}

// The child: an engine of ~3 GiB of planned state with check_fit and no tracker budget; its
// lay-out must throw naming the memory cgroup it runs in. Runs only as the child below.
TEST(EngineFit, ChildRefusedByTheMachinesBudget) {
  if (std::getenv("ZERO_FIT_CHILD") == nullptr) GTEST_SKIP() << "runs as the cgroup test's child";
  ThreadGroup::run(1, [](Communicator& comm) {
    EngineOptions o;
    o.check_fit = true;
    Engine e(comm, stage(0), o);
    e.add_unit({"w", {{"w", {200, 1024, 1024}}}});  // 200M f32: 3.2 GB at stage 0 with AdamW
    testing::expect_error([&] { e.gather(0); }, ErrorCode::kOutOfMemory,
                          "cannot fit: host memory: needs ");
    testing::expect_error([&] { e.gather(0); }, ErrorCode::kOutOfMemory, "memory cgroup ");
  });
}

TEST(EngineFit, TheMachinesBudgetInsideAMemoryCgroupRefusesAtLayOut) {
  const testing::MemoryCgroup cg(std::size_t{256} << 20);
  if (!cg.usable()) GTEST_SKIP() << "no memory cgroup to run in: " << cg.why();
  const testing::CmdResult r =
      cg.run("env ZERO_FIT_CHILD=1 /proc/" + std::to_string(::getpid()) +
             "/exe --gtest_filter=EngineFit.ChildRefusedByTheMachinesBudget");
  EXPECT_EQ(r.status, 0) << "(-1: killed by the kernel)\n" << r.out;
  EXPECT_NE(r.out.find("[  PASSED  ] 1 test"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace zero
