// engine/engine_impl.hpp — the engine's private state (Engine::Impl), shared by the engine's
// source files: engine.cpp (the trainer-facing hooks and step()), engine_state.cpp (the shards
// and training state a checkpoint saves and loads) and engine_observe.cpp (StepMetrics, the
// timeline, the memory report). The state itself lives in the rooms it holds: the gradient
// reducer, the parameter gatherer and the shard optimizer (engine/shard_optimizer.hpp).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/observe.hpp"
#include "device/host_staging.hpp"
#include "engine/grad_reducer.hpp"
#include "engine/param_gatherer.hpp"
#include "engine/placement.hpp"
#include "engine/shard_optimizer.hpp"
#include "zero/core/error.hpp"
#include "zero/engine/engine.hpp"
#include "zero/optim/loss_scaler.hpp"
#include "zero/optim/lr_schedule.hpp"
#include "zero/optim/optimizer.hpp"

namespace zero {

using detail::at;

// Hybrid sharding (zero_optimization.hybrid_shard_size = G): the group of G consecutive ranks the
// engine shards over, and the ranks holding the same shard in the other groups; both null when
// the engine shards over all of `world`. Collective (the splits run on every rank). Throws
// kConfig when G does not divide the world or the engine is attached.
struct HybridGroups {
  std::unique_ptr<Communicator> shard, replicas;
};
HybridGroups hybrid_groups(Communicator& world, const Config& config, detail::Ownership ownership);

struct Engine::Impl final : detail::ShardAccess {
  Communicator& world;  // the caller's communicator
  HybridGroups groups;  // hybrid sharding only
  Communicator& comm;   // what the engine shards over: its group, else `world`
  Config cfg;
  EngineOptions opts;
  detail::Ownership ownership;
  detail::StagePolicy policy;
  DType w = DType::kF32;  // working (param and gradient) dtype
  DType r = DType::kF32;  // reduce / gradient accumulation dtype
  std::unique_ptr<MemoryTracker> own_tracker;
  MemoryTracker* tracker = nullptr;
  // The device (parameters, gradients, the optimizer without offload) and the host optimizer
  // (the offloaded optimizer's step, the gradient partition on the host).
  std::shared_ptr<DeviceOps> dev;
  CpuOptimizer host_optimizer;
  OptimizerParams oparams;
  // Every parameter group's options, group 0 = oparams (EngineOptions::param_groups).
  std::vector<OptimizerParams> group_params;
  LossScaler scaler;
  LrSchedule schedule;
  // Attach mode: the trainer's buffers (one unit over the whole flat range).
  char* trainer_params = nullptr;
  char* trainer_grads = nullptr;
  std::size_t trainer_capacity = 0;
  std::size_t trainer_numel = 0;

  std::vector<UnitSpec> specs;
  detail::PlacementInput input;  // validated at construction; the units join at lay_out
  std::optional<detail::Placement> placement;
  // The rooms, made by lay_out(): the gradients, the parameters, the optimizer state (on the
  // device or offloaded, as the placement says).
  std::unique_ptr<detail::GradReducer> reducer;
  std::unique_ptr<detail::ParamGatherer> gatherer;
  std::unique_ptr<detail::ShardOptimizer> optimizer;
  std::int64_t steps = 0;
  std::int64_t skipped = 0;

  // What the run looks like from here (StepMetrics, the timeline): the tracer (the caller's or
  // our own; null when off), the offload byte counters, the window being measured.
  std::unique_ptr<Tracer> own_tracer;
  Tracer* tracer = nullptr;
  detail::IoCounters io;
  StepMetrics window;
  bool window_open = false;
  TraceClock::time_point window_start;
  CommStats comm_at_start, replicas_at_start;
  std::uint64_t io_at_start[4] = {};

  Impl(Communicator& c, const Config& config, EngineOptions o, detail::Ownership own)
      : world(c),
        groups(hybrid_groups(c, config, own)),
        comm(groups.shard != nullptr ? *groups.shard : c),
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
    tracer = opts.tracer;
    if (tracer == nullptr && cfg.trace.enabled) {
      own_tracer = std::make_unique<Tracer>(c.rank(), static_cast<std::size_t>(cfg.trace.capacity));
      tracer = own_tracer.get();
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
    input = detail::placement_input(cfg, {}, comm.size(), comm.rank(), opts.alignment, own,
                                    dev->host_accessible(),
                                    groups.replicas != nullptr ? groups.replicas->size() : 1);
    make_groups();
    // Last: a constructor that throws runs no destructor to take the tracer back.
    if (tracer != nullptr) {
      comm.set_tracer(tracer);
      if (groups.replicas != nullptr) groups.replicas->set_tracer(tracer);
    }
  }

  // The rooms wait for their collectives in flight as they go; only then may the communicator
  // forget the tracer (its workers record into it until the last collective completes).
  ~Impl() {
    optimizer.reset();
    gatherer.reset();
    reducer.reset();
    if (tracer != nullptr && comm.tracer() == tracer) comm.set_tracer(nullptr);
    if (groups.replicas != nullptr) groups.replicas->set_tracer(nullptr);
  }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  // Resolves EngineOptions::param_groups over the optimizer's options (names unique), and
  // attach mode's ranges into the placement input.
  void make_groups();
  // EngineOptions::check_fit: the planned bytes against the budget (engine/fit.cpp's rule,
  // engine/param_groups.cpp's neighbour: engine_fit.cpp).
  void check_fit(const detail::Placement& planned) const;
  // Attach mode: the units tiling the trainer's buffer of `numel` elements (engine/attach.cpp),
  // and attach_groups' spans cut per unit.
  void attach_units(std::size_t numel);
  // Parameters in group 0 that match a config rule join its group (the first that matches).
  void assign_rule_groups(std::vector<UnitSpec>& units) const;
  int first_rule_group = 1;

  detail::Observer observer() { return {tracer, &io}; }
  // The options of the next optimizer step (its number, every group's lr and betas from the
  // schedule) with clip coefficient `coef`: what step() runs with, and with coef 1 what the
  // step during backward (offload_optimizer.overlap_step) speculates with.
  detail::StepOptions step_options(double coef) const;
  // step()'s steps (engine.cpp): the micro-step's end (every unit's gradients in, none still
  // gathered; attach mode takes the trainer's), the window's reduction (its gradient totals), and
  // at the boundary the skipped step (non-finite gradients) or the applied one (clip coefficient
  // `coef`), each filling its part of `res`.
  void end_micro_step();
  detail::GradTotals reduce_window();
  void skip_step(StepResult& res);
  void apply_step(StepResult& res, double coef);
  // overlap_step: whether the micro-step under way ends the accumulation window (its reduced
  // shards are final for the step).
  bool final_micro_step() const {
    return cfg.zero_optimization.offload_optimizer.overlap_step &&
           reducer->micro_steps() + 1 >= cfg.gradient_accumulation_steps;
  }
  // The measured window (StepMetrics): opened by the first hook after a boundary, closed by
  // the boundary's step().
  void open_window();
  StepMetrics close_window(bool boundary);

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
    assign_rule_groups(in.units);
    detail::Placement planned = detail::make_placement(std::move(in));
    if (opts.check_fit) check_fit(planned);  // before the engine holds or allocates anything
    placement.emplace(std::move(planned));
    const detail::Placement& p = *placement;
    if (ownership == detail::Ownership::kAttached) {
      const std::size_t numel = trainer_numel, need = p.layout.total_padded;
      // int8 moments pad to their quantization block (a shard starts on one).
      const std::size_t multiple = std::max(opts.alignment, state_block(p.in.state_dtype));
      ZERO_CHECK(trainer_capacity >= need, kInvalidArgument, "attach: the buffers hold ",
                 trainer_capacity, " elements; ", numel, " parameters at ", p.in.world_size,
                 " ranks need ", need, " (padded to a multiple of ", p.in.world_size, " x ",
                 multiple, "): allocate zero::attach_capacity(", numel, ", ", p.in.world_size,
                 multiple != 32 ? ", " + std::to_string(multiple) : std::string(), ") elements");
      // The padding must be zero (it is stepped and gathered like the rest).
      dev->fill(trainer_params + numel * dtype_size(w), 0, (need - numel) * dtype_size(w));
    }
    try {
      gatherer = std::make_unique<detail::ParamGatherer>(
          p, comm, *dev, *tracker, *opts.poison_released, trainer_params, observer());
      reducer = std::make_unique<detail::GradReducer>(
          p, comm, *dev, host_optimizer, *tracker, trainer_grads, observer(), groups.replicas.get(),
          /*all_reduce=*/!cfg.zero_optimization.reduce_scatter);
      optimizer = detail::make_shard_optimizer(p, *dev, host_optimizer, oparams, *tracker, *this,
                                               observer());
      if (p.in.overlap_step) {
        reducer->on_final_host_grads(
            [this](UnitId u) { optimizer->speculate(u, step_options(1.0)); });
      }
    } catch (...) {
      // A room that could not be made (an allocation past the budget, a swap file that cannot
      // be written): the engine is as before lay-out, so a later call fails the same way again
      // instead of reaching a room that is not there.
      optimizer.reset();
      reducer.reset();
      gatherer.reset();
      placement.reset();
      throw;
    }
  }

  // ---- detail::ShardAccess: what the optimizer reads and writes of the other rooms
  const char* grads(UnitId u) override { return reducer->step_grads(u); }
  char* params(UnitId u) override { return gatherer->step_params(u); }
  bool params_on_nvme(UnitId u) override { return place().shard_on_nvme(u); }
  void load_params(UnitId u) override { gatherer->load_shard(u); }
  void store_params(UnitId u) override { gatherer->store_shard(u); }
};

}  // namespace zero
