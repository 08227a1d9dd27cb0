// engine/placement.hpp — what lives where: for every buffer of every unit its size, category, tier
// and whether it is the whole unit or this rank's shard, computed once.
//
// The placement is the one statement of the engine's memory rules. It is made from the units,
// the world size and rank, the stage policy, the dtypes, the offload tiers, the device (whether
// the host can address its memory) and the ownership mode. The engine allocates its arenas and
// sizes its pools from it; the planner (engine/plan.cpp) predicts a run's memory by summing the
// same arenas and adding the pools the rooms that own them predict (the gradient reducer's
// in-flight rule, the parameter gatherer's prefetch replay). Nothing else restates a size.
//
// Arenas: one buffer per kind for the whole run, units at offsets inside it (params_whole holds
// every unit kept whole, params_shard every stage-3 shard, master / state / grads the stepped or
// reduced ranges; the optimizer's and the gradient partition's arenas one per tier, each unit in
// its tier's). Pools: equal buffers taken and given back during a micro-step.
//
// Partial offload (offload_optimizer.ratio, DeepSpeed's meaning): each trainable unit's
// optimizer state has one tier (UnitPlacement::optim_tier). The leading units stay on the lead
// tier (the device; with nvme, pinned host memory), the trailing units whose stepped elements
// come closest to `ratio` of this rank's stepped elements go to the trailing tier (pinned host
// memory; with nvme, the swap file). A unit is the granularity of reduce, step and checkpoint,
// so the cut falls between units; every rank's shards have the same sizes, so every rank cuts at
// the same unit.
//
// Thread safety: a plain value.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "config/stage_policy.hpp"
#include "engine/flat_layout.hpp"
#include "offload/nvme_swapper.hpp"
#include "zero/comm/comm.hpp"
#include "zero/config/config.hpp"
#include "zero/core/dtype.hpp"
#include "zero/device/device_ops.hpp"
#include "zero/device/memory.hpp"
#include "zero/engine/unit.hpp"
#include "zero/optim/optimizer.hpp"

namespace zero {
struct PlanInput;  // zero/engine/plan.hpp
}  // namespace zero

namespace zero::detail {

// Where an arena lives: the engine's device (host memory on the CPU device), pinned host memory
// (offload), or a swap file.
enum class Tier : unsigned char { kDevice, kPinned, kNvme };

struct Arena {
  MemCategory category = MemCategory::kOther;
  Tier tier = Tier::kDevice;
  std::size_t bytes = 0;  // 0: not allocated
};

// A pool of equal buffers of `buffer_bytes` on the device (0: the pool is not used).
struct PoolShape {
  MemCategory category = MemCategory::kOther;
  std::size_t buffer_bytes = 0;
};

// Consecutive units [first, last] that share one collective. `shard` is one rank's part: the
// sum of the members' shards; member u sits at offset(u) inside every rank's part.
struct Bucket {
  UnitId first = 0;
  UnitId last = 0;
  std::size_t shard = 0;
  bool merged() const noexcept { return last > first; }
};

// One chunk of the offloaded optimizer step: elements [at, at + count) of unit's stepped range.
struct Chunk {
  UnitId unit = 0;
  std::size_t at = 0;
  std::size_t count = 0;
};

// A run of a unit's stepped range stepped with one parameter group's options: elements
// [at, at + count) of the range (a parameter's alignment padding goes with the parameter).
struct GroupRun {
  std::size_t at = 0;
  std::size_t count = 0;
  int group = 0;
};

// Elements [begin, end) of unit `unit`'s flat range in parameter group `group` (attach mode's
// groups, declared by element range; managed units name a group per parameter).
struct GroupSpan {
  UnitId unit = 0;
  std::size_t begin = 0;
  std::size_t end = 0;
  int group = 0;
};

struct UnitPlacement {
  // Every parameter frozen (ParamSpec::trainable = false): the parameters are placed as any
  // unit's (whole or sharded, gathered the same way), but the unit holds no gradients, master or
  // optimizer state, is in no reduce or post-step gather bucket and has no runs or chunks; its
  // optim_offset / grads_offset are not used. step_begin / step_count still name this rank's
  // part of it (the range a checkpoint saves).
  bool frozen = false;
  // Parameters: whole on every rank (stages 0-2, stage-3 units below the persistence threshold)
  // at params_offset in params_whole; else this rank's shard at params_offset in params_shard,
  // or (offload_param = nvme) in slot param_slot of the parameter swap file.
  bool kept_whole = true;
  std::size_t params_offset = 0;
  static constexpr std::size_t kNoSlot = std::numeric_limits<std::size_t>::max();
  std::size_t param_slot = kNoSlot;
  // The range this rank steps: the whole padded unit in stage 0, its shard otherwise; at
  // optim_offset in its tier's master and state arenas (the swap file: its chunks' slots).
  std::size_t step_begin = 0;
  std::size_t step_count = 0;
  std::size_t optim_offset = 0;
  // Where the master and optimizer state live and are stepped: kDevice (the device's fused
  // step), kPinned or kNvme (the offloaded chunk pipeline). A frozen unit has none: it carries
  // the lead tier.
  Tier optim_tier = Tier::kDevice;
  // The stepped range by parameter group, in order, tiling it (one run without groups; none for a
  // frozen unit).
  std::vector<GroupRun> runs;
  // The accumulated gradients: the whole unit (stages 0-1) or its shard (2-3) at grads_offset
  // in the device's gradient arena, or (grads_on_host: stages 2-3 with the unit's optimizer
  // offloaded, ZeRO-Offload) in the pinned one. The master, state and gradient arenas hold the
  // trainable units of their tier only, consecutive in unit order.
  std::size_t grads_offset = 0;
  bool grads_on_host = false;
  // The reduce bucket and the offset in it; the post-step all-gather bucket (-1: not gathered
  // after the step: sharded stage-3 units, stage 0).
  int reduce_bucket = 0;
  std::size_t reduce_offset = 0;
  int gather_bucket = -1;
  std::size_t gather_offset = 0;
};

// Everything the placement is made from. Built from a Config by placement_input().
struct PlacementInput {
  std::vector<UnitSpec> units;
  int world_size = 1;
  int rank = 0;
  std::size_t alignment = 32;
  StagePolicy policy;
  Ownership ownership = Ownership::kManaged;
  bool host_accessible = true;  // the device's memory is host memory (the CPU device)
  DType working = DType::kF32;  // W: parameters and gradients
  DType reduce = DType::kF32;   // R: reduction and accumulation
  MomentDType state_dtype = MomentDType::kF32;
  int num_states = 2;
  // Parameter groups: how many (group 0 the optimizer's own), and attach mode's element spans
  // (applied over the parameters' own groups, later spans over earlier ones).
  int num_groups = 1;
  std::vector<GroupSpan> group_spans;
  std::int64_t accumulation = 1;
  OffloadDevice optimizer_offload = OffloadDevice::kNone;
  double offload_ratio = 1.0;  // offload_optimizer.ratio: the fraction on the trailing tier
  // offload_optimizer.overlap_step: the offloaded step during backward (stages 2-3).
  bool overlap_step = false;
  OffloadDevice param_offload = OffloadDevice::kNone;
  std::size_t offload_chunk = 0;    // offload_optimizer.buffer_size (elements)
  std::size_t offload_buffers = 0;  // offload_optimizer.buffer_count
  std::size_t persistence_threshold = 0;
  std::size_t prefetch_bucket = 0;   // stage3_prefetch_bucket_size (elements)
  std::size_t max_live = 0;          // stage3_max_live_parameters (elements)
  std::size_t reduce_bucket = 0;     // elements; 0: a bucket per unit
  std::size_t allgather_bucket = 0;  // elements; 0: a bucket per unit
  bool overlap_comm = false;
  // ZeRO++ (stage 3): the quantized parameter all-gather / gradient reduce-scatter, in blocks of
  // quant_block elements; replicas: hybrid sharding's replica count (1: none).
  bool quantized_weights = false;
  bool quantized_gradients = false;
  std::size_t quant_block = 256;
  int replicas = 1;
  // The NVMe swap files (offload_param / offload_optimizer with device nvme): directory, stem,
  // the config key that chose the directory, staging buffers, pipelining and the aio queue, parsed
  // once here; the rooms that own the swappers add their observer.
  offload::ChunkSwapper::Options param_swap, optim_swap;
};

// The placement input of `config` (every choice parsed once here). Throws kConfig for a
// combination that cannot run (parameter offload to NVMe without the whole optimizer off the
// device).
// How many ranks the engine shards over among `world_size`: zero_optimization.hybrid_shard_size
// when set (hybrid sharding), else all of them. The engine's groups and the planner both ask here.
int shard_width(const Config& config, int world_size);
// zero_optimization.hybrid_shard_size with "node" resolved from the launcher's variables (ranks
// per node; a world of in-process ranks is one node); 0: not set. Throws kConfig when the
// launcher does not say, or the engine's world is not the launcher's.
int hybrid_shard_size(const Config& config, int world_size);

// world_size: the ranks the engine shards over (its group); replicas: how many such groups hold
// the same shards (hybrid sharding; 1: none).
PlacementInput placement_input(const Config& config, std::vector<UnitSpec> units, int world_size,
                               int rank, std::size_t alignment, Ownership ownership,
                               bool host_accessible, int replicas = 1);

struct Placement {
  PlacementInput in;
  Layout layout;
  std::vector<UnitPlacement> units;

  // Rules every room reads.
  bool on_device = false;       // some unit's optimizer state is on the device
  bool offloaded = false;       // some unit's optimizer state is off it (pinned or NVMe)
  bool nvme_optimizer = false;  // ... in a swap file
  bool host_params = false;     // offload_param = cpu: stage-3 shards in pinned memory
  bool nvme_params = false;     // offload_param = nvme: stage-3 shards in a swap file
  // An fp32 master apart from the parameters for the units on the device (16-bit training; in
  // fp32 training the working shard is their master). Offloaded units always have one.
  bool separate_master = false;
  // Attach, W == R, no accumulation, nothing frozen: reduced in the trainer's buffer.
  bool grads_in_trainer = false;
  // Padded elements of the trainable units (the whole-unit gradient extent: stage 0's
  // all-reduce), and of their stepped ranges (this rank's master / state elements).
  std::size_t trainable_padded = 0;
  std::size_t trainable_step = 0;
  // Of trainable_step, the elements on the trailing tier (offload_optimizer.ratio's cut: what
  // the ratio achieved is offload_step / trainable_step).
  std::size_t offload_step = 0;

  // Arenas. `state` is the shape of each of num_states optimizer-state arenas. master / state:
  // the units on the device; host_master / host_state: those in pinned host memory. grads: the
  // accumulated gradients on the device; host_grads: the gradient partition on the host.
  Arena params_whole, params_shard, master, state, host_master, host_state, grads, host_grads;
  // Optimizer offload: the chunks of the offloaded units (unit by unit; unit u's are
  // [unit_chunk[u], unit_chunk[u+1]), none for a unit on the device), those in pinned memory
  // first, the swap file's from nvme_chunk on (slot c - nvme_chunk), and offload_buffers staging
  // buffers of each of these (bytes 0: none).
  std::vector<Chunk> chunks;
  std::vector<std::size_t> unit_chunk;
  std::size_t nvme_chunk = 0;
  std::size_t chunk_elems = 0;
  Arena staging_grad, staging_param;
  std::vector<std::size_t> optim_chunk_elems;  // per swap-file slot (nvme)
  std::vector<offload::ChunkSwapper::Part> optim_parts;
  offload::ChunkSwapper::Footprint optim_file;
  // offload_optimizer.overlap_step: the speculative step's held results. Pinned chunks: a window
  // of spec_chunks buffers of spec_window.bytes, each one chunk's master, states and (16-bit
  // working parameters) updated parameter copy at spec_part_offset(k) (parts 0 master, 1..S the
  // states, S + 1 the copy); the pinned chunks beyond it are stepped at the boundary. NVMe
  // chunks: the swap file's alternate slots (in.optim_swap.slots = 2), whose last part (16-bit
  // working parameters) holds the updated copy.
  Arena spec_window;
  std::size_t spec_chunks = 0;
  std::size_t spec_part_offset(int k) const {
    const std::size_t n = chunk_elems;
    return k == 0 ? 0 : n * 4 + static_cast<std::size_t>(k - 1) * state_bytes(in.state_dtype, n);
  }
  // offload_param = nvme: a slot per sharded unit, one pinned window of the largest shard.
  std::vector<std::size_t> param_slot_elems;
  std::vector<offload::ChunkSwapper::Part> param_parts;
  offload::ChunkSwapper::Footprint param_file;
  Arena param_window;
  // A discrete device: the landing buffer of a reduced shard on its way to the host, and the
  // device scratch of the norm / overflow all-gather.
  Arena grad_landing, stats_scratch;

  // Pools (engine.cpp, engine/grad_reducer.cpp, engine/param_gatherer.cpp).
  PoolShape grad_pool;           // W, a whole unit: gradients written this micro-step
  PoolShape reduce_pool;         // R, a whole unit: a converted unit in flight (W != R)
  PoolShape bucket_pool;         // R, N x the largest merged bucket: a merged reduce in flight
  PoolShape gather_pool;         // W, a whole unit (+ gather_extra): gathered stage-3 units
  PoolShape gather_bucket_pool;  // W, N x the largest merged post-step all-gather bucket
  // ZeRO++: the packed int8 chunks of a quantized all-gather (N chunks of the largest sharded
  // unit's shard) and of a quantized reduce-scatter (2 N chunks of the largest reduced part; or
  // the replicas' all-reduce, whichever is larger) in flight.
  PoolShape quant_gather_pool, quant_reduce_pool;
  std::size_t gather_extra = 0;  // bytes past a gathered unit: the NVMe prefetch's read target
  std::vector<Bucket> reduce_buckets, gather_buckets;
  // Collectives the reducer leaves running when grads_ready returns (overlap_comm: several).
  std::size_t max_in_flight = 0;

  std::size_t num_units() const noexcept { return units.size(); }
  const UnitLayout& lay(UnitId u) const { return layout.units[static_cast<std::size_t>(u)]; }
  const UnitPlacement& unit(UnitId u) const { return units[static_cast<std::size_t>(u)]; }
  // What units first..last are on this rank (their elements before padding, their layouts'
  // digests combined), for the fingerprint of a collective that moves them: every engine
  // collective tagged with a unit says it (Communicator::tag_next).
  TagLayout tag_layout(UnitId first, UnitId last) const;
  TagLayout tag_layout(UnitId u) const { return tag_layout(u, u); }
  TagLayout tag_layout(const Bucket& b) const { return tag_layout(b.first, b.last); }
  // Where this rank's shard starts in unit u's padded range.
  std::size_t own_begin(UnitId u) const { return static_cast<std::size_t>(in.rank) * lay(u).shard; }
  // f(at, count, group) for every run of unit u's stepped range that meets [at, at + count),
  // clipped to it, in order.
  template <typename F>
  void for_each_run(UnitId u, std::size_t at, std::size_t count, F&& f) const {
    for (const GroupRun& r : unit(u).runs) {
      const std::size_t lo = std::max(at, r.at), hi = std::min(at + count, r.at + r.count);
      if (lo < hi) f(lo, hi - lo, r.group);
    }
  }
  bool shard_on_nvme(UnitId u) const { return nvme_params && !unit(u).kept_whole; }
  Tier optim_tier(UnitId u) const { return unit(u).optim_tier; }
  // Whether unit u's stepped master is an array of its own (else the working shard is it).
  bool master_apart(UnitId u) const {
    return separate_master || unit(u).optim_tier != Tier::kDevice;
  }
  // Where unit u's accumulated gradients are: pinned host memory, else the device.
  bool grads_on_host(UnitId u) const { return unit(u).grads_on_host; }
  // The stepped gradient of unit u in its gradient arena (grads, or host_grads: elements).
  std::size_t step_grads_offset(UnitId u) const {
    const UnitPlacement& p = unit(u);
    return p.grads_offset + (in.policy.shard_gradients ? 0 : p.step_begin);
  }
  // Every arena with how many of it there are (state: num_states; staging: offload_buffers).
  template <typename F>
  void for_each_arena(F&& f) const {
    f(params_whole, 1);
    f(params_shard, 1);
    f(master, 1);
    f(state, static_cast<std::size_t>(in.num_states));
    f(host_master, 1);
    f(host_state, static_cast<std::size_t>(in.num_states));
    f(grads, 1);
    f(host_grads, 1);
    f(staging_grad, in.offload_buffers);
    f(staging_param, in.offload_buffers);
    f(param_window, 1);
    f(spec_window, spec_chunks);
    f(grad_landing, 1);
    f(stats_scratch, 1);
  }
};

// Also validates the units (zero::Error(kInvalidArgument) as make_layout).
Placement make_placement(PlacementInput in);

// The placement plan_engine_memory() sums (zero/engine/plan.hpp): rank 0's, managed, on a device
// the host can address. The configuration chooser (plan/) reads its buckets and shards from the
// same.
Placement plan_placement(const PlanInput& in);

// Whether every parameter of `spec` is frozen (ParamSpec::trainable = false). A unit mixing
// frozen and trainable parameters is kInvalidArgument naming one of each: the unit is the
// granularity of reduce and step (as FSDP's flat parameter takes one requires_grad without
// use_orig_params).
bool frozen_unit(const UnitSpec& spec);

// The arena's buffer: on the device or pinned, charged to its category (empty for 0 bytes).
Buffer allocate(const Arena& arena, DeviceOps& dev, MemoryTracker& tracker, AllocOptions opts = {});

// Byte address of element `elems` of an array of dtype t at base.
inline char* at(void* base, std::size_t elems, DType t) {
  return static_cast<char*>(base) + elems * dtype_size(t);
}
inline const char* at(const void* base, std::size_t elems, DType t) {
  return static_cast<const char*>(base) + elems * dtype_size(t);
}

}  // namespace zero::detail
