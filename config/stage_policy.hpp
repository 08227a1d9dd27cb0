// config/stage_policy.hpp — the ZeRO stage as a policy: what it shards, decided once.
//
// The only place that reads the stage number (DESIGN.md "a stage is a policy, not a copy of the
// engine"). Everything else asks the three questions below. The ownership mode takes part: in
// attach mode the trainer owns whole gradients, so nothing shards them (stage 2 acts on the
// optimizer state only; its gradient savings need the managed engine).
//
// Thread safety: a plain value.
#pragma once

namespace zero::detail {

// Who owns the parameter and gradient storage.
enum class Ownership : unsigned char {
  kManaged,   // the engine (views handed out); stages 0-3
  kAttached,  // the trainer's flat buffers (Engine::attach); stages 0-2
};

struct StagePolicy {
  int stage = 0;                 // as configured (what Engine::stage() reports)
  bool shard_optimizer = false;  // master + state for this rank's shard only (1, 2, 3)
  bool shard_gradients = false;  // reduce every micro-step into a gradient shard (2, 3; managed)
  bool shard_params = false;     // parameters kept as shards, gathered on use (3)

  static StagePolicy of(int stage, Ownership ownership = Ownership::kManaged) {
    StagePolicy p;
    p.stage = stage;
    p.shard_optimizer = stage >= 1;
    p.shard_gradients = stage >= 2 && ownership == Ownership::kManaged;
    p.shard_params = stage >= 3;
    return p;
  }
};

}  // namespace zero::detail
