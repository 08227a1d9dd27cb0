// ckpt/fresh_state.hpp — loading weights without optimizer state (import_safetensors, the
// weights-only load): each unit's master is loaded with the optimizer state a new engine starts
// from. That state is zero for every optimizer (CpuOptimizer::init_state and the CUDA device
// zero it), so it is handed to Engine::load_shard as a run of zero bytes that costs no resident
// memory: an anonymous private mapping never written (every page the kernel's shared zero page).
//
// Thread safety: one object per rank.
#pragma once

#include <cstddef>

#include "zero/engine/engine.hpp"

namespace zero::ckpt::detail {

class FreshStateLoader {
 public:
  // REQUIRES: the engine's units are declared (it lays them out).
  explicit FreshStateLoader(Engine& engine);
  ~FreshStateLoader();
  FreshStateLoader(const FreshStateLoader&) = delete;
  FreshStateLoader& operator=(const FreshStateLoader&) = delete;

  // Engine::load_shard(u, master, <fresh state>): `master` holds unit_step_numel(u) f32.
  void load(UnitId u, const float* master);
  // Engine::finish_load at step 0 (no skipped steps, the loss scaler as configured).
  void finish();

 private:
  Engine& engine_;
  void* zeros_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace zero::ckpt::detail
