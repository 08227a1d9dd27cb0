// The configuration chooser: every candidate's bytes are the planner's for its config; under a
// budget that excludes configurations the chosen one fits and is the fastest that does, and each
// excluded one is named with its shortfall; the written document loads as the same config.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/expect_error.hpp"
#include "common/temp_dir.hpp"
#include "zero/device/memory_report.hpp"
#include "zero/plan/choose.hpp"

namespace zero {
namespace {

constexpr std::size_t kActivations = 1 << 20;

// Six units of a 256 x 256 weight and a bias; 1 MiB of activations; 1 GFLOP a micro-step.
TrainerModel model() {
  std::vector<UnitSpec> units;
  for (int u = 0; u < 6; ++u) {
    units.push_back(
        {.name = "layer" + std::to_string(u),
         .params = {{.name = "w", .shape = {256, 256}}, {.name = "b", .shape = {256}}}});
  }
  TrainerModel t;
  t.plan_input = [units](const Config& c) {
    PlanInput pin;
    pin.units = units;
    pin.config = c;
    return pin;
  };
  t.trainer_bytes = [](const Config&) { return kActivations; };
  t.flops = [](const Config&) { return 1e9; };
  return t;
}

MachineProfile profile(bool nvme) {
  MachineProfile p;
  p.source = "test";
  p.copy_bytes_per_s = 10e9;
  p.optimizer_f32_per_s = 8e8;
  p.optimizer_bf16_per_s = 6e8;
  p.optimizer_int8_per_s = 5e8;
  if (nvme) {
    p.nvme_request_bytes = 1 << 20;
    p.nvme_read_bytes_per_s = p.nvme_write_bytes_per_s = 1e9;
  }
  for (const char* op : {"all_reduce", "reduce_scatter", "all_gather"}) {
    p.collectives.push_back({op, 2, 1 << 16, 2e-5});
    p.collectives.push_back({op, 2, 1 << 24, 5e-3});
  }
  p.trainer_flops_per_s = 1e10;
  return p;
}

// The per-node host bytes of `sets` applied to {} for 2 ranks, through the planner directly.
std::size_t host_need(const std::vector<std::string>& sets) {
  ConfigBuilder b;
  for (const std::string& s : sets) b.set(s);
  PlanInput pin = model().plan_input(b.build());
  pin.ranks = 2;
  return fit_need(plan_engine_memory(pin), 2, kActivations, true).host;
}

const Candidate* find(const Choice& ch, const std::string& label) {
  for (const Candidate& c : ch.candidates) {
    if (c.label == label) return &c;
  }
  return nullptr;
}

TEST(Choose, BytesAreThePlannersForEveryCandidate) {
  const testing::TempDir tmp;
  World w;
  w.ranks = 2;
  w.nvme_path = tmp.path();
  const Choice ch = choose_config(model(), "{}", w, profile(true));
  ASSERT_GT(ch.candidates.size(), 100u);
  for (const Candidate& c : ch.candidates) {
    PlanInput pin = model().plan_input(c.config);
    pin.ranks = 2;
    const PlanResult p = plan_engine_memory(pin);
    EXPECT_EQ(p.bytes, c.plan.bytes) << c.label;
    EXPECT_EQ(p.pinned, c.plan.pinned) << c.label;
    EXPECT_EQ(p.nvme, c.plan.nvme) << c.label;
    EXPECT_TRUE(c.fits()) << c.label;  // no budget: everything fits
    EXPECT_TRUE(c.untimed.empty()) << c.label << ": " << c.untimed;
  }
  // The reader refused what cannot run (offload at stage 0, parameters on NVMe with the
  // optimizer not): not candidates.
  EXPECT_GT(ch.rejected, 0u);
  for (const Candidate& c : ch.candidates) {
    EXPECT_FALSE(c.config.zero_optimization.stage == 0 &&
                 c.config.zero_optimization.offload_optimizer.enabled())
        << c.label;
  }
}

TEST(Choose, ABudgetExcludesTheLowerStagesAndNamesTheirShortfall) {
  const std::vector<std::string> stage2 = {"zero_optimization.stage=2"};
  const std::vector<std::string> stage0 = {"zero_optimization.stage=0"};
  const std::vector<std::string> stage1 = {"zero_optimization.stage=1"};
  const std::size_t need2 = host_need(stage2), need1 = host_need(stage1), need0 = host_need(stage0);
  ASSERT_LT(need2, need1);
  ASSERT_LT(need1, need0);
  World w;
  w.ranks = 2;
  const double margin = 0.1;
  // The budget less the margin is stage 2's need exactly (stage 1 and 0 need more).
  w.host_bytes = static_cast<std::size_t>(static_cast<double>(need2) / (1 - margin)) + 1;
  ChooseSpace s;
  s.optimizer_offload = {"none"};
  s.moment_dtypes = {"f32"};
  s.buckets = {0};
  s.stages = {0, 1, 2};
  const Choice ch = choose_config(model(), "{}", w, profile(false), s, margin);
  ASSERT_EQ(ch.candidates.size(), 3u);
  ASSERT_EQ(ch.chosen, 0);
  const Candidate& chosen = ch.candidates[0];
  EXPECT_TRUE(chosen.fits());
  EXPECT_EQ(chosen.config.zero_optimization.stage, 2);
  EXPECT_LE(chosen.need.host, ch.budget.host);
  EXPECT_EQ(chosen.need.host, need2);
  for (int stage : {0, 1}) {
    const Candidate* c =
        find(ch, "stage " + std::to_string(stage) + ", optimizer none, f32 moments, bucket/unit");
    ASSERT_NE(c, nullptr);
    EXPECT_FALSE(c->fits());
    const std::size_t need = stage == 0 ? need0 : need1;
    EXPECT_EQ(c->worst_short, need - ch.budget.host);
    const std::size_t i = static_cast<std::size_t>(c - ch.candidates.data());
    const std::string why = ch.why_lost(i);
    EXPECT_NE(why.find("does not fit by " + format_bytes(need - ch.budget.host) + " of " +
                       format_bytes(ch.budget.host)),
              std::string::npos)
        << why;
    EXPECT_NE(why.find("host memory"), std::string::npos) << why;
  }
  // The least short comes first among those that do not fit.
  EXPECT_EQ(ch.candidates[1].config.zero_optimization.stage, 1);
}

TEST(Choose, TheChoiceIsTheFastestThatFitsAndTheOthersSaySo) {
  World w;
  w.ranks = 2;
  w.host_bytes = host_need({"zero_optimization.stage=3"}) * 11 / 10;  // excludes some
  const Choice ch = choose_config(model(), "{}", w, profile(false));
  ASSERT_GE(ch.chosen, 0);
  const Candidate& best = ch.candidates[static_cast<std::size_t>(ch.chosen)];
  std::size_t fit = 0, short_ = 0;
  for (std::size_t i = 0; i < ch.candidates.size(); ++i) {
    const Candidate& c = ch.candidates[i];
    if (c.fits()) {
      ++fit;
      EXPECT_LE(best.time.total(), c.time.total()) << c.label;
      if (static_cast<int>(i) != ch.chosen) {
        const std::string why = ch.why_lost(i);
        if (c.time.total() == best.time.total()) {  // a tie: it leaves less room
          EXPECT_GE(c.fullest, best.fullest) << c.label;
          EXPECT_EQ(why.rfind("fits, as fast by the profile, with less room", 0), 0u) << why;
        } else {
          EXPECT_EQ(why.rfind("fits, slower by", 0), 0u) << why;
        }
      }
      // Fastest first; among equal times, the most room first.
      if (i > 0 && ch.candidates[i - 1].fits()) {
        const Candidate& prev = ch.candidates[i - 1];
        EXPECT_LE(prev.time.total(), c.time.total()) << c.label;
        if (prev.time.total() == c.time.total()) {
          EXPECT_LE(prev.fullest, c.fullest) << c.label;
        }
      }
    } else {
      ++short_;
      EXPECT_EQ(ch.why_lost(i).rfind("does not fit by", 0), 0u) << ch.why_lost(i);
    }
  }
  EXPECT_GT(fit, 0u);
  EXPECT_GT(short_, 0u);
}

TEST(Choose, ASeparateDeviceIsBudgetedPerRankAndItsHostTierPerNode) {
  ChooseSpace s;
  s.stages = {0, 3};
  s.optimizer_offload = {"none", "cpu"};
  s.cpu_ratios = {1.0};
  s.param_offload = {"none"};
  s.moment_dtypes = {"f32"};
  s.buckets = {0};
  s.prefetch = {0};
  s.persistence = {0};
  s.hybrid = {"none"};
  s.quantized = {"none"};
  World w;
  w.ranks = 4;
  w.ranks_per_node = 2;
  w.device_is_host = false;
  // Stage 3 without offload fits the device; stage 0 does not; offloaded, the node's pinned
  // bytes (2 ranks) must fit the host.
  ConfigBuilder b3;
  b3.set("zero_optimization.stage=3");
  b3.set("zero_optimization.stage3_prefetch_bucket_size=0");
  b3.set("zero_optimization.stage3_param_persistence_threshold=0");
  PlanInput pin = model().plan_input(b3.build());
  pin.ranks = 4;
  const PlanResult p3 = plan_engine_memory(pin);
  w.device_bytes = p3.total() + kActivations;  // no margin below
  const Choice ch = choose_config(model(), "{}", w, profile(false), s, 0.0);
  ASSERT_EQ(ch.candidates.size(), 3u);  // stage 0 with offload: refused by the reader
  ASSERT_GE(ch.chosen, 0);
  for (const Candidate& c : ch.candidates) {
    EXPECT_EQ(c.need.device % 2, 0u);  // the node's two ranks
    EXPECT_EQ(c.fits(), c.need.device / 2 <= w.device_bytes) << c.label;
    if (!c.fits()) {
      EXPECT_NE(c.shortfall.find("device memory"), std::string::npos) << c.shortfall;
      EXPECT_EQ(c.worst_short, c.need.device / 2 - w.device_bytes) << c.label;
    }
  }
  const Candidate* off = find(ch,
                              "stage 3, optimizer cpu, params none, f32 moments, "
                              "bucket/unit, prefetch 0, persist 0");
  ASSERT_NE(off, nullptr);
  std::size_t pinned = 0;
  for (std::size_t b : off->plan.pinned) pinned += b;
  EXPECT_GT(pinned, 0u);
  EXPECT_EQ(off->need.host, 2 * pinned);  // per node: its two ranks' pinned state
  EXPECT_FALSE(find(ch, "stage 0, optimizer none, f32 moments, bucket/unit")->fits());
  EXPECT_TRUE(find(ch,
                   "stage 3, optimizer none, params none, f32 moments, bucket/unit, "
                   "prefetch 0, persist 0")
                  ->fits());
}

TEST(Choose, WithoutNvmeFiguresNvmeCandidatesAreUntimedNotChosen) {
  const testing::TempDir tmp;
  World w;
  w.ranks = 2;
  w.nvme_path = tmp.path();
  ChooseSpace s;
  s.stages = {3};
  s.optimizer_offload = {"nvme"};
  s.param_offload = {"nvme"};
  s.moment_dtypes = {"f32"};
  s.buckets = {0};
  s.prefetch = {0};
  s.persistence = {0};
  const Choice ch = choose_config(model(), "{}", w, profile(false), s);
  ASSERT_EQ(ch.candidates.size(), 1u);
  EXPECT_NE(ch.candidates[0].untimed.find("NVMe"), std::string::npos) << ch.candidates[0].untimed;
  EXPECT_GT(ch.candidates[0].plan.nvme[static_cast<std::size_t>(MemCategory::kOptimizerState)], 0u);
}

TEST(Choose, MaxLiveIsEnumeratedWithAPrefetchAndBoundsTheGatheredUnits) {
  World w;
  w.ranks = 2;
  ChooseSpace s;
  s.stages = {3};
  s.optimizer_offload = {"none"};
  s.param_offload = {"none"};
  s.moment_dtypes = {"f32"};
  s.buckets = {0};
  s.persistence = {0};
  const Choice ch = choose_config(model(), "{}", w, profile(false), s);
  // prefetch 0 (max-live bounds nothing), prefetch 5e7 at the default and at twice a unit
  ASSERT_EQ(ch.candidates.size(), 3u);
  const std::string head = "stage 3, optimizer none, params none, f32 moments, bucket/unit, ";
  const Candidate* bounded = find(ch, head + "prefetch 50000000, max-live 131584, persist 0");
  const Candidate* open = find(ch, head + "prefetch 50000000, persist 0");
  const Candidate* none = find(ch, head + "prefetch 0, persist 0");
  ASSERT_TRUE(bounded != nullptr && open != nullptr && none != nullptr);
  EXPECT_EQ(bounded->config.zero_optimization.stage3_max_live_parameters, 2 * (256 * 256 + 256));
  EXPECT_EQ(open->config.zero_optimization.stage3_max_live_parameters, 1'000'000'000);
  // Six units prefetched without a bound, two live with it, one without a prefetch.
  EXPECT_LT(bounded->plan.gathered_param_bytes, open->plan.gathered_param_bytes);
  EXPECT_GT(bounded->plan.gathered_param_bytes, none->plan.gathered_param_bytes);
}

// 4 ranks on 2 nodes of 2 with a separate device: hybrid sharding at stages 1-3 and quantized
// collectives at stage 3 are candidates (on one node neither is); bytes are the planner's; with a
// network 10x slower than the node, hybrid's predicted communication is below the flat sharding's
// (its gathers stay in the node), with the node's figures alone above it (the replicas'
// all-reduce added); qwZ's gathers cost less than 16-bit ones.
TEST(Choose, AcrossNodesHybridShardingAndQuantizedCollectivesAreCandidates) {
  ChooseSpace s;
  s.optimizer_offload = {"none"};
  s.param_offload = {"none"};
  s.moment_dtypes = {"f32"};
  s.buckets = {0};
  s.prefetch = {0};
  s.persistence = {0};
  World w;
  w.ranks = 4;
  w.ranks_per_node = 2;
  w.device_is_host = false;
  const std::string base = R"({"bf16": {"enabled": true}})";
  MachineProfile net = profile(false);
  net.trainer_flops_per_s = 1e15;  // compute hides little communication (overlap_comm at stage 3)
  for (const CollectivePoint& c : net.collectives) {
    net.network_collectives.push_back({c.op, c.ranks, c.bytes, 10 * c.seconds});
  }
  const Choice ch = choose_config(model(), base, w, net, s);
  // stage 0: 1; stages 1-2: 2 each (hybrid); stage 3: 2 x 4 (hybrid x quantized)
  ASSERT_EQ(ch.candidates.size(), 1u + 2 + 2 + 8);
  for (const Candidate& c : ch.candidates) {
    PlanInput pin = model().plan_input(c.config);
    pin.ranks = 4;
    EXPECT_EQ(plan_engine_memory(pin).bytes, c.plan.bytes) << c.label;
  }
  const std::string s3 =
      "stage 3, optimizer none, params none, f32 moments, bucket/unit, prefetch 0, "
      "persist 0";
  const Candidate* flat = find(ch, s3);
  const Candidate* hyb = find(ch, s3 + ", hybrid 2");
  const Candidate* qw = find(ch, s3 + ", qwZ");
  const Candidate* qg = find(ch, s3 + ", hybrid 2, qwZ, qgZ");
  ASSERT_TRUE(flat != nullptr && hyb != nullptr && qw != nullptr && qg != nullptr);
  EXPECT_EQ(hyb->config.zero_optimization.hybrid_shard_size, 2);
  EXPECT_TRUE(qw->config.zero_optimization.zero_quantized_weights);
  EXPECT_TRUE(qg->config.zero_optimization.zero_quantized_gradients);
  EXPECT_LT(hyb->time.comm, flat->time.comm);
  EXPECT_LT(qw->time.comm, flat->time.comm);
  EXPECT_LT(qg->time.comm, hyb->time.comm);
  // Stage 3 shards over 2 ranks with hybrid: more parameter bytes per rank than over 4.
  EXPECT_GT(hyb->plan.at(MemCategory::kParams16), flat->plan.at(MemCategory::kParams16));

  MachineProfile node = profile(false);
  node.trainer_flops_per_s = 1e15;
  const Choice same = choose_config(model(), base, w, node, s);
  EXPECT_GT(find(same, s3 + ", hybrid 2")->time.comm, find(same, s3)->time.comm);

  World one = w;
  one.ranks_per_node = 4;
  EXPECT_EQ(choose_config(model(), base, one, net, s).candidates.size(), 4u);
  s.hybrid = {"rack"};
  testing::expect_error([&] { (void)choose_config(model(), base, w, net, s); },
                        ErrorCode::kInvalidArgument, "rack");
}

// On a separate device a profile's CUDA figures time the plan: NCCL's points its collectives,
// the host<->device rates its offloaded gradients and parameters; the CPU device ignores them.
TEST(Choose, OnACudaDeviceTheProfilesCudaFiguresTimeThePlan) {
  ChooseSpace s;
  s.stages = {2};
  s.optimizer_offload = {"none", "cpu"};
  s.cpu_ratios = {1.0};
  s.moment_dtypes = {"f32"};
  s.buckets = {0};
  World w;
  w.ranks = 2;
  w.device_is_host = false;
  MachineProfile plain = profile(false), gpu = profile(false);
  gpu.cuda.device = "by hand";
  gpu.cuda.devices = 2;
  gpu.cuda.hbm_copy_bytes_per_s = 1e12;
  gpu.cuda.host_to_device_bytes_per_s = 1e9;  // 10x slower than the host copy
  gpu.cuda.device_to_host_bytes_per_s = 1e9;
  for (const CollectivePoint& c : plain.collectives) {
    gpu.cuda.nccl.push_back({c.op, c.ranks, c.bytes, c.seconds / 4});
  }
  const std::string none = "stage 2, optimizer none, f32 moments, bucket/unit";
  const std::string cpu = "stage 2, optimizer cpu, f32 moments, bucket/unit";
  const Choice a = choose_config(model(), "{}", w, plain, s);
  const Choice b = choose_config(model(), "{}", w, gpu, s);
  ASSERT_EQ(a.candidates.size(), 2u);
  ASSERT_EQ(b.candidates.size(), 2u);
  EXPECT_GT(find(a, none)->time.comm, 0);
  EXPECT_NEAR(find(b, none)->time.comm, find(a, none)->time.comm / 4, 1e-12);
  EXPECT_EQ(find(a, none)->time.offload_io, 0);
  EXPECT_GT(find(a, cpu)->time.offload_io, 0);
  // The same bytes cross at 1 GB/s in place of the host's 10 GB/s copy.
  EXPECT_NEAR(find(b, cpu)->time.offload_io, 10 * find(a, cpu)->time.offload_io,
              1e-9 * find(b, cpu)->time.offload_io);
  World host;
  host.ranks = 2;
  const Choice c = choose_config(model(), "{}", host, gpu, s);
  const Choice d = choose_config(model(), "{}", host, plain, s);
  EXPECT_EQ(find(c, cpu)->time.total(), find(d, cpu)->time.total());
}

TEST(Choose, TheWrittenDocumentLoadsAsTheCandidatesConfig) {
  World w;
  w.ranks = 2;
  const std::string base = R"({"gradient_clipping": 1.0, "zero_optimization": {"stage": 0}})";
  const Choice ch = choose_config(model(), base, w, profile(false));
  for (const Candidate& c : ch.candidates) {
    const Config back = ConfigBuilder().merge_json(c.json, "written").build();
    EXPECT_EQ(back.to_json(), c.config.to_json()) << c.label;
    EXPECT_EQ(back.gradient_clipping, 1.0);  // the base's keys kept
  }
  EXPECT_EQ(config_document("{}", {"a.b=2", "a.c=x"}),
            "{\n  \"a\": {\n    \"b\": 2,\n    \"c\": \"x\"\n  }\n}\n");
  testing::expect_error([] { (void)config_document("[1]", {}); }, ErrorCode::kConfig,
                        "not a JSON object");
}

// Stages 1 and 2 without accumulation move the same buckets: the profile predicts them equally
// fast, and the one that leaves the most room (stage 2: its gradients sharded) is chosen.
TEST(Choose, EqualTimesGoToTheOneThatLeavesTheMostRoom) {
  World w;
  w.ranks = 2;
  w.host_bytes = std::size_t{1} << 30;
  ChooseSpace s;
  s.optimizer_offload = {"none"};
  s.moment_dtypes = {"f32"};
  s.buckets = {0};
  s.stages = {1, 2};
  const Choice ch = choose_config(model(), "{}", w, profile(false), s);
  ASSERT_EQ(ch.candidates.size(), 2u);
  ASSERT_EQ(ch.chosen, 0);
  const Candidate& chosen = ch.candidates[0];
  const Candidate& other = ch.candidates[1];
  ASSERT_EQ(chosen.time.total(), other.time.total());
  EXPECT_EQ(chosen.config.zero_optimization.stage, 2);
  EXPECT_LT(chosen.fullest, other.fullest);
  EXPECT_DOUBLE_EQ(chosen.fullest,
                   static_cast<double>(chosen.need.host) / static_cast<double>(ch.budget.host));
  EXPECT_EQ(ch.why_lost(1).rfind("fits, as fast by the profile, with less room", 0), 0u)
      << ch.why_lost(1);
}

}  // namespace
}  // namespace zero
