// The ZeRO engine: the trainer-facing hooks and step(). What lives where is the placement's
// (zero/placement.hpp); the rooms own the state: the gradient reducer (zero/grad_reducer.hpp),
// the parameter gatherer (zero/param_gatherer.hpp) and, with optimizer offload, the offloaded
// optimizer (offload/offloaded_optimizer.hpp). Without offload the engine itself owns the
// device optimizer state (the fp32 master and the moments) and steps it through DeviceOps.
#include "zero/engine.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <utility>

#include "offload/offloaded_optimizer.hpp"
#include "zero/error.hpp"
#include "zero/grad_reducer.hpp"
#include "zero/host_staging.hpp"
#include "zero/log.hpp"
#include "zero/loss_scaler.hpp"
#include "zero/lr_schedule.hpp"
#include "zero/optimizer.hpp"
#include "zero/param_gatherer.hpp"
#include "zero/placement.hpp"

namespace zero {

using detail::at;

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

// ---- Engine::Impl

struct Engine::Impl final : offload::ShardAccess {
  Communicator& comm;
  Config cfg;
  EngineOptions opts;
  detail::Ownership ownership;
  detail::StagePolicy policy;
  DType w = DType::kF32;  // working (param and gradient) dtype
  DType r = DType::kF32;  // reduce / gradient accumulation dtype
  std::unique_ptr<MemoryTracker> own_tracker;
  MemoryTracker* tracker = nullptr;
  // The device (parameters, gradients, the optimizer without offload) and the host optimizer
  // (the offloaded state, the gradient partition on the host).
  std::shared_ptr<DeviceOps> dev;
  CpuOptimizer host_optimizer;
  OptimizerParams oparams;
  LossScaler scaler;
  LrSchedule schedule;
  // Attach mode: the trainer's buffers (one unit over the whole flat range).
  char* trainer_params = nullptr;
  char* trainer_grads = nullptr;
  std::size_t trainer_capacity = 0;

  std::vector<UnitSpec> specs;
  detail::PlacementInput input;  // validated at construction; the units join at lay_out
  std::optional<detail::Placement> placement;
  // Without optimizer offload: the fp32 master (16-bit training) and the optimizer state on the
  // device, over each unit's stepped range.
  Buffer master;
  std::vector<Buffer> state;
  std::unique_ptr<detail::GradReducer> reducer;
  std::unique_ptr<detail::ParamGatherer> gatherer;
  std::unique_ptr<offload::OffloadedOptimizer> offloaded;
  std::int64_t steps = 0;
  std::int64_t skipped = 0;

  Impl(Communicator& c, const Config& config, EngineOptions o, detail::Ownership own)
      : comm(c),
        cfg(config),
        opts(std::move(o)),
        ownership(own),
        policy(detail::StagePolicy::of(config.zero_optimization.stage, own)),
        w(working_dtype(config)),
        r(reduce_dtype_of(config)),
        host_optimizer(CpuExecOptions{opts.isa, opts.optimizer_threads, 0}),
        oparams(OptimizerParams::from_config(config.optimizer)),
        scaler(LossScaler::from_config(config.fp16)),
        schedule(LrSchedule::from_config(config.scheduler, config.optimizer.lr)) {
    if (opts.tracker == nullptr) {
      own_tracker = std::make_unique<MemoryTracker>(c.rank());
      tracker = own_tracker.get();
    } else {
      tracker = opts.tracker;
    }
    if (!opts.poison_released.has_value()) {
#ifdef NDEBUG
      opts.poison_released = false;
#else
      opts.poison_released = true;
#endif
    }
    dev = opts.device_ops != nullptr
              ? opts.device_ops
              : make_device_ops(opts.device, {CpuExecOptions{opts.isa, opts.optimizer_threads, 0},
                                              opts.cuda_stream});
    const bool nccl = comm.backend() == "nccl";
    ZERO_CHECK(nccl == dev->device().is_cuda(), kConfig, "the engine runs on ",
               dev->device().to_string(), " but the communicator is '", comm.backend(), "' (",
               dev->device().is_cuda() ? "a CUDA device needs comm_backend 'nccl'"
                                       : "NCCL needs EngineOptions::device = Device::cuda(k)",
               ")");
    input = detail::placement_input(cfg, {}, c.size(), c.rank(), opts.alignment, own,
                                    dev->host_accessible());
  }

  bool laid_out() const { return placement.has_value(); }
  const detail::Placement& place() const { return *placement; }
  const detail::UnitLayout& lay(UnitId u) const { return placement->lay(u); }
  const detail::UnitPlacement& unit_place(UnitId u) const { return placement->unit(u); }

  void check_unit(UnitId u, const char* what) const {
    ZERO_CHECK(u >= 0 && u < static_cast<int>(specs.size()), kInvalidArgument, what,
               ": unknown unit id ", u, " (", specs.size(), " units registered)");
  }
  const std::string& name(UnitId u) const { return specs[static_cast<std::size_t>(u)].name; }

  // ---- the placement and the rooms, on first use
  void lay_out() {
    if (laid_out()) return;
    ZERO_CHECK(!specs.empty(), kInvalidArgument,
               "the engine has no units: declare them with add_unit() first");
    detail::PlacementInput in = input;
    in.units = specs;
    placement.emplace(detail::make_placement(std::move(in)));
    const detail::Placement& p = *placement;
    if (ownership == detail::Ownership::kAttached) {
      const std::size_t numel = specs[0].params[0].numel(), need = p.layout.total_padded;
      ZERO_CHECK(trainer_capacity >= need, kInvalidArgument, "attach: the buffers hold ",
                 trainer_capacity, " elements; ", numel, " parameters at ", p.in.world_size,
                 " ranks need ", need, " (padded to a multiple of ", p.in.world_size, " x ",
                 opts.alignment, "): allocate zero::attach_capacity(", numel, ", ", p.in.world_size,
                 ") elements");
      // The padding must be zero (it is stepped and gathered like the rest).
      dev->fill(trainer_params + numel * dtype_size(w), 0, (need - numel) * dtype_size(w));
    }
    gatherer = std::make_unique<detail::ParamGatherer>(p, cfg, comm, *dev, *tracker,
                                                       *opts.poison_released, trainer_params);
    reducer = std::make_unique<detail::GradReducer>(p, comm, *dev, host_optimizer, *tracker,
                                                    trainer_grads);
    if (p.offloaded) {
      offloaded = std::make_unique<offload::OffloadedOptimizer>(p, cfg, *dev, host_optimizer,
                                                                oparams, *tracker, *this);
      return;
    }
    master = detail::allocate(p.master, *dev, *tracker, {.zero = true});
    for (int k = 0; k < oparams.num_states(); ++k) {
      state.push_back(detail::allocate(p.state, *dev, *tracker));
    }
    // Zero the state in the partitioning the step uses (first touch lands here).
    for (UnitId u = 0; u < static_cast<int>(specs.size()); ++u) {
      dev->init_state(oparams, shard_ref(u));
    }
  }

  // ---- the device optimizer's shards (no offload)
  float* master_ptr(UnitId u) {
    if (!place().separate_master) return reinterpret_cast<float*>(gatherer->step_params(u));
    return master.as<float>() + unit_place(u).optim_offset;
  }
  char* state_ptr(UnitId u, int k) {
    return at(state[static_cast<std::size_t>(k)].data(), unit_place(u).optim_offset,
              oparams.state_dtype());
  }
  ShardRef shard_ref(UnitId u) {
    ShardRef s;
    s.count = unit_place(u).step_count;
    s.master = master_ptr(u);
    s.grad = reducer->step_grads(u);
    s.grad_dtype = r;
    for (int k = 0; k < oparams.num_states(); ++k) s.state[k] = state_ptr(u, k);
    if (w != DType::kF32) {
      s.param_copy = gatherer->step_params(u);
      s.param_copy_dtype = w;
    }
    return s;
  }

  // ---- offload::ShardAccess: what the offloaded optimizer reads and writes
  const char* grads(UnitId u) override { return reducer->step_grads(u); }
  char* params(UnitId u) override { return gatherer->step_params(u); }
  bool params_on_nvme(UnitId u) override { return place().shard_on_nvme(u); }
  void load_params(UnitId u) override { gatherer->load_shard(u); }
  void store_params(UnitId u) override { gatherer->store_shard(u); }
};

// ---- Engine

Engine::Engine(Communicator& comm, const Config& config, EngineOptions options)
    : impl_(std::make_unique<Impl>(comm, config, std::move(options), detail::Ownership::kManaged)) {
}
Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
// The rooms wait for their collectives in flight as they are destroyed.
Engine::~Engine() = default;

UnitId Engine::add_unit(UnitSpec spec) {
  ZERO_CHECK(!impl_->laid_out(), kInvalidArgument, "add_unit('", spec.name,
             "'): units are already laid out (add every unit before the first use)");
  // Validate now so the error names the call that caused it.
  detail::make_layout({spec}, impl_->comm.size(), impl_->opts.alignment);
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
  if (m.offloaded) {
    m.offloaded->refresh_master(u, lo - up.step_begin, hi - up.step_begin);
  } else if (m.place().separate_master) {
    m.dev->convert(wdst, m.w, m.master_ptr(u) + (lo - up.step_begin), DType::kF32, hi - lo);
  }
}

void Engine::read_param(UnitId u, int param, float* out, std::size_t count) {
  Impl& m = *impl_;
  m.check_unit(u, "read_param");
  m.lay_out();
  ZERO_CHECK(param >= 0, kInvalidArgument, "read_param: negative parameter index");
  const auto& pl = m.lay(u).params.at(static_cast<std::size_t>(param));
  ZERO_CHECK(count == pl.numel, kInvalidArgument, "read_param('", m.name(u), "'): ", count,
             " values for a parameter of ", pl.numel, " elements");
  // Not a training gather: it neither enters the recorded order nor starts prefetches.
  m.gatherer->acquire(u);
  GatherGuard g(this, u);
  const View v = g.param(param);
  detail::to_host_f32(*m.dev, *m.tracker, v.data, m.w, /*on_device=*/true, out, count);
}

GatherGuard Engine::gather(UnitId u) {
  Impl& m = *impl_;
  m.check_unit(u, "gather");
  m.lay_out();
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
  const auto& pl = ul.params[static_cast<std::size_t>(param)];
  return View{at(m.reducer->unit_grads(u), pl.offset, m.w), pl.numel, m.w, m.dev->device()};
}

void Engine::grads_ready(UnitId u) {
  Impl& m = *impl_;
  m.check_unit(u, "grads_ready");
  m.lay_out();
  ZERO_CHECK(!m.reducer->ready(u), kInvalidArgument, "grads_ready('", m.name(u),
             "') called twice in one micro-step");
  m.reducer->grads_ready(u);
}

StepResult Engine::step() {
  Impl& m = *impl_;
  m.lay_out();
  StepResult res;
  if (m.ownership == detail::Ownership::kManaged) {
    for (UnitId u = 0; u < static_cast<int>(m.specs.size()); ++u) {
      ZERO_CHECK(m.reducer->ready(u), kInvalidArgument, "step(): unit '", m.name(u),
                 "' has no gradients this micro-step (call grads_ready for every unit)");
      // A gathered stage-3 copy still held by the trainer would miss the update.
      ZERO_CHECK(m.gatherer->holders(u) == 0 || m.unit_place(u).kept_whole, kInvalidArgument,
                 "step(): unit '", m.name(u),
                 "' is still gathered (release its GatherGuard before step())");
    }
  } else {
    m.reducer->take_trainer_grads();
  }
  m.reducer->end_micro_step();
  m.gatherer->end_micro_step();
  res.loss_scale = m.scaler.scale();
  res.steps = m.steps;
  res.skipped = m.skipped;
  const std::int64_t accumulation = m.cfg.gradient_accumulation_steps;
  if (m.reducer->micro_steps() < accumulation) return res;
  res.boundary = true;

  m.reducer->reduce_at_boundary();
  const detail::GradTotals totals = m.reducer->totals();
  m.reducer->end_window();
  // DeepSpeed's accumulation: the step's gradient is the mean over the micro-steps (the ranks
  // were averaged by the reductions), so the norm and the update divide the sum by A.
  const double scale = m.scaler.scale();
  const auto divisor = static_cast<double>(accumulation);
  res.grad_norm = std::sqrt(totals.sum_squares) / (scale * divisor);
  // DeepSpeed steps its scheduler after each optimizer step: update k (1-based) runs with the
  // lr after the scheduler's (k-2)-th step, lr(-1) being what its constructor set.
  res.lr = m.schedule.lr(m.steps - 1);
  if (totals.non_finite) {
    // Every rank saw every rank's flag: all skip together. No state is touched.
    m.scaler.update(/*overflow=*/true);
    ++m.skipped;
    res.applied = false;
    res.grad_norm = std::numeric_limits<double>::infinity();
    res.loss_scale = m.scaler.scale();
    res.skipped = m.skipped;
    if (!m.cfg.fp16.enabled) {
      ZERO_LOG(kWarn, "non-finite gradients at step ", m.steps + 1, ": step skipped");
    }
    return res;
  }
  double coef = 1.0;
  if (m.cfg.gradient_clipping > 0.0) {
    // DeepSpeed / PyTorch: clip_coef = max_norm / (norm + 1e-6), applied when < 1.
    coef = std::min(1.0, m.cfg.gradient_clipping / (res.grad_norm + 1e-6));
  }
  res.clip_coef = coef;
  const float grad_scale = m.scaler.grad_scale(coef, divisor);
  OptimizerParams p = m.oparams;
  p.lr = res.lr;
  if (m.offloaded) {
    m.offloaded->step(p, m.steps + 1, grad_scale);
  } else {
    std::vector<ShardRef> refs;
    for (UnitId u = 0; u < static_cast<int>(m.specs.size()); ++u) refs.push_back(m.shard_ref(u));
    m.dev->optimizer_step(p, refs.data(), refs.size(), m.steps + 1, grad_scale);
  }
  m.gatherer->gather_updated();
  ++m.steps;
  m.scaler.update(/*overflow=*/false);
  res.applied = true;
  res.steps = m.steps;
  res.loss_scale = m.scaler.scale();
  return res;
}

DType working_dtype(const Config& c) {
  return c.fp16.enabled ? DType::kF16 : (c.bf16.enabled ? DType::kBF16 : DType::kF32);
}

DType reduce_dtype_of(const Config& c) {
  return c.communication_data_type.empty() ? DType::kF32 : parse_dtype(c.communication_data_type);
}

std::size_t attach_capacity(std::size_t numel, int world_size, std::size_t alignment) {
  ZERO_CHECK(world_size >= 1 && alignment >= 1, kInvalidArgument,
             "attach_capacity: world size and alignment must be >= 1");
  const std::size_t m = static_cast<std::size_t>(world_size) * alignment;
  return (numel + m - 1) / m * m;
}

std::unique_ptr<Engine> Engine::attach(Communicator& comm, const Config& config, void* params,
                                       void* grads, std::size_t numel, std::size_t capacity,
                                       DType dtype, EngineOptions options) {
  ZERO_CHECK(!detail::StagePolicy::of(config.zero_optimization.stage).shard_params, kConfig,
             "config key 'zero_optimization.stage' = ", config.zero_optimization.stage,
             ": attach mode runs stages 0-2; stage 3 needs the managed engine (the engine must "
             "own the parameters to shard them)");
  ZERO_CHECK(params != nullptr && grads != nullptr && numel > 0, kInvalidArgument,
             "attach: null buffer or zero parameters");
  auto impl =
      std::make_unique<Impl>(comm, config, std::move(options), detail::Ownership::kAttached);
  ZERO_CHECK(dtype == impl->w, kConfig, "attach: the trainer's buffers are ", to_string(dtype),
             " but the config trains in ", to_string(impl->w),
             " (keys 'bf16.enabled' / 'fp16.enabled')");
  impl->trainer_params = static_cast<char*>(params);
  impl->trainer_grads = static_cast<char*>(grads);
  impl->trainer_capacity = capacity;
  impl->specs.push_back({"attached", {{"flat", {static_cast<std::int64_t>(numel)}}}});
  auto e = std::unique_ptr<Engine>(new Engine(std::move(impl)));
  Impl& m = *e->impl_;
  m.lay_out();
  // Data-parallel start: every rank takes rank 0's parameters (as DDP and DeepSpeed do).
  comm.broadcast(m.trainer_params, m.trainer_params, m.place().layout.total_padded, m.w, 0);
  const std::size_t count = m.unit_place(0).step_count;
  if (m.offloaded) {
    m.offloaded->refresh_master(0, 0, count);
  } else if (m.place().separate_master) {
    m.dev->convert(m.gatherer->step_params(0), m.w, m.master_ptr(0), DType::kF32, count);
  }
  return e;
}

std::vector<ParamShard> Engine::param_shards() const {
  const Impl& m = *impl_;
  ZERO_CHECK(m.laid_out(), kInvalidArgument, "param_shards(): the engine is not laid out yet");
  std::vector<ParamShard> out;
  for (UnitId u = 0; u < static_cast<int>(m.specs.size()); ++u) {
    const auto& ul = m.lay(u);
    const detail::UnitPlacement& up = m.unit_place(u);
    const std::size_t b = up.step_begin, e = b + up.step_count;
    for (std::size_t i = 0; i < ul.params.size(); ++i) {
      const auto& pl = ul.params[i];
      const std::size_t lo = std::max(b, pl.offset), hi = std::min(e, pl.offset + pl.numel);
      if (lo >= hi) continue;
      out.push_back({u, static_cast<int>(i), lo - pl.offset, hi - pl.offset, lo - b});
    }
  }
  return out;
}

const float* Engine::master_shard(UnitId u) const {
  Impl& m = const_cast<Impl&>(*impl_);
  m.check_unit(u, "master_shard");
  m.lay_out();
  return m.offloaded ? m.offloaded->master(u) : m.master_ptr(u);
}

const void* Engine::state_shard(UnitId u, int k) const {
  Impl& m = const_cast<Impl&>(*impl_);
  m.check_unit(u, "state_shard");
  m.lay_out();
  ZERO_CHECK(!m.place().nvme_optimizer, kInvalidArgument,
             "state_shard(): the optimizer state lives in NVMe files (offload_optimizer.device = "
             "nvme); use copy_state_shard()");
  if (k < 0 || k >= m.oparams.num_states()) return nullptr;
  return m.offloaded ? m.offloaded->state(u, k) : m.state_ptr(u, k);
}

void Engine::copy_master_shard(UnitId u, float* out) {
  Impl& m = *impl_;
  m.check_unit(u, "copy_master_shard");
  m.lay_out();
  if (m.offloaded) {
    m.offloaded->copy_master(u, out);
    return;
  }
  m.dev->copy(out, m.master_ptr(u), m.unit_place(u).step_count * 4);
  m.dev->synchronize();
}

void Engine::copy_state_shard(UnitId u, int k, void* out) {
  Impl& m = *impl_;
  m.check_unit(u, "copy_state_shard");
  ZERO_CHECK(k >= 0 && k < m.oparams.num_states(), kInvalidArgument, "copy_state_shard: the ",
             m.cfg.optimizer.type, " optimizer has ", m.oparams.num_states(), " states, not ",
             k + 1);
  m.lay_out();
  if (m.offloaded) {
    m.offloaded->copy_state(u, k, out);
    return;
  }
  m.dev->copy(out, m.state_ptr(u, k),
              m.unit_place(u).step_count * dtype_size(m.oparams.state_dtype()));
  m.dev->synchronize();
}

}  // namespace zero
