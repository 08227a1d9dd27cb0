// zero/engine/plan.hpp — predicted per-rank memory of the engine, without running it.
//
// Two levels:
//  - zero_formula(): DESIGN.md's model-state formulas (Ψ parameters, N ranks) — what the ZeRO
//    paper's figures are made of.
//  - plan_engine_memory(): what this engine allocates, byte for byte: the same layout code
//    (padding, shards), the same pools (gradients in flight, reduce staging, gathered units with
//    prefetch) replayed over the trainer's gather order. The harness prints it beside the
//    tracker's measurement.
//
// Thread safety: pure functions.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "zero/config/config.hpp"
#include "zero/core/dtype.hpp"
#include "zero/device/memory.hpp"
#include "zero/engine/engine.hpp"

namespace zero {

// Model-state bytes per rank by DESIGN.md (element counts times bytes; Ψ parameters, N ranks):
// params w·Ψ, gradients g·Ψ, optimizer k·Ψ (fp32 master + moments: k = 12 for Adam), each
// divided by N where the stage partitions it. Offload moves the optimizer part off the device,
// with it in stages 2-3 the gradient partition (ZeRO-Offload reduces each bucket into fp32
// gradients on the host), and with parameter offload in stage 3 the parameters: the totals hold
// what stays, `offloaded` what moved.
struct FormulaBytes {
  double params = 0, grads = 0, optimizer = 0;
  double offloaded = 0;
  double total() const { return params + grads + optimizer; }
};
// psi_trainable: of psi, the trainable parameters (frozen ones have parameters only: no
// gradients, master or optimizer state); default all. offload_fraction: with offload_optimizer,
// the fraction of the optimizer part (and of the gradient partition with it) that moves
// (offload_optimizer.ratio with device cpu); default all.
FormulaBytes zero_formula(double psi, int ranks, int stage, double w = 2, double g = 2,
                          double k = 12, bool offload_optimizer = false,
                          bool offload_params = false,
                          std::optional<double> psi_trainable = std::nullopt,
                          double offload_fraction = 1.0);

struct PlanInput {
  std::vector<UnitSpec> units;
  int ranks = 1;
  Config config;  // stage, precision, overlap, stage-3 limits, optimizer
  std::size_t alignment = 32;
  // The order in which the trainer gathers units in one micro-step (stage 3 prefetch follows
  // it); each unit is released before the next is gathered. Empty: forward then reverse order.
  std::vector<UnitId> gather_order;
  // Units whose gradient buffers (grad()) the trainer holds open at once: 1 for a trainer that
  // finishes each unit before the next; 2 for a tied embedding whose gradient stays open from
  // the head to the end of backward (zero-train's GPT).
  int grads_held = 1;
};

struct PlanResult {
  // Memory after a step by category (device or host tier, and pinned host memory), and of it
  // what is pinned (optimizer offload); NVMe files apart.
  std::array<std::size_t, kNumMemCategories> bytes{};
  std::array<std::size_t, kNumMemCategories> pinned{};
  std::array<std::size_t, kNumMemCategories> nvme{};
  // Buffers included in `bytes` (gradients in flight, reduce staging, gathered units).
  std::size_t in_flight_grad_bytes = 0;
  std::size_t staging_bytes = 0;
  std::size_t gathered_param_bytes = 0;
  std::size_t psi = 0;         // parameters
  std::size_t psi_padded = 0;  // with the layout's padding
  // Of psi_padded, the trainable units' (frozen units: no gradients, master or state).
  std::size_t psi_trainable_padded = 0;
  // The optimizer's partial offload as the placement cut it (offload_optimizer.ratio): of this
  // rank's stepped elements (master and state), those on the trailing tier (offloaded; with
  // nvme, in the swap file). offload_fraction() is what the ratio achieved.
  std::size_t stepped = 0, stepped_offloaded = 0;
  double offload_fraction() const {
    return stepped == 0 ? 0.0
                        : static_cast<double>(stepped_offloaded) / static_cast<double>(stepped);
  }
  std::vector<std::size_t> unit_padded;  // padded elements per unit
  std::size_t largest_unit = 0;          // padded elements of the largest unit
  std::string largest_unit_name;

  std::size_t at(MemCategory c) const { return bytes[static_cast<std::size_t>(c)]; }
  // params16 + master + optimizer state + gradients where they are computed with (not pinned:
  // offloaded), without the buffers above.
  std::size_t model_state() const;
  std::size_t buffers() const {
    return in_flight_grad_bytes + staging_bytes + gathered_param_bytes;
  }
  std::size_t total() const;
};

// REQUIRES: units non-empty and valid (else zero::Error(kInvalidArgument) as add_unit).
PlanResult plan_engine_memory(const PlanInput& in);

namespace detail {
struct Placement;
// A placement's bytes (plan_engine_memory's sum over rank 0's; the engine's own for
// EngineOptions::check_fit), its pools replayed over `gather_order` (empty: forward, then
// backward).
PlanResult plan_of(const Placement& placement, const std::vector<UnitId>& gather_order,
                   int grads_held);
}  // namespace detail

}  // namespace zero
