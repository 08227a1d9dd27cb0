// The ZeRO engine: the trainer-facing hooks and step(). What lives where is the placement's
// (engine/placement.hpp); the rooms own the state: the gradient reducer (engine/grad_reducer.hpp),
// the parameter gatherer (engine/param_gatherer.hpp) and the shard optimizer
// (engine/shard_optimizer.hpp: on the device or offloaded, chosen once from the placement).
#include "zero/engine/engine.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <utility>

#include "engine/engine_impl.hpp"
#include "zero/core/log.hpp"

namespace zero {

// ---- GatherGuard

GatherGuard::GatherGuard(GatherGuard&& o) noexcept : engine_(o.engine_), unit_(o.unit_) {
  o.engine_ = nullptr;
}
GatherGuard& GatherGuard::operator=(GatherGuard&& o) noexcept {
  if (this != &o) {
    release();
    engine_ = o.engine_;
    unit_ = o.unit_;
    o.engine_ = nullptr;
  }
  return *this;
}
GatherGuard::~GatherGuard() {
  try {
    release();
  } catch (const std::exception& e) {
    ZERO_LOG(kError, "releasing unit ", unit_, " failed: ", e.what());
  }
}
void GatherGuard::release() {
  if (engine_ != nullptr) {
    Engine* e = engine_;
    engine_ = nullptr;
    e->release(unit_);
  }
}
View GatherGuard::param(int i) const {
  ZERO_CHECK(engine_ != nullptr, kInvalidArgument, "GatherGuard::param(", i,
             ") on an empty or released guard");
  return engine_->param_view(unit_, i);
}

// ---- Engine

namespace {

// hybrid_shard_size = "node": every rank must have read the same ranks per node, and the ranks
// of a node must be consecutive (the launcher's local rank is the position in the group), or
// the groups would not be nodes. Collective.
void check_node_groups(Communicator& world, int g) {
  const LaunchInfo info = detect_launch();
  const float mine[2] = {
      static_cast<float>(g),
      static_cast<float>(info.source == "none" ? world.rank() % g : info.local_rank)};
  std::vector<float> all(2 * static_cast<std::size_t>(world.size()));
  world.all_gather(mine, all.data(), 2, DType::kF32);
  for (int q = 0; q < world.size(); ++q) {
    const auto at = 2 * static_cast<std::size_t>(q);
    ZERO_CHECK(all[at] == static_cast<float>(g), kConfig,
               "config key 'zero_optimization.hybrid_shard_size' = \"node\": rank ", world.rank(),
               " has ", g, " ranks per node (", info.local_size_from, "), rank ", q, " has ",
               all[at], ": nodes of different sizes cannot be hybrid-sharding groups");
    ZERO_CHECK(all[at + 1] == static_cast<float>(q % g), kConfig,
               "config key 'zero_optimization.hybrid_shard_size' = \"node\": rank ", q,
               " is local rank ", all[at + 1], " of its node, not ", q % g,
               ": the ranks of a node are not consecutive (launch with by-slot mapping, e.g. "
               "mpirun --map-by slot), or give the number of ranks per group");
  }
}

}  // namespace

HybridGroups hybrid_groups(Communicator& world, const Config& config, detail::Ownership ownership) {
  const int n = world.size();
  const int g = detail::hybrid_shard_size(config, n);
  if (config.zero_optimization.hybrid_shard_size == ZeroOptimizationConfig::kHybridShardNode) {
    check_node_groups(world, g);
  }
  if (g == 0 || g == n) return {};  // detail::shard_width: all ranks
  ZERO_CHECK(ownership == detail::Ownership::kManaged, kConfig,
             "config key 'zero_optimization.hybrid_shard_size' = ", g,
             ": hybrid sharding needs the managed engine (attach mode shards over all ranks)");
  ZERO_CHECK(g > 0 && g < n && n % g == 0, kConfig,
             "config key 'zero_optimization.hybrid_shard_size' = ", g, " does not divide the ", n,
             " ranks into groups (it must be a divisor of the world size, or 0: all ranks)");
  const int group = world.rank() / static_cast<int>(g),
            in_group = world.rank() % static_cast<int>(g);
  // The shard group: ranks [group * g, group * g + g); the replica group: the ranks with the
  // same position in every group (they hold the same shard).
  HybridGroups out;
  out.shard = world.split(group, in_group);
  out.replicas = world.split(in_group, group);
  return out;
}

// The batch keys are checked (and the missing one derived, as DeepSpeed does) against the world
// size here, where it is first known; the engine keeps the resolved config.
Engine::Engine(Communicator& comm, const Config& config, EngineOptions options)
    : impl_(std::make_unique<Impl>(comm, config.resolve_batch(comm.size()), std::move(options),
                                   detail::Ownership::kManaged)) {}
Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
// The rooms wait for their collectives in flight as they are destroyed.
Engine::~Engine() = default;

UnitId Engine::add_unit(UnitSpec spec) {
  ZERO_CHECK(!impl_->laid_out(), kInvalidArgument, "add_unit('", spec.name,
             "'): units are already laid out (add every unit before the first use)");
  // Validate now so the error names the call that caused it.
  detail::make_layout({spec}, impl_->comm.size(), impl_->opts.alignment);
  detail::frozen_unit(spec);
  impl_->specs.push_back(std::move(spec));
  return static_cast<UnitId>(impl_->specs.size() - 1);
}

int Engine::stage() const noexcept { return impl_->policy.stage; }
DType Engine::param_dtype() const noexcept { return impl_->w; }
DType Engine::reduce_dtype() const noexcept { return impl_->r; }
int Engine::num_units() const noexcept { return static_cast<int>(impl_->specs.size()); }
const UnitSpec& Engine::unit(UnitId u) const {
  impl_->check_unit(u, "unit");
  return impl_->specs[static_cast<std::size_t>(u)];
}
std::size_t Engine::unit_padded_numel(UnitId u) const {
  impl_->check_unit(u, "unit_padded_numel");
  impl_->lay_out();
  return impl_->lay(u).padded;
}
std::size_t Engine::unit_shard_numel(UnitId u) const {
  impl_->check_unit(u, "unit_shard_numel");
  impl_->lay_out();
  return impl_->lay(u).shard;
}
double Engine::loss_scale() const noexcept { return impl_->scaler.scale(); }
std::int64_t Engine::micro_step() const noexcept {
  return impl_->laid_out() ? impl_->reducer->micro_steps() : 0;
}
MemoryTracker& Engine::tracker() noexcept { return *impl_->tracker; }
Engine::Buffers Engine::buffer_bytes() const {
  const Impl& m = *impl_;
  Buffers b;
  if (!m.laid_out()) return b;
  b.in_flight_grads = m.reducer->in_flight_grad_bytes();
  b.reduce_staging = m.reducer->staging_bytes() + m.gatherer->bucket_bytes();
  b.gathered_params = m.gatherer->gathered_bytes();
  return b;
}
MemoryReport Engine::memory_report() const { return impl_->tracker->report(); }
Communicator& Engine::comm() noexcept { return impl_->comm; }
Communicator& Engine::world() noexcept { return impl_->world; }
Communicator* Engine::replicas() noexcept { return impl_->groups.replicas.get(); }

void Engine::set_param(UnitId u, int param, const float* values, std::size_t count) {
  Impl& m = *impl_;
  m.check_unit(u, "set_param");
  m.lay_out();
  const auto& ul = m.lay(u);
  ZERO_CHECK(param >= 0 && param < static_cast<int>(ul.params.size()), kInvalidArgument,
             "set_param: unit '", m.name(u), "' has no parameter ", param);
  const auto& pl = ul.params[static_cast<std::size_t>(param)];
  ZERO_CHECK(count == pl.numel, kInvalidArgument, "set_param('", m.name(u), ".",
             m.specs[static_cast<std::size_t>(u)].params[static_cast<std::size_t>(param)].name,
             "'): ", count, " values for a parameter of ", pl.numel, " elements");
  ZERO_CHECK(values != nullptr || count == 0, kInvalidArgument, "set_param: null values");
  const detail::UnitPlacement& up = m.unit_place(u);
  // Working copy.
  if (up.kept_whole) {
    detail::from_host_f32(*m.dev, *m.tracker, values,
                          at(m.gatherer->unit_params(u), pl.offset, m.w), m.w, pl.numel);
  }
  // The stepped range (whole unit in stage 0, the shard otherwise): working shard (stage 3) and
  // the master, which starts as the working copy's value (as DeepSpeed makes it from the
  // 16-bit parameters).
  const std::size_t lo = std::max(pl.offset, up.step_begin);
  const std::size_t hi = std::min(pl.offset + pl.numel, up.step_begin + up.step_count);
  if (lo >= hi) return;
  const float* src = values + (lo - pl.offset);
  char* wdst = at(m.gatherer->step_params(u), lo - up.step_begin, m.w);
  const bool on_device = !m.place().shard_on_nvme(u);  // else in the window (host memory)
  if (!on_device) m.gatherer->load_shard(u);           // patched in the window, written back
  if (!up.kept_whole) {
    if (on_device) {
      detail::from_host_f32(*m.dev, *m.tracker, src, wdst, m.w, hi - lo);
    } else {
      convert(src, DType::kF32, wdst, m.w, hi - lo);
    }
  }
  if (!on_device) m.gatherer->store_shard(u);
  if (!up.frozen) m.optimizer->refresh_master(u, lo - up.step_begin, hi - up.step_begin);
}

void Engine::read_param(UnitId u, int param, float* out, std::size_t count) {
  Impl& m = *impl_;
  m.check_unit(u, "read_param");
  m.lay_out();
  ZERO_CHECK(param >= 0, kInvalidArgument, "read_param: negative parameter index");
  const auto& pl = m.lay(u).params.at(static_cast<std::size_t>(param));
  ZERO_CHECK(count == pl.numel, kInvalidArgument, "read_param('", m.name(u), "'): ", count,
             " values for a parameter of ", pl.numel, " elements");
  const GatherGuard g = read_unit(u);
  const View v = g.param(param);
  detail::to_host_f32(*m.dev, *m.tracker, v.data, m.w, /*on_device=*/true, out, count);
}

void Engine::set_gradient_clipping(double max_norm) {
  ZERO_CHECK(max_norm >= 0.0 && std::isfinite(max_norm), kInvalidArgument, "set_gradient_clipping(",
             max_norm, "): the max norm must be >= 0 and finite");
  impl_->cfg.gradient_clipping = max_norm;
}

GatherGuard Engine::read_unit(UnitId u) {
  Impl& m = *impl_;
  m.check_unit(u, "read_unit");
  m.lay_out();
  // Not a training gather: it neither enters the recorded order nor starts prefetches.
  m.gatherer->acquire(u);
  return GatherGuard(this, u);
}

GatherGuard Engine::gather(UnitId u) {
  Impl& m = *impl_;
  m.check_unit(u, "gather");
  m.lay_out();
  m.open_window();
  detail::PhaseTimer phase(m.window.gather_s, m.tracer, TraceLane::kEngine, "gather", u);
  m.comm.set_phase("gather", u);  // the flight recorder
  m.gatherer->gather(u);
  return GatherGuard(this, u);
}

void Engine::release(UnitId u) { impl_->gatherer->release(u); }

View Engine::param_view(UnitId u, int i) const {
  const Impl& m = *impl_;
  m.check_unit(u, "param");
  const auto& ul = m.lay(u);
  ZERO_CHECK(i >= 0 && i < static_cast<int>(ul.params.size()), kInvalidArgument, "unit '",
             m.name(u), "' has no parameter ", i, " (it has ", ul.params.size(), ")");
  char* base = m.gatherer->unit_params(u);
  ZERO_CHECK(base != nullptr, kInvalidArgument, "unit '", m.name(u),
             "' is not gathered: its parameters are sharded in stage 3; hold the GatherGuard "
             "from gather() while using them");
  const auto& pl = ul.params[static_cast<std::size_t>(i)];
  return View{at(base, pl.offset, m.w), pl.numel, m.w, m.dev->device()};
}

View Engine::grad(UnitId u, int param) {
  Impl& m = *impl_;
  m.check_unit(u, "grad");
  m.lay_out();
  const auto& ul = m.lay(u);
  ZERO_CHECK(param >= 0 && param < static_cast<int>(ul.params.size()), kInvalidArgument,
             "grad: unit '", m.name(u), "' has no parameter ", param);
  ZERO_CHECK(!m.reducer->ready(u), kInvalidArgument, "grad('", m.name(u),
             "'): grads_ready was already called for this unit in this micro-step");
  ZERO_CHECK(
      !m.unit_place(u).frozen, kInvalidArgument, "grad('", m.name(u), ".",
      m.specs[static_cast<std::size_t>(u)].params[static_cast<std::size_t>(param)].name,
      "'): the parameter is frozen (ParamSpec::trainable = false): it has no gradient "
      "buffer; skip its gradient (grads_ready on a frozen unit is allowed and does nothing)");
  const auto& pl = ul.params[static_cast<std::size_t>(param)];
  return View{at(m.reducer->unit_grads(u), pl.offset, m.w), pl.numel, m.w, m.dev->device()};
}

void Engine::grads_ready(UnitId u) {
  Impl& m = *impl_;
  m.check_unit(u, "grads_ready");
  m.lay_out();
  ZERO_CHECK(!m.reducer->ready(u), kInvalidArgument, "grads_ready('", m.name(u),
             "') called twice in one micro-step");
  m.open_window();
  detail::PhaseTimer phase(m.window.grads_ready_s, m.tracer, TraceLane::kEngine, "grads_ready", u);
  m.comm.set_phase("grads_ready", u);  // the flight recorder
  m.reducer->set_final_micro_step(m.final_micro_step());
  m.reducer->grads_ready(u);
}

StepResult Engine::step() {
  Impl& m = *impl_;
  m.lay_out();
  m.open_window();
  StepResult res;
  {
    detail::PhaseTimer phase(m.window.step_s, m.tracer, TraceLane::kEngine, "step");
    m.comm.set_phase("step");
    res = step_impl();
  }
  res.metrics = m.close_window(res.boundary);
  return res;
}

detail::StepOptions Engine::Impl::step_options(double coef) const {
  detail::StepOptions o;
  o.step = steps + 1;
  o.grad_scale = scaler.grad_scale(coef, static_cast<double>(cfg.gradient_accumulation_steps));
  o.groups = group_params;
  // OneCycle with cycle_momentum sets the betas of the same scheduler step as the lr, on every
  // group: beta1 its momentum, beta2 0.99 (DeepSpeed's lr_schedules.py OneCycle: (momentum,
  // 0.99)). The config reader disables it for optimizers without betas, as DeepSpeed does.
  const std::optional<double> mom = schedule.momentum(steps - 1);
  for (OptimizerParams& g : o.groups) {
    g.lr = schedule.lr(steps - 1, g.lr);
    if (mom && (g.type == OptimizerType::kAdam || g.type == OptimizerType::kAdamW ||
                g.type == OptimizerType::kLion)) {
      g.beta1 = *mom;
      g.beta2 = 0.99;
    }
  }
  return o;
}

void Engine::Impl::end_micro_step() {
  if (ownership == detail::Ownership::kManaged) {
    for (UnitId u = 0; u < static_cast<int>(specs.size()); ++u) {
      ZERO_CHECK(reducer->ready(u) || unit_place(u).frozen, kInvalidArgument, "step(): unit '",
                 name(u), "' has no gradients this micro-step (call grads_ready for every unit)");
      // A gathered stage-3 copy still held by the trainer would miss the update.
      ZERO_CHECK(gatherer->holders(u) == 0 || unit_place(u).kept_whole, kInvalidArgument,
                 "step(): unit '", name(u),
                 "' is still gathered (release its GatherGuard before step())");
    }
  } else {
    reducer->take_trainer_grads();
  }
  reducer->set_final_micro_step(final_micro_step());  // reductions still in flight land here
  reducer->end_micro_step();
  gatherer->end_micro_step();
}

detail::GradTotals Engine::Impl::reduce_window() {
  detail::PhaseTimer phase(window.reduce_s, tracer, TraceLane::kEngine, "reduce");
  reducer->reduce_at_boundary();
  const detail::GradTotals totals = reducer->totals();
  reducer->end_window();
  return totals;
}

void Engine::Impl::skip_step(StepResult& res) {
  // Every rank saw every rank's flag: all skip together. No state is touched (the step during
  // backward is dropped).
  window.speculated_units += optimizer->settle(/*commit=*/false).units;
  scaler.update(/*overflow=*/true);
  ++skipped;
  res.applied = false;
  res.grad_norm = std::numeric_limits<double>::infinity();
  res.loss_scale = scaler.scale();
  res.skipped = skipped;
  if (!cfg.fp16.enabled) {
    ZERO_LOG(kWarn, "non-finite gradients at step ", steps + 1, ": step skipped");
  }
}

void Engine::Impl::apply_step(StepResult& res, double coef) {
  const detail::StepOptions so = step_options(coef);
  {
    detail::PhaseTimer phase(window.optimizer_s, tracer, TraceLane::kEngine, "optimizer");
    // The step during backward ran with coefficient 1: its results are this step's exactly
    // when clipping does not engage; otherwise its units are stepped again from their state.
    const detail::Settled spec = optimizer->settle(/*commit=*/coef == 1.0);
    window.speculated_units += spec.units;
    if (coef != 1.0) window.redone_units += spec.units;
    optimizer->step(so.groups, so.step, so.grad_scale);
  }
  {
    detail::PhaseTimer phase(window.param_gather_s, tracer, TraceLane::kEngine, "gather updated");
    gatherer->gather_updated();
  }
  ++steps;
  scaler.update(/*overflow=*/false);
  res.applied = true;
  res.steps = steps;
  res.loss_scale = scaler.scale();
}

StepResult Engine::step_impl() {
  Impl& m = *impl_;
  StepResult res;
  m.end_micro_step();
  res.loss_scale = m.scaler.scale();
  res.steps = m.steps;
  res.skipped = m.skipped;
  const std::int64_t accumulation = m.cfg.gradient_accumulation_steps;
  if (m.reducer->micro_steps() < accumulation) return res;
  res.boundary = true;
  const detail::GradTotals totals = m.reduce_window();
  // DeepSpeed's accumulation: the step's gradient is the mean over the micro-steps (the ranks
  // were averaged by the reductions), so the norm and the update divide the sum by A.
  const double scale = m.scaler.scale();
  const auto divisor = static_cast<double>(accumulation);
  res.grad_norm = std::sqrt(totals.sum_squares) / (scale * divisor);
  // DeepSpeed steps its scheduler after each optimizer step: update k (1-based) runs with the
  // lr after the scheduler's (k-2)-th step, lr(-1) being what its constructor set.
  res.lr = m.schedule.lr(m.steps - 1);
  if (totals.non_finite) {
    m.skip_step(res);
    return res;
  }
  double coef = 1.0;
  if (m.cfg.gradient_clipping > 0.0) {
    // DeepSpeed / PyTorch: clip_coef = max_norm / (norm + 1e-6), applied when < 1.
    coef = std::min(1.0, m.cfg.gradient_clipping / (res.grad_norm + 1e-6));
  }
  res.clip_coef = coef;
  m.apply_step(res, coef);
  return res;
}

}  // namespace zero
