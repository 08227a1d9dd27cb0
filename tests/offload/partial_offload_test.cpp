// Partial optimizer offload (zero_optimization.offload_optimizer.ratio, DeepSpeed's meaning): the
// trailing units whose stepped elements come closest to `ratio` of this rank's stepped elements
// are offloaded (nvme: in the swap file), the leading ones stay on the device (nvme: in pinned
// host memory). Checked here at ratio 0, 0.25, 0.5 and 1 (and 0.75), stages 1-3, offload cpu and
// nvme, with and without parameter offload: the cut against a rule computed here from the units'
// sizes; the tracker's bytes per category and tier against the planner's, and against sizes
// computed here; the tiers' bytes moving with the ratio (the planner of another ratio does not
// match); the step's host<->device traffic; the trained parameters and masters bitwise those of
// a run without offload at every ratio (the host and the device step run the same kernels on
// the CPU device; also on the discrete test device, whose memory the host cannot address); the
// placement's invariants (no reduce bucket across the gradient tiers, chunks for the offloaded
// units only, frozen units on the lead tier); and the configurations refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/mlp_model.hpp"
#include "common/mlp_training.hpp"
#include "engine/placement.hpp"
#include "offload/io_fixtures.hpp"
#include "zero/comm/comm.hpp"
#include "zero/config/config.hpp"
#include "zero/core/error.hpp"
#include "zero/engine/engine.hpp"
#include "zero/engine/plan.hpp"
#include "zero/optim/optimizer.hpp"

namespace zero {
namespace {

using testing::bitwise_equal;
using testing::describe;
using testing::kRows;
using testing::make_config;
using testing::Mlp;
using testing::RunResult;
using testing::RunSpec;
using testing::TempDir;
using testing::train;

// Six units of different sizes (a unit per layer), so that the ratios cut at different units:
// at N = 2 their shards are 64, 160, 96, 96, 96, 64 elements.
const std::vector<int> kWide = {5, 11, 22, 7, 16, 9, 4};
constexpr double kRatios[] = {0.0, 0.25, 0.5, 1.0};

// The rule, computed here from the units' stepped elements (independently of the placement): the
// trailing units whose elements come closest to ratio x all of them are offloaded; between two
// equally close, the larger part. Returns the number of trailing units offloaded.
std::size_t expected_trailing(const std::vector<std::size_t>& steps, double ratio) {
  std::size_t total = 0;
  for (std::size_t n : steps) total += n;
  const double want = ratio * static_cast<double>(total);
  std::size_t best_k = 0, off = 0;
  double best = want;
  for (std::size_t k = 1; k <= steps.size(); ++k) {
    off += steps[steps.size() - k];
    const double d = std::fabs(static_cast<double>(off) - want);
    if (d <= best) {
      best = d;
      best_k = k;
    }
  }
  return best_k;
}

std::size_t trailing_elems(const std::vector<std::size_t>& steps, std::size_t k) {
  std::size_t off = 0;
  for (std::size_t i = steps.size() - k; i < steps.size(); ++i) off += steps[i];
  return off;
}

// The stepped elements per unit at stage >= 1 and N ranks (the shards; padded to N x 32).
std::vector<std::size_t> shard_sizes(const std::vector<int>& dims, int n) {
  std::vector<std::size_t> out;
  for (std::size_t l = 0; l + 1 < dims.size(); ++l) {
    const std::size_t w = static_cast<std::size_t>(dims[l + 1] * dims[l]);
    const std::size_t numel = (w + 31) / 32 * 32 + static_cast<std::size_t>(dims[l + 1]);
    const std::size_t grid = 32 * static_cast<std::size_t>(n);
    out.push_back((numel + grid - 1) / grid * grid / static_cast<std::size_t>(n));
  }
  return out;
}

PlanResult plan_of(const Config& cfg, int ranks, const std::vector<int>& dims) {
  PlanInput pin;
  pin.ranks = ranks;
  pin.config = cfg;
  pin.units = Mlp(dims).unit_specs();
  return plan_engine_memory(pin);
}

RunSpec offload_spec(int stage, DType dt, const std::string& device, double ratio,
                     const std::string& dir) {
  RunSpec s{.stage = stage, .ranks = 2, .dtype = dt, .clip = true, .overlap = stage == 3};
  s.offload_buffers = 2;
  s.offload_chunk = 50;  // does not divide the shards: units of several chunks
  s.offload_device = device;
  s.nvme_path = dir;
  s.offload_ratio = ratio;
  s.dims = kWide;
  return s;
}

// ---- the cut

TEST(PartialOffload, RatioOffloadsTheTrailingUnitsClosestToItInElements) {
  std::printf(
      "offload_optimizer.ratio -> offloaded fraction of this rank's stepped elements "
      "(the planner's), MLP %s\n",
      "5-11-22-7-16-9-4");
  for (int n : {1, 2, 3}) {
    for (int stage : {1, 2, 3}) {
      const std::vector<std::size_t> steps = shard_sizes(kWide, n);
      std::size_t total = 0;
      for (std::size_t s : steps) total += s;
      std::size_t last = 0;
      for (double ratio : {0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0}) {
        for (const char* device : {"cpu", "nvme"}) {
          const PlanResult plan = plan_of(
              make_config(offload_spec(stage, DType::kBF16, device, ratio, "/tmp")), n, kWide);
          const std::size_t k = expected_trailing(steps, ratio);
          EXPECT_EQ(plan.stepped, total);
          EXPECT_EQ(plan.stepped_offloaded, trailing_elems(steps, k))
              << "N=" << n << " stage " << stage << " ratio " << ratio << " " << device;
          if (std::string(device) == "cpu" && stage == 1) {
            std::printf(
                "  N=%d ratio %.2f: %zu of %zu elements (%.3f), the last %zu of %zu units\n", n,
                ratio, plan.stepped_offloaded, plan.stepped, plan.offload_fraction(), k,
                steps.size());
          }
        }
        // More offloaded as the ratio grows; 0 and 1 exact.
        const std::size_t off = trailing_elems(steps, expected_trailing(steps, ratio));
        EXPECT_GE(off, last);
        last = off;
        if (ratio == 0.0) {
          EXPECT_EQ(off, 0u);
        }
        if (ratio == 1.0) {
          EXPECT_EQ(off, total);
        }
      }
    }
  }
  // The cuts of 0.25 and 0.5 differ at N = 2 (what the tests below rely on).
  const std::vector<std::size_t> steps = shard_sizes(kWide, 2);
  EXPECT_NE(expected_trailing(steps, 0.25), expected_trailing(steps, 0.5));
  EXPECT_NE(expected_trailing(steps, 0.25), 0u);
  EXPECT_NE(expected_trailing(steps, 0.5), steps.size());
}

// DESIGN.md's formula with a partial offload: the fraction of the optimizer part (and, stages
// 2-3, of the gradient partition) moves; the total with what moved is the formula's.
TEST(PartialOffload, TheFormulaMovesTheRatioOfTheOptimizerAndGradientPartition) {
  const double psi = 1e9;
  for (int stage : {1, 2, 3}) {
    const FormulaBytes none = zero_formula(psi, 8, stage);
    const FormulaBytes all = zero_formula(psi, 8, stage, 2, 2, 12, true, false);
    for (double r : {0.0, 0.25, 0.5, 1.0}) {
      const FormulaBytes f = zero_formula(psi, 8, stage, 2, 2, 12, true, false, std::nullopt, r);
      EXPECT_DOUBLE_EQ(f.optimizer, (1 - r) * none.optimizer) << stage << " " << r;
      EXPECT_DOUBLE_EQ(f.grads, stage >= 2 ? (1 - r) * none.grads : none.grads) << stage;
      EXPECT_DOUBLE_EQ(f.total() + f.offloaded, none.total()) << stage << " " << r;
      EXPECT_DOUBLE_EQ(f.offloaded, r * all.offloaded) << stage << " " << r;
    }
  }
}

// The placement's invariants, read from the placement itself: the tier of each unit, the arenas
// per tier, no reduce bucket over both gradient tiers, chunks for the offloaded units only (the
// pinned ones first with nvme), frozen units on the lead tier.
TEST(PartialOffload, PlacementSplitsArenasBucketsAndChunksAtTheCut) {
  using detail::Tier;
  std::vector<UnitSpec> units = Mlp(kWide).unit_specs();
  units[4].params[0].trainable = units[4].params[1].trainable = false;  // a frozen unit
  for (const char* device : {"cpu", "nvme"}) {
    for (int stage : {1, 2, 3}) {
      for (double ratio : {0.0, 0.25, 0.5, 0.75, 1.0}) {
        RunSpec s = offload_spec(stage, DType::kBF16, device, ratio, "/tmp");
        s.reduce_bucket = 1000;  // merges everything it may
        const Config cfg = make_config(s);
        const detail::Placement p = detail::make_placement(detail::placement_input(
            cfg, units, 2, 1, 32, detail::Ownership::kManaged, /*host_accessible=*/false));
        const bool nvme = std::string(device) == "nvme";
        const Tier lead = nvme ? Tier::kPinned : Tier::kDevice;
        const Tier trail = nvme ? Tier::kNvme : Tier::kPinned;
        const std::string what = std::string(device) + " stage " + std::to_string(stage) +
                                 " ratio " + std::to_string(ratio);
        std::vector<std::size_t> steps;
        for (std::size_t u = 0; u < p.num_units(); ++u) {
          if (!p.units[u].frozen) steps.push_back(p.units[u].step_count);
        }
        const std::size_t k = expected_trailing(steps, ratio);
        std::size_t trainable_seen = 0, lead_step = 0, trail_step = 0, host_grads = 0;
        for (std::size_t u = 0; u < p.num_units(); ++u) {
          const detail::UnitPlacement& up = p.units[u];
          const auto id = static_cast<UnitId>(u);
          if (up.frozen) {
            EXPECT_EQ(up.optim_tier, lead) << what;
            EXPECT_FALSE(up.grads_on_host) << what;
            EXPECT_EQ(p.unit_chunk[u], p.unit_chunk[u + 1]) << what;
            continue;
          }
          const bool off = trainable_seen++ >= steps.size() - k;
          EXPECT_EQ(up.optim_tier, off ? trail : lead) << what << " unit " << u;
          EXPECT_EQ(up.grads_on_host, stage >= 2 && up.optim_tier != Tier::kDevice) << what;
          // Chunks: the offloaded units' (all, with nvme), tiling the stepped range.
          std::size_t chunked = 0;
          for (std::size_t c = p.unit_chunk[u]; c < p.unit_chunk[u + 1]; ++c) {
            EXPECT_EQ(p.chunks[c].unit, id);
            EXPECT_EQ(p.chunks[c].at, chunked);
            chunked += p.chunks[c].count;
            EXPECT_EQ(c >= p.nvme_chunk, up.optim_tier == Tier::kNvme) << what;
          }
          EXPECT_EQ(chunked, up.optim_tier == Tier::kDevice ? 0 : up.step_count) << what;
          // Offsets: consecutive within the unit's tier.
          if (up.optim_tier == Tier::kPinned) {
            EXPECT_EQ(up.optim_offset, nvme ? lead_step : trail_step) << what;
          } else if (up.optim_tier == Tier::kDevice) {
            EXPECT_EQ(up.optim_offset, lead_step) << what;
          }
          (off ? trail_step : lead_step) += up.step_count;
          if (up.grads_on_host) {
            EXPECT_EQ(up.grads_offset, host_grads) << what;
            host_grads += up.step_count;
          }
        }
        EXPECT_EQ(p.offload_step, trail_step) << what;
        EXPECT_EQ(p.offloaded, nvme || trail_step > 0) << what;
        EXPECT_EQ(p.on_device, !nvme && lead_step > 0) << what;
        // The arenas per tier (bf16 training: a master on the device too).
        const std::size_t pinned_step = nvme ? lead_step : trail_step;
        const std::size_t device_step = nvme ? 0 : lead_step;
        EXPECT_EQ(p.master.bytes, device_step * 4) << what;
        EXPECT_EQ(p.state.bytes, device_step * 4) << what;
        EXPECT_EQ(p.host_master.bytes, pinned_step * 4) << what;
        EXPECT_EQ(p.host_state.bytes, pinned_step * 4) << what;
        EXPECT_EQ(p.host_grads.bytes, host_grads * 4) << what;
        EXPECT_EQ(p.host_master.tier, Tier::kPinned);
        EXPECT_EQ(p.master.tier, Tier::kDevice);
        EXPECT_EQ(p.nvme_optimizer, nvme && trail_step > 0) << what;
        std::size_t file_elems = 0;
        for (std::size_t n : p.optim_chunk_elems) file_elems += n;
        EXPECT_EQ(file_elems, nvme ? trail_step : 0) << what;
        // A merged reduce bucket never spans the device's gradients and the host partition.
        for (const detail::Bucket& b : p.reduce_buckets) {
          for (UnitId u = b.first; u <= b.last; ++u) {
            EXPECT_EQ(p.grads_on_host(u), p.grads_on_host(b.first)) << what << " bucket";
          }
        }
        // The landing buffer of a discrete device: for the host partition's buckets only.
        EXPECT_EQ(p.grad_landing.bytes > 0, host_grads > 0) << what;
      }
    }
  }
}

// ---- bytes per tier: the tracker against the planner

// Rank 0's tracked bytes per category after training: all but NVMe, pinned, NVMe.
struct Tracked {
  std::array<std::size_t, kNumMemCategories> bytes{}, pinned{}, nvme{};
  std::uint64_t host_to_device = 0, device_to_host = 0;  // the last step's
};

bool plan_matches(const PlanResult& plan, const Tracked& t) {
  for (std::size_t c = 0; c < kNumMemCategories; ++c) {
    const auto cat = static_cast<MemCategory>(c);
    if (cat == MemCategory::kActivations || cat == MemCategory::kOther) continue;  // the trainer's
    if (t.bytes[c] != plan.bytes[c] || t.pinned[c] != plan.pinned[c] || t.nvme[c] != plan.nvme[c])
      return false;
  }
  return true;
}

// Trains `spec` for 3 steps at 2 ranks; every rank's tracker must equal the plan (checked on
// every rank); returns rank 0's figures.
Tracked train_and_track(const RunSpec& spec, const PlanResult& plan) {
  Tracked out;
  std::mutex mu;
  const Mlp mlp(spec.dims);
  ThreadGroup::run(spec.ranks, [&](Communicator& comm) {
    Engine e(comm, make_config(spec));
    mlp.declare(e);
    mlp.init(e, 1);
    StepResult last;
    last = testing::run_steps(e, mlp, comm.rank(), 3);
    Tracked t;
    const MemoryTracker& m = e.tracker();
    for (std::size_t c = 0; c < kNumMemCategories; ++c) {
      const auto cat = static_cast<MemCategory>(c);
      t.nvme[c] = m.current(cat, MemTier::kNvme);
      t.bytes[c] = m.current(cat) - t.nvme[c];
      t.pinned[c] = m.current(cat, MemTier::kPinned);
      if (cat == MemCategory::kActivations || cat == MemCategory::kOther) continue;
      EXPECT_EQ(t.bytes[c], plan.bytes[c]) << to_string(cat) << ": " << describe(spec);
      EXPECT_EQ(t.pinned[c], plan.pinned[c]) << to_string(cat) << " pinned: " << describe(spec);
      EXPECT_EQ(t.nvme[c], plan.nvme[c]) << to_string(cat) << " nvme: " << describe(spec);
    }
    t.host_to_device = last.metrics.host_to_device_bytes;
    t.device_to_host = last.metrics.device_to_host_bytes;
    if (comm.rank() == 0) {
      std::lock_guard<std::mutex> lock(mu);
      out = t;
    }
    comm.barrier();
  });
  return out;
}

std::size_t at(const std::array<std::size_t, kNumMemCategories>& a, MemCategory c) {
  return a[static_cast<std::size_t>(c)];
}

TEST(PartialOffload, BytesPerTierEqualThePlannersAtEveryRatio) {
  TempDir dir;
  const std::vector<std::size_t> steps = shard_sizes(kWide, 2);
  std::size_t total = 0;
  for (std::size_t s : steps) total += s;
  int runs = 0;
  std::printf("%-5s %-5s %-5s %-5s %5s | master+state+grads bytes, rank 0: %8s %8s %8s | plan\n",
              "opt", "param", "stage", "dtype", "ratio", "device", "pinned", "nvme");
  for (const char* device : {"cpu", "nvme"}) {
    for (const char* param : {"none", "cpu", "nvme"}) {
      for (int stage : {1, 2, 3}) {
        if (stage < 3 && std::string(param) != "none") continue;
        for (DType dt : {DType::kF32, DType::kBF16}) {
          // offload_param nvme needs every unit's optimizer off the device: with device cpu only
          // ratio 1 (the refusal below).
          std::vector<double> ratios(std::begin(kRatios), std::end(kRatios));
          if (std::string(param) == "nvme" && std::string(device) == "cpu") ratios = {1.0};
          std::vector<PlanResult> plans;
          std::vector<Tracked> tracked;
          for (double ratio : ratios) {
            RunSpec s = offload_spec(stage, dt, device, ratio, dir.path());
            s.offload_param = param;
            const PlanResult plan = plan_of(make_config(s), 2, kWide);
            const Tracked t = train_and_track(s, plan);
            ++runs;
            EXPECT_TRUE(plan_matches(plan, t)) << describe(s);
            // Sizes computed here: the optimizer's master and moments (AdamW: 2 x f32) by tier.
            const std::size_t off = trailing_elems(steps, expected_trailing(steps, ratio));
            const bool nvme = std::string(device) == "nvme";
            const std::size_t pinned_elems = nvme ? total - off : off;
            const std::size_t device_elems = nvme ? 0 : total - off;
            const MemCategory kM = MemCategory::kMasterParams, kS = MemCategory::kOptimizerState,
                              kG = MemCategory::kGradients;
            EXPECT_EQ(at(t.pinned, kM), 4 * pinned_elems) << describe(s);
            EXPECT_EQ(at(t.pinned, kS), 8 * pinned_elems) << describe(s);
            // On the device: the moments, and a master in 16-bit training only.
            EXPECT_EQ(at(t.bytes, kM) - at(t.pinned, kM), dt == DType::kF32 ? 0 : 4 * device_elems)
                << describe(s);
            EXPECT_EQ(at(t.bytes, kS) - at(t.pinned, kS), 8 * device_elems) << describe(s);
            // The swap file: the NVMe units' chunks, each part padded to 4 KiB.
            if (nvme && off > 0) {
              EXPECT_GE(at(t.nvme, kM), 4 * off) << describe(s);
              EXPECT_EQ(at(t.nvme, kM) % 4096, 0u) << describe(s);
            } else {
              EXPECT_EQ(at(t.nvme, kM) + at(t.nvme, kS), 0u) << describe(s);
            }
            // Stages 2-3: the fp32 gradient shards of the offloaded units on the host.
            EXPECT_EQ(at(t.pinned, kG), stage >= 2 ? 4 * (nvme ? total : off) : 0) << describe(s);
            // The step's traffic moves with the ratio: the offloaded units' updated parameters
            // to the device, their gradients to the host (stages 2-3: the reduced shards as
            // they complete; stage 1: chunk by chunk at the step; fp32 either way). Parameter
            // shards in NVMe add the gathers' reads: not counted here.
            const std::size_t moved = nvme ? total : off;
            if (std::string(param) != "nvme") {
              EXPECT_EQ(t.host_to_device, moved * dtype_size(dt)) << describe(s);
              EXPECT_EQ(t.device_to_host, 4 * moved) << describe(s);
            }
            auto sum = [&](const std::array<std::size_t, kNumMemCategories>& a,
                           const std::array<std::size_t, kNumMemCategories>* minus) {
              std::size_t v = 0;
              for (MemCategory c : {kM, kS, kG}) v += at(a, c) - (minus ? at(*minus, c) : 0);
              return v;
            };
            std::printf("%-5s %-5s %-5d %-5s %5.2f | %.3f offloaded: %31zu %8zu %8zu | %s\n",
                        device, param, stage, std::string(to_string(dt)).c_str(), ratio,
                        plan.offload_fraction(), sum(t.bytes, &t.pinned), sum(t.pinned, nullptr),
                        sum(t.nvme, nullptr), plan_matches(plan, t) ? "equal" : "DIFFERS");
            plans.push_back(plan);
            tracked.push_back(t);
          }
          // The equality is not vacuous: the tiers' bytes move with the ratio, and the plan of
          // another cut (a unit on the wrong tier) does not match.
          for (std::size_t a = 0; a < ratios.size(); ++a) {
            for (std::size_t b = 0; b < ratios.size(); ++b) {
              const bool same_cut =
                  expected_trailing(steps, ratios[a]) == expected_trailing(steps, ratios[b]);
              EXPECT_EQ(plan_matches(plans[a], tracked[b]), same_cut)
                  << device << " param " << param << " stage " << stage << " " << to_string(dt)
                  << ": plan at ratio " << ratios[a] << ", run at " << ratios[b];
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(runs, 2 * (3 + 1 + 1) * 2 * 4 - 2 * 3);  // cpu + param nvme: ratio 1 only
  EXPECT_TRUE(dir.files().empty()) << "swap files left behind";
}

// ---- the trained parameters, bitwise

TEST(PartialOffload, TrainsBitwiseTheSameParametersAtEveryRatio) {
  TempDir dir;
  int runs = 0;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (int stage : {1, 2, 3}) {
      RunSpec base{.stage = stage, .ranks = 3, .dtype = dt, .clip = true, .overlap = stage == 3};
      base.dims = kWide;
      const RunResult ref = train(base);
      for (const char* device : {"cpu", "nvme"}) {
        for (double ratio : {0.0, 0.25, 0.5, 0.75, 1.0}) {
          RunSpec s = offload_spec(stage, dt, device, ratio, dir.path());
          s.ranks = 3;
          const RunResult got = train(s);
          ++runs;
          EXPECT_TRUE(bitwise_equal(got.params, ref.params)) << describe(s);
          EXPECT_TRUE(bitwise_equal(got.masters, ref.masters)) << describe(s);
          ASSERT_EQ(got.steps.size(), ref.steps.size());
          for (std::size_t i = 0; i < got.steps.size(); ++i) {
            EXPECT_EQ(got.steps[i].grad_norm, ref.steps[i].grad_norm) << describe(s) << " " << i;
          }
        }
      }
    }
  }
  EXPECT_EQ(runs, 2 * 3 * 2 * 5);
  EXPECT_TRUE(dir.files().empty()) << "swap files left behind";
}

// int8 moments (block-wise 8-bit, issue 30 item 1) with a partial offload: every unit's shard is
// a whole number of 256-element blocks (the layout pads to N x 256), so the cut between the tiers
// never splits a block; each tier holds state_bytes(int8, its elements) per moment (codes and one
// f32 absmax per block), the planner equal to the tracker, and the trained parameters bitwise the
// int8 run without offload at every ratio.
TEST(PartialOffload, Int8MomentsSplitAtTheCutBitwiseTheRunWithoutOffload) {
  TempDir dir;
  int runs = 0;
  for (int stage : {2, 3}) {
    RunSpec base{
        .stage = stage, .ranks = 2, .dtype = DType::kBF16, .clip = true, .overlap = stage == 3};
    base.dims = kWide;
    base.moment_dtype = "int8";
    const RunResult ref = train(base);
    for (const char* device : {"cpu", "nvme"}) {
      for (double ratio : {0.0, 0.5, 1.0}) {
        RunSpec s = offload_spec(stage, DType::kBF16, device, ratio, dir.path());
        s.moment_dtype = "int8";
        const PlanResult plan = plan_of(make_config(s), 2, kWide);
        const Tracked t = train_and_track(s, plan);
        EXPECT_TRUE(plan_matches(plan, t)) << describe(s);
        // The shards at N = 2 and int8: each unit padded to 2 x 256, so 256 elements a unit.
        const std::size_t total = 256 * (kWide.size() - 1);
        const std::size_t pinned_moments = at(t.pinned, MemCategory::kOptimizerState);
        const std::size_t pinned_elems = at(t.pinned, MemCategory::kMasterParams) / 4;
        EXPECT_EQ(pinned_elems % 256, 0u) << describe(s);
        EXPECT_EQ(pinned_moments, 2 * state_bytes(MomentDType::kInt8, pinned_elems)) << describe(s);
        EXPECT_EQ(state_bytes(MomentDType::kInt8, 256), 256u + 4u);
        const bool nvme = std::string(device) == "nvme";
        if (!nvme) {
          EXPECT_EQ(pinned_elems, static_cast<std::size_t>(ratio * static_cast<double>(total)))
              << describe(s);
          EXPECT_EQ(at(t.bytes, MemCategory::kOptimizerState) - pinned_moments,
                    2 * state_bytes(MomentDType::kInt8, total - pinned_elems))
              << describe(s);
        }
        const RunResult got = train(s);
        ++runs;
        EXPECT_TRUE(bitwise_equal(got.params, ref.params)) << describe(s);
        EXPECT_TRUE(bitwise_equal(got.masters, ref.masters)) << describe(s);
      }
    }
  }
  EXPECT_EQ(runs, 2 * 2 * 3);
  EXPECT_TRUE(dir.files().empty()) << "swap files left behind";
}

// Merged reduce buckets (split at the gradient tiers), accumulation with fp16's skipped steps,
// parameter offload, and the discrete device (the offload paths of a GPU: gradient shards copied
// device -> pinned, chunks and parameters over the copy lane, the device part stepped by the
// device): bitwise the run without offload.
TEST(PartialOffload, BucketsAccumulationParamOffloadAndADiscreteDeviceMatchNoOffload) {
  TempDir dir;
  struct Case {
    int stage;
    DType dt;
    const char* device;
    double ratio;
    const char* param;
    int accumulation;
    long bucket;
    bool discrete;
  };
  const Case cases[] = {
      {2, DType::kBF16, "cpu", 0.5, "none", 1, 1000, false},
      {2, DType::kF32, "cpu", 0.25, "none", 1, 400, false},
      {3, DType::kBF16, "nvme", 0.5, "none", 1, 1000, false},
      {1, DType::kBF16, "cpu", 0.5, "none", 1, 1000, false},
      {2, DType::kF16, "cpu", 0.5, "none", 3, 0, false},
      {3, DType::kF16, "nvme", 0.25, "none", 3, 0, false},
      {3, DType::kBF16, "cpu", 0.5, "cpu", 1, 0, false},
      {3, DType::kBF16, "nvme", 0.5, "nvme", 1, 0, false},
      {3, DType::kF32, "nvme", 0.25, "nvme", 2, 0, false},
      {1, DType::kBF16, "cpu", 0.5, "none", 1, 0, true},
      {2, DType::kBF16, "cpu", 0.5, "none", 3, 1000, true},
      {3, DType::kF32, "cpu", 0.25, "cpu", 1, 0, true},
      {2, DType::kBF16, "nvme", 0.5, "none", 1, 0, true},
      {3, DType::kBF16, "nvme", 0.5, "nvme", 3, 0, true},
  };
  for (const Case& c : cases) {
    RunSpec base{.stage = c.stage,
                 .ranks = 3,
                 .dtype = c.dt,
                 .accumulation = c.accumulation,
                 .clip = true,
                 .overlap = true};
    base.dims = kWide;
    base.reduce_bucket = c.bucket;
    const RunResult ref = train(base);
    RunSpec s = offload_spec(c.stage, c.dt, c.device, c.ratio, dir.path());
    s.ranks = 3;
    s.accumulation = c.accumulation;
    s.reduce_bucket = c.bucket;
    s.overlap = true;
    s.offload_param = c.param;
    s.discrete = c.discrete;
    const RunResult got = train(s);
    const std::string what = describe(s) + " param " + c.param;
    EXPECT_TRUE(bitwise_equal(got.params, ref.params)) << what;
    EXPECT_TRUE(bitwise_equal(got.masters, ref.masters)) << what;
    ASSERT_EQ(got.steps.size(), ref.steps.size()) << what;
    for (std::size_t i = 0; i < got.steps.size(); ++i) {
      EXPECT_EQ(got.steps[i].applied, ref.steps[i].applied) << what << " " << i;
      EXPECT_EQ(got.steps[i].grad_norm, ref.steps[i].grad_norm) << what << " " << i;
    }
  }
  EXPECT_TRUE(dir.files().empty()) << "swap files left behind";
}

// The master and state pointers of the units in pinned memory, and the copies of every unit,
// from whichever tier: a unit on the device and one offloaded agree with a run without offload.
TEST(PartialOffload, ShardAccessorsReadEachUnitFromItsTier) {
  TempDir dir;
  for (const char* device : {"cpu", "nvme"}) {
    RunSpec s = offload_spec(2, DType::kBF16, device, 0.5, dir.path());
    RunSpec none = s;
    none.offload_buffers = 0;
    const Mlp mlp(kWide);
    const std::vector<std::size_t> steps = shard_sizes(kWide, 2);
    const std::size_t first_off = steps.size() - expected_trailing(steps, 0.5);
    ThreadGroup::run(2, [&](Communicator& comm) {
      Engine a(comm, make_config(s));
      Engine b(comm, make_config(none));
      for (Engine* e : {&a, &b}) {
        mlp.declare(*e);
        mlp.init(*e, 3);
        testing::run_steps(*e, mlp, comm.rank(), 3);
      }
      for (UnitId u = 0; u < a.num_units(); ++u) {
        const std::size_t n = a.unit_shard_numel(u);
        const bool in_file =
            std::string(device) == "nvme" && static_cast<std::size_t>(u) >= first_off;
        std::vector<float> x(n), y(n);
        a.copy_master_shard(u, x.data());
        b.copy_master_shard(u, y.data());
        EXPECT_EQ(std::memcmp(x.data(), y.data(), n * 4), 0) << device << " unit " << u;
        a.copy_state_shard(u, 1, x.data());
        b.copy_state_shard(u, 1, y.data());
        EXPECT_EQ(std::memcmp(x.data(), y.data(), n * 4), 0) << device << " unit " << u;
        if (in_file) {
          EXPECT_THROW((void)a.master_shard(u), Error) << u;
          EXPECT_THROW((void)a.state_shard(u, 0), Error) << u;
        } else {
          EXPECT_EQ(std::memcmp(a.master_shard(u), b.master_shard(u), n * 4), 0) << u;
          EXPECT_EQ(std::memcmp(a.state_shard(u, 0), b.state_shard(u, 0), n * 4), 0) << u;
        }
      }
      comm.barrier();
    });
  }
}

// ---- the configurations refused, each naming the key

TEST(PartialOffload, RatioOutsideZeroToOneAndNvmeParametersOnTheDeviceAreRefused) {
  for (const char* bad : {"-0.25", "1.5", "\"half\"", "[0.5]"}) {
    try {
      (void)parse_config(
          std::string(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu",
          "ratio": )") +
          bad + "}}}");
      ADD_FAILURE() << bad << ": no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kConfig);
      EXPECT_NE(std::string(e.what()).find("zero_optimization.offload_optimizer.ratio"),
                std::string::npos)
          << e.what();
    }
  }
  for (double ok : {0.0, 0.25, 1.0}) {
    const Config c = parse_config(
        R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": )" +
        std::to_string(ok) + "}}}");
    EXPECT_EQ(c.zero_optimization.offload_optimizer.ratio, ok);
  }
  // Parameter shards in NVMe are written back by the offloaded step: with device cpu every unit
  // must be offloaded (ratio 1); device nvme steps every unit on the host at any ratio.
  TempDir dir;
  RunSpec s = offload_spec(3, DType::kBF16, "cpu", 0.5, dir.path());
  s.offload_param = "nvme";
  try {
    train(s);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kConfig);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("zero_optimization.offload_param.device"), std::string::npos) << msg;
    EXPECT_NE(msg.find("zero_optimization.offload_optimizer.ratio"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace zero
