// Hybrid sharding (zero_optimization.hybrid_shard_size, FSDP's HSDP): shards over groups of G
// consecutive ranks, replicated across the N / G groups. Checked against flat sharding over all
// N ranks (the same training, the gradient averaged over groups then across them instead of over
// all at once: equal within the reduction-order tolerance), at N = 4 as 2 groups of 2 and N = 6
// as 2 x 3 and 3 x 2, stages 1-3, with accumulation; each rank's shards and tracked bytes those
// of a world of G; the bytes sent across groups per step against the ring formula; and the
// configurations it refuses, naming the key.
#include <gtest/gtest.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "common/compare.hpp"
#include "common/expect_error.hpp"
#include "common/mlp_training.hpp"
#include "common/scoped_env.hpp"
#include "zero/comm/comm.hpp"
#include "zero/engine/engine.hpp"

namespace zero::testing {
namespace {

TEST(Hybrid, TrainsAsFlatShardingWithinTheReductionOrderTolerance) {
  struct Layout {
    int ranks;
    long group;
  };
  double worst = 0;
  for (const Layout l : {Layout{4, 2}, Layout{6, 3}, Layout{6, 2}}) {
    for (int stage = 1; stage <= 3; ++stage) {
      for (int accumulation : {1, 2}) {
        RunSpec flat;
        flat.stage = stage;
        flat.ranks = l.ranks;
        flat.accumulation = accumulation;
        flat.overlap = accumulation == 2;  // reductions and replica all-reduces in flight
        flat.clip = true;
        flat.steps = 10;
        RunSpec hybrid = flat;
        hybrid.hybrid = l.group;
        const std::vector<RunResult> a = train_all(flat), b = train_all(hybrid);
        const std::string what = "N " + std::to_string(l.ranks) + " G " + std::to_string(l.group) +
                                 " stage " + std::to_string(stage) + " accumulation " +
                                 std::to_string(accumulation) + (flat.overlap ? " overlap" : "");
        for (std::size_t r = 0; r < b.size(); ++r) {
          // Every rank of every group holds the same parameters, bit for bit.
          EXPECT_TRUE(bitwise_equal(b[r].params, b[0].params)) << what << " rank " << r;
          const double d = max_abs_diff(b[r].params, a[r].params);
          worst = std::max(worst, d);
          EXPECT_LE(d, 2e-6) << what << " rank " << r;
        }
        ASSERT_EQ(a[0].steps.size(), b[0].steps.size());
        for (std::size_t k = 0; k < a[0].steps.size(); ++k) {
          EXPECT_NEAR(b[0].steps[k].grad_norm, a[0].steps[k].grad_norm,
                      1e-5 * a[0].steps[k].grad_norm)
              << what << " step " << k;
        }
      }
    }
  }
  std::printf("largest parameter difference hybrid vs flat: %.3g\n", worst);
}

TEST(Hybrid, ShardsBytesAndCrossGroupTrafficAreThoseOfTheGroup) {
  const int n = 6, g = 2, replicas = n / g;
  for (int stage = 1; stage <= 3; ++stage) {
    ThreadGroup::run(n, [&](Communicator& world) {
      RunSpec s;
      s.stage = stage;
      s.ranks = n;
      s.hybrid = g;
      Engine e(world, make_config(s));
      ASSERT_NE(e.replicas(), nullptr);
      EXPECT_EQ(e.comm().size(), g);
      EXPECT_EQ(e.comm().rank(), world.rank() % g);
      EXPECT_EQ(e.replicas()->size(), replicas);
      EXPECT_EQ(e.replicas()->rank(), world.rank() / g);
      Mlp mlp(kDims);
      mlp.declare(e);
      mlp.init(e, 1);
      std::size_t state = 0, padded = 0;
      for (UnitId u = 0; u < e.num_units(); ++u) {
        EXPECT_EQ(e.unit_padded_numel(u) % (g * 32), 0u);
        EXPECT_EQ(e.unit_shard_numel(u), e.unit_padded_numel(u) / g);
        state += e.unit_shard_numel(u) * 8;  // AdamW: m and v, f32
        padded += e.unit_padded_numel(u);
      }
      EXPECT_EQ(e.tracker().current(MemCategory::kOptimizerState), state);
      StepResult r;
      for (int step = 0; step < 2; ++step) {
        mlp.micro_step(e, make_batch(mlp.in(), mlp.out(), kRows, step, 0, world.rank()));
        r = e.step();
      }
      // Across groups: each unit's f32 gradient shard all-reduced among the replicas, ring
      // volume 2 (R - 1) / R of it (CommStats' accounting, per collective).
      std::uint64_t cross = 0;
      for (UnitId u = 0; u < e.num_units(); ++u) {
        const std::uint64_t bytes = e.unit_shard_numel(u) * 4;
        cross += 2 * (replicas - 1) * bytes / replicas;
      }
      EXPECT_EQ(r.metrics.comm_cross_group_bytes_sent, cross) << "stage " << stage;
      EXPECT_GT(r.metrics.comm_bytes_sent, cross);
      (void)padded;
    });
  }
}

// The config of `ranks` in-process ranks at `stage` with hybrid_shard_size "node".
Config node_config(int stage, int ranks) {
  RunSpec s;
  s.stage = stage;
  s.ranks = ranks;
  Config cfg = make_config(s);
  cfg.zero_optimization.hybrid_shard_size = ZeroOptimizationConfig::kHybridShardNode;
  return cfg;
}

TEST(Hybrid, NodeGroupsAreTheLaunchersNodes) {
  // In-process ranks share one node: "node" shards over all of them, like no groups.
  ThreadGroup::run(4, [&](Communicator& world) {
    Engine e(world, node_config(3, 4));
    EXPECT_EQ(e.replicas(), nullptr);
    EXPECT_EQ(e.comm().size(), 4);
  });
  const Config parsed =
      parse_config(R"({"zero_optimization": {"stage": 3, "hybrid_shard_size": "node"}})");
  EXPECT_EQ(parsed.zero_optimization.hybrid_shard_size, ZeroOptimizationConfig::kHybridShardNode);
  EXPECT_NE(parsed.to_json().find(R"("hybrid_shard_size":"node")"), std::string::npos)
      << parsed.to_json();
  expect_error(
      [] { parse_config(R"({"zero_optimization": {"stage": 3, "hybrid_shard_size": "rack"}})"); },
      ErrorCode::kConfig, "must be a number of ranks or \"node\"");
  auto refused = [](const char* needle) {
    ThreadGroup::run(2, [&](Communicator& world) {
      expect_error([&] { Engine e(world, node_config(2, 2)); }, ErrorCode::kConfig, needle);
    });
  };
  // A launcher that does not say how many ranks share a node: refused, naming what is missing.
  const testing::ScopedEnv launcher({{"RANK", "0"}, {"WORLD_SIZE", "2"}});
  refused("does not say how many ranks share a node");
  // An engine on 2 of the launcher's 4 ranks.
  const testing::ScopedEnv node({{"LOCAL_WORLD_SIZE", "1"}, {"WORLD_SIZE", "4"}});
  refused("(a sub-group)");
}

TEST(Hybrid, RefusedWhereItCannotRunNamingTheKey) {
  ThreadGroup::run(4, [&](Communicator& world) {
    RunSpec s;
    s.stage = 2;
    s.ranks = 4;
    s.hybrid = 3;
    expect_error([&] { Engine e(world, make_config(s)); }, ErrorCode::kConfig,
                 "'zero_optimization.hybrid_shard_size' = 3 does not divide the 4 ranks");
  });
  ThreadGroup::run(2, [&](Communicator& world) {
    RunSpec s;
    s.stage = 1;
    s.ranks = 2;
    s.hybrid = 1;
    std::vector<float> p(64), g(64);
    expect_error(
        [&] { Engine::attach(world, make_config(s), p.data(), g.data(), 60, 64, DType::kF32); },
        ErrorCode::kConfig, "hybrid sharding needs the managed engine");
  });
  expect_error([] { parse_config(R"({"zero_optimization": {"hybrid_shard_size": 2}})"); },
               ErrorCode::kConfig, "needs stage 1-3");
}

}  // namespace
}  // namespace zero::testing
