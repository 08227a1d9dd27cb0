// Checkpoints over MPI (ctest runs it under mpirun at 2 and 3 processes): each process writes
// its own shard files into the shared directory, rank 0 commits; save at k, load, train to 2k
// is bitwise the uninterrupted MPI run, every stage, f32 and bf16, with offload; and the files
// the processes wrote load in-process at another world size with the same state.
#include <gtest/gtest.h>

#include <filesystem>
#include <mutex>

#include "ckpt/ckpt_runs.hpp"
#include "common/mpi_world.hpp"
#include "zero/config/comm_config.hpp"

namespace zero {
namespace {

namespace fs = std::filesystem;
using testing::FullState;
using testing::RankRun;
using testing::Resumed;
using testing::RunSpec;

TEST(CkptMpi, ResumedRunIsBitwiseTheUninterruptedOne) {
  Communicator& c = testing::mpi_world();
  const int k = 5;
  struct Case {
    int stage;
    DType dt;
    const char* offload;
    const char* param;
    bool async;
    long hybrid = 0;  // hybrid_shard_size: groups of 1 here (every process a replica)
  };
  std::vector<Case> cases;
  for (int stage : {0, 1, 2, 3}) {
    for (DType dt : {DType::kF32, DType::kBF16})
      cases.push_back({stage, dt, "none", "none", stage % 2 == 1});
  }
  cases.push_back({2, DType::kBF16, "cpu", "none", false});
  cases.push_back({2, DType::kBF16, "nvme", "none", true});
  cases.push_back({3, DType::kBF16, "nvme", "nvme", false});
  // Hybrid sharding: the first group (process 0) writes a checkpoint of a world of 1, every
  // process loads it.
  cases.push_back({2, DType::kF32, "none", "none", false, 1});
  cases.push_back({3, DType::kBF16, "none", "none", true, 1});
  for (const Case& cs : cases) {
    // One directory for all processes, removed after each case.
    const testing::WorldTempDir root(c, "s" + std::to_string(cs.stage));
    const std::string dir = root.path() + "/ckpt";
    const std::string swap = root.path() + "/swap";
    if (c.rank() == 0) fs::create_directories(swap);
    c.barrier();
    RunSpec s{.stage = cs.stage, .ranks = c.size(), .dtype = cs.dt, .clip = true};
    if (std::string(cs.offload) != "none") {
      s.offload_buffers = 2;
      s.offload_chunk = 100;
      s.offload_device = cs.offload;
    }
    s.offload_param = cs.param;
    s.nvme_path = swap;
    s.hybrid = cs.hybrid;
    const std::string what = "stage " + std::to_string(cs.stage) + " " +
                             std::string(to_string(cs.dt)) + " offload " + cs.offload + "/" +
                             cs.param + (cs.async ? " async" : " sync") +
                             (cs.hybrid > 0 ? " hybrid " + std::to_string(cs.hybrid) : "") +
                             " on " + std::to_string(c.size()) + " MPI ranks";
    const RankRun straight = testing::run_straight(c, s, 2 * k);
    const FullState saved = testing::run_and_save(c, s, k, dir, cs.async);
    const Resumed resumed = testing::run_resumed(c, s, 2 * k, dir);
    EXPECT_TRUE(testing::bitwise_equal(resumed.loaded, saved)) << what;
    EXPECT_TRUE(testing::bitwise_equal(resumed.run.params, straight.params)) << what;
    EXPECT_TRUE(testing::bitwise_equal(resumed.run.state, straight.state)) << what;
    // The files the processes wrote, loaded by 4 in-process ranks at stage 3.
    if (c.rank() == 0) {
      std::mutex mu;
      bool same = true;
      ThreadGroup::run(4, [&](Communicator& local) {
        RunSpec s4 = s;
        s4.ranks = 4;
        s4.stage = 3;
        s4.offload_buffers = 0;
        s4.offload_param = "none";
        s4.hybrid = 0;
        Engine e(local, testing::make_config(s4));
        const testing::Mlp mlp(testing::kDims);
        mlp.declare(e);
        ckpt::load(e, dir);
        const bool eq = testing::bitwise_equal(testing::full_state(e), saved);
        std::lock_guard<std::mutex> lock(mu);
        same = same && eq;
      });
      EXPECT_TRUE(same) << what << ": loaded at 4 in-process ranks";
      std::printf("%s: resumed bitwise; loaded at 4 in-process ranks bitwise\n", what.c_str());
    }
  }
}

}  // namespace
}  // namespace zero
