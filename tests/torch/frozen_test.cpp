// Frozen parameters through the LibTorch adapter: the char transformer with every >= 2-D weight
// but the head's frozen (requires_grad(false); BitFit-like: biases, norms' gains and the head
// train), so each block's child unit mixes frozen and trainable parameters and the adapter splits
// it into "<unit> (frozen)" and "<unit>". Against ::torch::optim::AdamW over the trainable
// parameters only (the frozen ones are in no optimizer, as a torch trainer writes it): N = 1..3
// in-process ranks, stages 0-3, f32, 10 steps, clipping on: within 1e-5 relative, the frozen
// parameters bitwise their initial values, stage k bitwise stage 0. The engine holds no master
// or state for them, and at stage 3 they are sharded like the rest, and a split unit's two halves
// are gathered as often as the all-trainable model's unit of their child.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "torch_runs.hpp"
#include "zero/engine/plan.hpp"

namespace zero::testing {
namespace {

constexpr int kFrozenSteps = 10;

bool frozen_name(const std::string& name, const ::torch::Tensor& t) {
  return t.dim() >= 2 && name.rfind("head.", 0) != 0;
}

void freeze(ct::Model& model) {
  for (auto& p : model->named_parameters())
    if (frozen_name(p.key(), p.value())) p.value().set_requires_grad(false);
}

std::vector<::torch::Tensor> reference(const TorchRun& r, const TokenData& data) {
  ct::Model model = make_model(test_dims());
  freeze(model);
  std::vector<::torch::Tensor> trainable;
  for (auto& p : model->parameters())
    if (p.requires_grad()) trainable.push_back(p);
  ::torch::optim::AdamW opt(
      trainable,
      ::torch::optim::AdamWOptions(kLr).betas({0.9, 0.999}).eps(1e-8).weight_decay(kWeightDecay));
  for (int s = 0; s < r.steps; ++s) {
    opt.zero_grad();
    auto loss = ct::loss(model, data.tokens[static_cast<std::size_t>(s)],
                         data.targets[static_cast<std::size_t>(s)]);
    loss.backward();
    ::torch::nn::utils::clip_grad_norm_(trainable, r.clip);
    opt.step();
  }
  return snapshot(*model);
}

struct FrozenRun {
  std::vector<::torch::Tensor> params;
  std::size_t master = 0, state = 0, params16 = 0;  // rank 0's bytes after training
  std::size_t trainable_step = 0;                   // rank 0's stepped trainable elements
  int frozen_units = 0;
};

FrozenRun train(const TorchRun& r, const TokenData& data) {
  std::vector<ct::Model> models;
  for (int q = 0; q < r.ranks; ++q) {
    models.push_back(make_model(test_dims(), 1 + q));
    freeze(models.back());
  }
  const Config config = torch_config(r);
  FrozenRun out;
  std::mutex mu;
  ThreadGroup::run(r.ranks, [&](Communicator& comm) {
    const int q = comm.rank();
    ct::Model& model = models[static_cast<std::size_t>(q)];
    zero::torch::Optimizer opt(comm, *model, config);
    const int rows = kBatch / r.ranks;
    for (int s = 0; s < r.steps; ++s) {
      auto tok = data.tokens[static_cast<std::size_t>(s)].slice(0, q * rows, (q + 1) * rows);
      auto tgt = data.targets[static_cast<std::size_t>(s)].slice(0, q * rows, (q + 1) * rows);
      opt.zero_grad();
      ct::loss(model, tok, tgt).backward();
      opt.step();
    }
    Engine& e = opt.engine();
    const MemoryTracker& t = e.tracker();
    FrozenRun mine;
    for (UnitId u = 0; u < e.num_units(); ++u) {
      const bool frozen = !e.unit(u).params[0].trainable;
      for (const ParamSpec& p : e.unit(u).params) EXPECT_EQ(p.trainable, !frozen) << p.name;
      if (frozen) {
        ++mine.frozen_units;
      } else {
        mine.trainable_step += e.unit_step_numel(u);
      }
    }
    mine.master = t.current(MemCategory::kMasterParams);
    mine.state = t.current(MemCategory::kOptimizerState);
    mine.params16 = t.current(MemCategory::kParams16);
    opt.detach();
    if (q == 0) {
      std::lock_guard<std::mutex> lock(mu);
      mine.params = snapshot(*model);
      out = std::move(mine);
    }
  });
  return out;
}

TEST(TorchFrozen, RequiresGradFalseAgainstAdamWOnTheTrainableOnly) {
  const TokenData data = make_data(kFrozenSteps, test_dims());
  TorchRun base;
  base.steps = kFrozenSteps;
  base.clip = 0.5;
  const std::vector<::torch::Tensor> ref = reference(base, data);
  // The frozen parameters' initial values and positions in named_parameters order.
  ct::Model init = make_model(test_dims());
  std::vector<bool> frozen;
  for (const auto& p : init->named_parameters()) frozen.push_back(frozen_name(p.key(), p.value()));
  const std::vector<::torch::Tensor> start = snapshot(*init);
  double worst = 0;
  for (int ranks : {1, 2, 3}) {
    std::vector<::torch::Tensor> stage0;
    for (int stage : {0, 1, 2, 3}) {
      TorchRun r = base;
      r.stage = stage;
      r.ranks = ranks;
      const std::string what = "stage " + std::to_string(stage) + " N=" + std::to_string(ranks);
      const FrozenRun got = train(r, data);
      ASSERT_EQ(got.params.size(), start.size()) << what;
      EXPECT_GT(got.frozen_units, 0) << what;
      for (std::size_t i = 0; i < start.size(); ++i) {
        if (frozen[i]) {
          EXPECT_TRUE(::torch::equal(got.params[i], start[i])) << what << " #" << i;
        }
      }
      const double d = max_rel_diff(got.params, ref);
      worst = std::max(worst, d);
      EXPECT_LE(d, 1e-5) << what;
      // f32: the parameters are the master (no copy); AdamW's two f32 moments over the trainable
      // stepped elements only.
      EXPECT_EQ(got.master, 0u) << what;
      EXPECT_EQ(got.state, 2 * 4 * got.trainable_step) << what;
      if (stage == 0) {
        stage0 = got.params;
      } else {
        EXPECT_TRUE(bitwise_equal(got.params, stage0)) << what << ": not bitwise stage 0";
      }
    }
  }
  std::printf("torch frozen: worst relative difference to torch::optim::AdamW %.3g\n", worst);
}

// ---- stage 3: a split unit's two halves are gathered together, as the child's one unit was

// Rank 0's parameter all-gathers of each step by unit name (a unit's shard, tagged with the
// unit), and after the last step its params16 bytes: the tracker's, the gathered units' pool, and
// the planner's over the gather order of step 1 (no prefetch yet: one all-gather per gather).
struct GatherRun {
  std::vector<std::map<std::string, int>> gathers;  // [step] unit name -> all-gathers
  std::size_t params16 = 0, pool = 0, planned = 0;
  std::size_t shard_bytes = 0, largest_unit_bytes = 0;
  int units = 0;
};

GatherRun gather_run(bool frozen, int steps, const TokenData& data) {
  TorchRun r;
  r.stage = 3;
  r.ranks = 2;
  r.steps = steps;
  const Config config = torch_config(r);
  std::vector<ct::Model> models;
  for (int q = 0; q < r.ranks; ++q) {
    models.push_back(make_model(test_dims(), 1 + q));
    if (frozen) freeze(models.back());
  }
  GatherRun out;
  std::mutex mu;
  ThreadGroup::run(r.ranks, [&](Communicator& comm) {
    const int q = comm.rank();
    ct::Model& model = models[static_cast<std::size_t>(q)];
    zero::torch::Optimizer opt(comm, *model, config);
    Engine& e = opt.engine();
    comm.set_event_capacity(4096);
    const int rows = kBatch / r.ranks;
    GatherRun mine;
    std::vector<UnitId> order;
    for (int s = 0; s < steps; ++s) {
      const auto before = comm.events();
      const std::int64_t last = before.empty() ? -1 : static_cast<std::int64_t>(before.back().seq);
      opt.zero_grad();
      ct::loss(model, data.tokens[static_cast<std::size_t>(s)].slice(0, q * rows, (q + 1) * rows),
               data.targets[static_cast<std::size_t>(s)].slice(0, q * rows, (q + 1) * rows))
          .backward();
      opt.step();
      std::map<std::string, int> count;
      for (const CollectiveEvent& ev : comm.events()) {
        if (static_cast<std::int64_t>(ev.seq) <= last || ev.kind != Collective::kAllGather ||
            ev.tag < 0 || ev.tag >= e.num_units())
          continue;
        const auto u = static_cast<UnitId>(ev.tag);
        if (ev.count != e.unit_shard_numel(u)) continue;  // not a unit's (the step's norms)
        ++count[e.unit(u).name];
        if (s == 0) order.push_back(u);
      }
      mine.gathers.push_back(count);
    }
    PlanInput pin;
    pin.ranks = r.ranks;
    pin.config = config;
    pin.gather_order = order;
    for (UnitId u = 0; u < e.num_units(); ++u) {
      pin.units.push_back(e.unit(u));
      mine.shard_bytes += 4 * e.unit_shard_numel(u);
      mine.largest_unit_bytes = std::max(mine.largest_unit_bytes, 4 * e.unit_padded_numel(u));
    }
    mine.units = e.num_units();
    mine.params16 = e.tracker().current(MemCategory::kParams16);
    mine.pool = e.buffer_bytes().gathered_params;
    mine.planned = plan_engine_memory(pin).at(MemCategory::kParams16);
    if (q == 0) {
      std::lock_guard<std::mutex> lock(mu);
      out = std::move(mine);
    }
  });
  return out;
}

// The BitFit-like freeze splits each block into "blockK (frozen)" (the Linear weights) and
// "blockK" (biases, norms): an operator that reads one half only (a LayerNorm) must not release
// the other, or the next Linear gathers it again (27 unit all-gathers a step against the
// all-trainable model's 9 before the halves were released together; 13 since). Each half is
// gathered in every step exactly as often as the all-trainable model's unit of the same child.
// Memory: with the default stage3_prefetch_bucket_size (5e7 elements, more than this model) every
// unit is prefetched, so the gathered pool holds one buffer per unit, each of the largest unit's
// size (the pool's buffers are equal): params16 = shards + that pool, the planner's figure. (With
// a small bucket the planner, whose trainer releases a unit before it gathers the next, predicts
// one buffer fewer than the adapter holds: an operator gathers what it reads before the units it
// does not read are released.)
TEST(TorchFrozen, Stage3GathersEachHalfOfASplitUnitAsOftenAsItsChildsUnit) {
  constexpr int kSteps = 3;  // step 1 records the gather order; 2 and 3 prefetch along it
  const TokenData data = make_data(kSteps, test_dims());
  const GatherRun whole = gather_run(false, kSteps, data);
  const GatherRun split = gather_run(true, kSteps, data);
  ASSERT_EQ(whole.gathers.size(), static_cast<std::size_t>(kSteps));
  ASSERT_EQ(split.gathers.size(), static_cast<std::size_t>(kSteps));
  const std::string suffix = " (frozen)";
  for (int s = 0; s < kSteps; ++s) {
    int n_whole = 0, n_split = 0;
    for (const auto& [name, n] : whole.gathers[static_cast<std::size_t>(s)]) n_whole += n;
    for (const auto& [name, n] : split.gathers[static_cast<std::size_t>(s)]) {
      n_split += n;
      const bool half = name.size() > suffix.size() &&
                        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
      const std::string child = half ? name.substr(0, name.size() - suffix.size()) : name;
      const auto it = whole.gathers[static_cast<std::size_t>(s)].find(child);
      ASSERT_NE(it, whole.gathers[static_cast<std::size_t>(s)].end()) << name;
      EXPECT_EQ(n, it->second) << "step " << s + 1 << ": unit '" << name << "' all-gathered " << n
                               << " times, its child's unit " << it->second;
    }
    std::printf("stage 3, N = 2, step %d: unit all-gathers, all-trainable %d, frozen split %d\n",
                s + 1, n_whole, n_split);
  }
  for (const GatherRun* g : {&whole, &split}) {
    const char* what = g == &whole ? "all-trainable" : "frozen split";
    std::printf(
        "%s: %d units, params16 %zu = shards %zu + gathered pool %zu (%zu buffers of the largest "
        "unit, %zu bytes); planner %zu\n",
        what, g->units, g->params16, g->shard_bytes, g->pool,
        g->largest_unit_bytes ? g->pool / g->largest_unit_bytes : 0, g->largest_unit_bytes,
        g->planned);
    EXPECT_EQ(g->params16, g->planned) << what;
    EXPECT_EQ(g->params16, g->shard_bytes + g->pool) << what;
    EXPECT_LE(g->pool, static_cast<std::size_t>(g->units) * g->largest_unit_bytes) << what;
  }
}

}  // namespace
}  // namespace zero::testing
