// The engine over MPI (ctest runs it under mpirun at 2, 3 and 4 processes): every stage trains
// the same trajectory as stage 0 within a stated tolerance (MPI's reduce_scatter and allreduce
// may sum in different orders), and fp16 overflow skips on every rank.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "common/mlp_training.hpp"
#include "common/mpi_world.hpp"
#include "common/temp_dir.hpp"
#include "zero/comm/comm.hpp"
#include "zero/config/comm_config.hpp"

namespace zero {
namespace {

using testing::bitwise_equal;
using testing::max_abs_diff;
using testing::RunResult;
using testing::RunSpec;

Communicator& world() { return testing::mpi_world(); }

TEST(EngineMpi, EveryStageMatchesStageZeroWithinTolerance) {
  Communicator& c = world();
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int ga : {1, 3}) {
      RunSpec base{.stage = 0, .ranks = c.size(), .dtype = dt, .accumulation = ga, .clip = true};
      const RunResult ref = testing::train_rank(c, base);
      for (int stage : {1, 2, 3}) {
        RunSpec s = base;
        s.stage = stage;
        s.overlap = stage == 3;
        const RunResult got = testing::train_rank(c, s);
        // fp32 masters after 20 AdamW steps at lr <= 0.01: reduction order changes the last
        // bits of the averaged gradients; Adam's update moves by at most lr x (relative change),
        // so the masters stay within 2e-5 (16-bit gradients: the reduced values are fp32 too).
        const double d = max_abs_diff(got.master_params, ref.master_params);
        EXPECT_LE(d, 2e-5) << "stage " << stage << " " << to_string(dt) << " accumulation " << ga
                           << " on " << c.size() << " MPI ranks";
        if (c.rank() == 0) {
          std::printf("MPI N=%d %s ga=%d stage %d vs 0: max |master diff| %.3g\n", c.size(),
                      std::string(to_string(dt)).c_str(), ga, stage, d);
        }
        ASSERT_EQ(got.steps.size(), ref.steps.size());
        for (std::size_t i = 0; i < ref.steps.size(); ++i) {
          EXPECT_EQ(got.steps[i].applied, ref.steps[i].applied) << "step " << i;
        }
      }
    }
  }
}

// Offload changes where the state lives, not the arithmetic or the collectives: with the same
// MPI reductions the parameters are bitwise those of the run without offload. Each process's
// swap files carry its pid and rank, and are gone after each run (each process swaps into a
// directory of its own).
TEST(EngineMpi, OffloadTrainsBitwiseTheSameParametersAcrossProcesses) {
  Communicator& c = world();
  const testing::TempDir tmp;
  const std::string dir = tmp.path();
  const std::string mine = "-" + std::to_string(::getpid()) + "-";
  auto leftovers = [&] {
    int n = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      const std::string f = e.path().filename().string();
      if (f.rfind("zero-", 0) == 0 && f.find(mine) != std::string::npos) ++n;
    }
    return n;
  };
  for (int stage : {2, 3}) {
    RunSpec base{.stage = stage,
                 .ranks = c.size(),
                 .dtype = DType::kBF16,
                 .clip = true,
                 .overlap = stage == 3};
    const RunResult ref = testing::train_rank(c, base);
    for (const char* opt : {"cpu", "nvme"}) {
      for (const char* param : {"none", "nvme"}) {
        if (stage < 3 && std::string(param) != "none") continue;
        RunSpec s = base;
        s.offload_buffers = 2;
        s.offload_chunk = 100;
        s.offload_device = opt;
        s.offload_param = param;
        s.nvme_path = dir;
        const RunResult got = testing::train_rank(c, s);
        EXPECT_TRUE(bitwise_equal(got.params, ref.params)) << testing::describe(s);
        EXPECT_TRUE(bitwise_equal(got.masters, ref.masters)) << testing::describe(s);
        EXPECT_EQ(leftovers(), 0) << testing::describe(s);
      }
    }
  }
}

// Merged buckets over MPI: the same elements reduced over the same ranks, but in larger
// messages, for which MPI may pick another algorithm (and so another summation order): equal
// to the per-unit run within the reduction-order tolerance above (bitwise in-process:
// engine_bucket_test).
TEST(EngineMpi, MergedBucketsMatchACollectivePerUnit) {
  Communicator& c = world();
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (int stage : {1, 2, 3}) {
      for (int ga : {1, 3}) {
        RunSpec base{.stage = stage,
                     .ranks = c.size(),
                     .dtype = dt,
                     .accumulation = ga,
                     .clip = true,
                     .steps = 10,
                     .overlap = true};
        const RunResult ref = testing::train_rank(c, base);
        RunSpec s = base;
        s.reduce_bucket = 1'000'000'000;
        s.allgather_bucket = 1'000'000'000;
        const RunResult got = testing::train_rank(c, s);
        const double d = max_abs_diff(got.master_params, ref.master_params);
        EXPECT_LE(d, 2e-5) << testing::describe(s) << " on " << c.size() << " MPI ranks";
        if (c.rank() == 0) {
          std::printf("MPI N=%d %s: buckets vs per unit, max |master diff| %.3g%s\n", c.size(),
                      testing::describe(s).c_str(), d,
                      bitwise_equal(got.masters, ref.masters) ? " (bitwise)" : "");
        }
      }
    }
  }
}

}  // namespace
}  // namespace zero
