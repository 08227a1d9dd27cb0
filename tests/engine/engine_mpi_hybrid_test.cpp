// Hybrid sharding and ZeRO++'s quantized collectives over MPI processes (ctest runs it under
// mpirun at 4 and 6 processes: 4 x 1, 2 x 2, 6 x 1, 3 x 2 and 2 x 3 "nodes" on one machine, the
// groups given by the config key): HSDP trains the trajectory of flat sharding within the
// reduction-order tolerance; qwZ + qgZ on top stays close to it; every process ends with the same
// parameters; hybrid_shard_size "node" reads the launcher's ranks per node (one mpirun on one
// machine: one node, so no replicas).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/mlp_training.hpp"
#include "common/mpi_world.hpp"
#include "zero/comm/comm.hpp"

namespace zero {
namespace {

using testing::max_abs_diff;
using testing::RunResult;
using testing::RunSpec;

Communicator& world() { return testing::mpi_world(); }

// Every process ends with rank 0's parameters (bits gathered over the world).
void expect_same_everywhere(Communicator& c, const RunResult& r, const std::string& what) {
  for (const std::vector<float>& t : r.params) {
    std::vector<float> all(t.size() * static_cast<std::size_t>(c.size()));
    c.all_gather(t.data(), all.data(), t.size(), DType::kF32);
    for (int q = 1; q < c.size(); ++q) {
      EXPECT_EQ(std::memcmp(all.data(), all.data() + q * t.size(), t.size() * 4), 0)
          << "process " << q << " differs: " << what;
    }
  }
}

// Groups of 1 (replicas only: every rank holds everything, all-reduced across all), of 2, and
// of 3 where they divide the world.
std::vector<long> groups_of(int n) {
  std::vector<long> g{1, 2};
  if (n % 3 == 0) g.push_back(3);
  return g;
}

TEST(EngineMpiHybrid, MatchesFlatShardingWithinTolerance) {
  Communicator& c = world();
  for (long group : groups_of(c.size())) {
    for (int stage : {2, 3}) {
      RunSpec flat{.stage = stage, .ranks = c.size(), .accumulation = 2, .clip = true};
      RunSpec hybrid = flat;
      hybrid.hybrid = group;
      const RunResult a = testing::train_rank(c, flat), b = testing::train_rank(c, hybrid);
      const double d = max_abs_diff(b.master_params, a.master_params);
      const std::string what = std::to_string(c.size() / group) + " x " + std::to_string(group) +
                               " stage " + std::to_string(stage);
      EXPECT_LE(d, 2e-5) << what;
      if (c.rank() == 0) std::printf("MPI %s: max |master diff| vs flat %.3g\n", what.c_str(), d);
      expect_same_everywhere(c, b, what);
    }
  }
}

TEST(EngineMpiHybrid, QuantizedCollectivesStayCloseToUnquantized) {
  Communicator& c = world();
  for (long group : {0L, 2L}) {
    RunSpec plain{.stage = 3, .ranks = c.size(), .clip = true, .steps = 12};
    plain.hybrid = group;
    RunSpec quant = plain;
    quant.qwz = quant.qgz = true;
    RunSpec start = plain;
    start.steps = 0;
    const RunResult a = testing::train_rank(c, plain), b = testing::train_rank(c, quant),
                    a0 = testing::train_rank(c, start);
    const double d = testing::rms_diff(b.params, a.params);
    const double moved = testing::rms_diff(a.params, a0.params);
    const std::string what = "qwZ + qgZ, " +
                             (group > 0 ? "hybrid " + std::to_string(group) : std::string("flat")) +
                             " at " + std::to_string(c.size());
    EXPECT_GT(d, 0.0) << what;           // the quantization ran
    EXPECT_LE(d, 0.05 * moved) << what;  // engine_quantized_test's criterion
    EXPECT_LE(std::fabs(b.losses.back() - a.losses.back()), 0.02 * a.losses.back()) << what;
    if (c.rank() == 0) {
      std::printf("MPI %s: rms param diff %.3g (%.1f%% of the rms movement)\n", what.c_str(), d,
                  100 * d / moved);
    }
    expect_same_everywhere(c, b, what);
  }
}

TEST(EngineMpiHybrid, NodeGroupsComeFromTheLauncher) {
  Communicator& c = world();
  const LaunchInfo info = detect_launch();
  ASSERT_GT(info.local_size, 0) << "mpirun sets OMPI_COMM_WORLD_LOCAL_SIZE";
  RunSpec s{.stage = 3, .ranks = c.size()};
  Config cfg = testing::make_config(s);
  cfg.zero_optimization.hybrid_shard_size = ZeroOptimizationConfig::kHybridShardNode;
  Engine e(c, cfg);
  // One mpirun on one machine: every process on one node.
  EXPECT_EQ(info.local_size, c.size());
  EXPECT_EQ(e.replicas(), nullptr);
  EXPECT_EQ(e.comm().size(), c.size());
}

}  // namespace
}  // namespace zero
