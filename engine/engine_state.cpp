// The engine's shards and training state as a checkpoint reads and writes them: this rank's
// parameter ranges, copies of the master and optimizer state from whichever tier holds them,
// and the load that writes them back (engine/engine_impl.hpp holds the state).
#include <algorithm>
#include <cstring>

#include "engine/engine_impl.hpp"

namespace zero {

std::vector<ParamShard> Engine::param_shards() const {
  Impl& m = const_cast<Impl&>(*impl_);  // laying out is not an observable change
  m.lay_out();
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
  // A frozen unit's working copy is its only copy (fp32: the optimizer's master is that copy).
  if (m.unit_place(u).frozen && m.place().master_apart(u)) return nullptr;
  return m.optimizer->master(u);
}

const void* Engine::state_shard(UnitId u, int k) const {
  Impl& m = const_cast<Impl&>(*impl_);
  m.check_unit(u, "state_shard");
  m.lay_out();
  if (k < 0 || k >= m.oparams.num_states() || m.unit_place(u).frozen) return nullptr;
  return m.optimizer->state(u, k);  // kInvalidArgument where unit u's state is in NVMe files
}

void Engine::copy_master_shard(UnitId u, float* out) {
  Impl& m = *impl_;
  m.check_unit(u, "copy_master_shard");
  m.lay_out();
  const detail::UnitPlacement& up = m.unit_place(u);
  if (!up.frozen) {
    m.optimizer->copy_master(u, out);
    return;
  }
  // A frozen unit has no master: its working copy widened to f32 (what a master would hold).
  const bool on_nvme = m.place().shard_on_nvme(u);
  if (on_nvme) m.gatherer->load_shard(u);
  detail::to_host_f32(*m.dev, *m.tracker, m.gatherer->step_params(u), m.w, !on_nvme, out,
                      up.step_count);
}

void Engine::copy_state_shard(UnitId u, int k, void* out) {
  Impl& m = *impl_;
  m.check_unit(u, "copy_state_shard");
  ZERO_CHECK(k >= 0 && k < m.oparams.num_states(), kInvalidArgument, "copy_state_shard: the ",
             m.cfg.optimizer.type, " optimizer has ", m.oparams.num_states(), " states, not ",
             k + 1);
  m.lay_out();
  const detail::UnitPlacement& up = m.unit_place(u);
  if (!up.frozen) {
    m.optimizer->copy_state(u, k, out);
    return;
  }
  // A frozen unit has no state: the fresh state (zeros, as init_state makes it), so that a
  // checkpoint keeps one format and a run that unfreezes the unit starts its state fresh.
  std::memset(out, 0, state_bytes(m.oparams.state_dtype(), up.step_count));
}

Engine::TrainingState Engine::training_state() const {
  const Impl& m = *impl_;
  return {m.steps, m.skipped, m.scaler.state()};
}
const Config& Engine::config() const noexcept { return impl_->cfg; }
const OptimizerParams& Engine::optimizer_params() const noexcept { return impl_->oparams; }
const std::vector<OptimizerParams>& Engine::group_params() const noexcept {
  return impl_->group_params;
}
std::size_t Engine::alignment() const noexcept { return impl_->opts.alignment; }

std::size_t Engine::unit_step_numel(UnitId u) const {
  impl_->check_unit(u, "unit_step_numel");
  impl_->lay_out();
  return impl_->unit_place(u).step_count;
}

std::size_t Engine::unit_step_begin(UnitId u) const {
  impl_->check_unit(u, "unit_step_begin");
  impl_->lay_out();
  return impl_->unit_place(u).step_begin;
}

void Engine::load_shard(UnitId u, const float* master, const void* const* states) {
  Impl& m = *impl_;
  m.check_unit(u, "load_shard");
  m.lay_out();
  ZERO_CHECK(m.steps == 0 && m.skipped == 0 && m.reducer->micro_steps() == 0, kInvalidArgument,
             "load: the engine has already trained (", m.steps, " steps, ", m.skipped, " skipped, ",
             m.reducer->micro_steps(),
             " micro-steps): load a checkpoint into a fresh engine, before the first step");
  ZERO_CHECK(m.gatherer->holders(u) == 0, kInvalidArgument, "load: unit '", m.name(u),
             "' is gathered (release its GatherGuard first)");
  const detail::UnitPlacement& up = m.unit_place(u);
  const std::size_t n = up.step_count;
  // The working copy over the stepped range: the master rounded to W (device memory, or the
  // NVMe parameter window in host memory).
  char* wdst = m.gatherer->step_params(u);
  if (m.place().shard_on_nvme(u)) {
    m.gatherer->load_shard(u);
    convert(master, DType::kF32, wdst, m.w, n);
    m.gatherer->store_shard(u);
  } else {
    detail::from_host_f32(*m.dev, *m.tracker, master, wdst, m.w, n);
  }
  if (!up.frozen) m.optimizer->load_unit(u, master, states);  // frozen: the states are unused
}

void Engine::finish_load(std::int64_t steps, std::int64_t skipped,
                         const std::optional<LossScaler::State>& loss_scaler) {
  Impl& m = *impl_;
  m.lay_out();
  ZERO_CHECK(steps >= 0 && skipped >= 0, kInvalidArgument, "load: negative step counters (", steps,
             ", ", skipped, ")");
  if (loss_scaler.has_value()) m.scaler.load_state(*loss_scaler);
  m.gatherer->gather_updated();
  m.gatherer->gather_frozen();
  m.steps = steps;
  m.skipped = skipped;
}

}  // namespace zero
