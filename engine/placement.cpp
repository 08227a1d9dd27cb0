// The placement: the engine's memory rules, computed once (see engine/placement.hpp).
#include "engine/placement.hpp"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>
#include <utility>

#include <xxhash.h>

#include "offload/aio.hpp"
#include "zero/comm/comm.hpp"
#include "zero/comm/quantized_comm.hpp"
#include "zero/core/error.hpp"
#include "zero/optim/optimizer.hpp"

namespace zero::detail {

namespace {

// With overlap_comm the reducer keeps this many collectives running while the trainer computes
// the next units' backward (DeepSpeed double-buffers its reduction bucket the same way).
constexpr std::size_t kCollectivesInFlight = 2;

// Greedy buckets over the units in id order: a unit joins the open bucket while the bucket's
// padded elements stay within `limit` (0: every unit alone) and its `side` is the bucket's.
// Units that `eligible` rejects are left out and close the open bucket, so members are always
// consecutive. Writes each member's bucket index and offset (in one rank's part) through `place`.
template <typename Eligible, typename Side, typename Place>
std::vector<Bucket> make_buckets(const Layout& layout, std::size_t limit, Eligible eligible,
                                 Side side, Place place) {
  std::vector<Bucket> out;
  std::size_t padded = 0;
  bool open = false;
  for (std::size_t i = 0; i < layout.units.size(); ++i) {
    const auto u = static_cast<UnitId>(i);
    if (!eligible(u)) {
      open = false;
      continue;
    }
    const UnitLayout& ul = layout.units[i];
    if (!open || padded + ul.padded > limit || side(u) != side(out.back().first)) {
      out.push_back({u, u, 0});
      padded = 0;
      open = true;
    }
    Bucket& b = out.back();
    place(u, static_cast<int>(out.size() - 1), b.shard);
    b.last = u;
    b.shard += ul.shard;
    padded += ul.padded;
  }
  return out;
}

Arena on(Tier tier, MemCategory c, std::size_t bytes) { return Arena{c, tier, bytes}; }

// offload_optimizer.ratio's cut: the first unit of the trailing tier. The trailing trainable
// units whose stepped elements come closest to ratio x this rank's stepped elements go there;
// a tie offloads the larger part, as DeepSpeed's int((1 - ratio) x sub-groups) rounds the
// device's part down. Elements, not units: units differ in size. nu: nothing offloaded.
std::size_t offload_cut(const std::vector<UnitPlacement>& units, double ratio, std::size_t total) {
  const double want = ratio * static_cast<double>(total);
  std::size_t cut = units.size(), off = 0;
  double best = want;  // nothing offloaded
  for (std::size_t u = units.size(); u-- > 0;) {
    if (units[u].frozen) continue;
    off += units[u].step_count;
    const double d = std::abs(static_cast<double>(off) - want);
    if (d <= best) {
      best = d;
      cut = u;
    }
  }
  return cut;
}

// Unit u's stepped range [begin, begin + count) cut into runs of one parameter group.
std::vector<GroupRun> group_runs(const PlacementInput& in, const Layout& lay, UnitId u,
                                 std::size_t begin, std::size_t count) {
  const UnitSpec& spec = in.units[static_cast<std::size_t>(u)];
  const UnitLayout& ul = lay.units[static_cast<std::size_t>(u)];
  auto check = [&](int g, const auto&... what) {
    ZERO_CHECK(g >= 0 && g < in.num_groups, kInvalidArgument, "unit '", spec.name, "'", what...,
               ": parameter group ", g, " does not exist (", in.num_groups,
               " group(s): 0 is the optimizer's own, 1.. those added)");
  };
  // Start of each group's stretch over the padded unit (a parameter owns its padding).
  std::map<std::size_t, int> starts;
  for (std::size_t k = 0; k < spec.params.size(); ++k) {
    const int g = spec.params[k].group;
    check(g, " parameter '", spec.params[k].name, "'");
    starts[k == 0 ? 0 : ul.params[k].offset] = g;
  }
  for (const GroupSpan& s : in.group_spans) {
    if (s.unit != u) continue;
    check(s.group, " elements [", s.begin, ", ", s.end, ")");
    ZERO_CHECK(s.begin < s.end && s.end <= ul.numel, kInvalidArgument, "unit '", spec.name,
               "': parameter group span [", s.begin, ", ", s.end, ") is empty or outside its ",
               ul.numel, " elements");
    const int after = std::prev(starts.upper_bound(s.end))->second;
    starts.erase(starts.lower_bound(s.begin), starts.upper_bound(s.end));
    starts[s.begin] = s.group;
    if (s.end < ul.padded) starts.emplace(s.end, after);
  }
  std::vector<GroupRun> runs;
  for (auto it = starts.begin(); it != starts.end(); ++it) {
    const std::size_t next = std::next(it) == starts.end() ? ul.padded : std::next(it)->first;
    const std::size_t lo = std::max(it->first, begin), hi = std::min(next, begin + count);
    if (lo >= hi) continue;
    if (!runs.empty() && runs.back().group == it->second) {
      runs.back().count += hi - lo;
    } else {
      runs.push_back({lo - begin, hi - lo, it->second});
    }
  }
  return runs;
}

}  // namespace

Buffer allocate(const Arena& arena, DeviceOps& dev, MemoryTracker& tracker, AllocOptions opts) {
  if (arena.bytes == 0) return {};
  ZERO_CHECK(arena.tier != Tier::kNvme, kInternal, "allocate: an NVMe arena is a file");
  return arena.tier == Tier::kPinned ? Buffer::pinned(tracker, arena.category, arena.bytes, opts)
                                     : dev.alloc(tracker, arena.category, arena.bytes, opts);
}

bool frozen_unit(const UnitSpec& spec) {
  const ParamSpec* frozen = nullptr;
  const ParamSpec* trained = nullptr;
  for (const ParamSpec& ps : spec.params) (ps.trainable ? trained : frozen) = &ps;
  ZERO_CHECK(frozen == nullptr || trained == nullptr, kInvalidArgument, "unit '", spec.name,
             "' mixes frozen and trainable parameters ('", frozen->name, "' is frozen, '",
             trained->name,
             "' is not): a unit is reduced and stepped as a whole; declare its frozen parameters "
             "in a unit of their own");
  return frozen != nullptr;
}

TagLayout Placement::tag_layout(UnitId first, UnitId last) const {
  TagLayout t;
  for (UnitId u = first; u <= last; ++u) {
    t.elements += lay(u).numel;
    t.digest = u == first ? lay(u).digest : XXH3_64bits_withSeed(&lay(u).digest, 8, t.digest);
  }
  return t;
}

namespace {

// ---- make_placement's steps, in the order its body calls them: units -> stepped ranges ->
// arenas per tier -> buckets -> pools. Each reads what the steps before it wrote into the
// placement and writes its own part.

// The rules every room reads that follow from the input alone.
void set_rules(Placement& p) {
  const PlacementInput& i = p.in;
  p.host_params = i.param_offload == OffloadDevice::kCpu;
  p.nvme_params = i.param_offload == OffloadDevice::kNvme;
  // fp32 training keeps no master copy for the units stepped on the device (the parameters are
  // the master); an offloaded unit's master lives with its optimizer state off the device.
  p.separate_master = i.working != DType::kF32;
  // Attach, W == R, A == 1: reduced in the trainer's buffer, unless frozen units cut it (the
  // trainable units' gradients are then not consecutive there: the engine accumulates them).
  p.grads_in_trainer = i.ownership != Ownership::kManaged && i.working == i.reduce &&
                       i.accumulation == 1 &&
                       std::none_of(i.units.begin(), i.units.end(), frozen_unit);
}

// Elements of the parameter arenas: the units kept whole and the shards held in memory.
struct ParamExtents {
  std::size_t whole = 0;    // params_whole
  std::size_t sharded = 0;  // params_shard (none with offload_param = nvme: slots of its file)
};

// Units: frozen or not, each one's parameters whole (params_whole) or sharded (params_shard, or
// a slot of the parameter swap file), at consecutive offsets in unit order.
ParamExtents place_units(Placement& p) {
  const PlacementInput& i = p.in;
  ParamExtents e;
  p.units.resize(p.layout.units.size());
  for (std::size_t u = 0; u < p.units.size(); ++u) {
    const UnitLayout& ul = p.layout.units[u];
    UnitPlacement& up = p.units[u];
    up.frozen = frozen_unit(i.units[u]);
    up.kept_whole = !i.policy.shard_params || ul.numel < i.persistence_threshold;
    if (up.kept_whole) {
      up.params_offset = e.whole;
      e.whole += ul.padded;
    } else if (p.nvme_params) {
      up.param_slot = p.param_slot_elems.size();
      p.param_slot_elems.push_back(ul.shard);
    } else {
      up.params_offset = e.sharded;
      e.sharded += ul.shard;
    }
  }
  return e;
}

// Stepped ranges: what this rank steps of each unit (the whole padded unit in stage 0, its
// shard otherwise), cut into runs by parameter group; the trainable units' totals.
void place_stepped_ranges(Placement& p) {
  const PlacementInput& i = p.in;
  const bool sharded = i.policy.shard_optimizer;
  for (std::size_t u = 0; u < p.units.size(); ++u) {
    const UnitLayout& ul = p.layout.units[u];
    UnitPlacement& up = p.units[u];
    up.step_begin = sharded ? static_cast<std::size_t>(i.rank) * ul.shard : 0;
    up.step_count = sharded ? ul.shard : ul.padded;
    if (up.frozen) continue;
    p.trainable_step += up.step_count;
    p.trainable_padded += ul.padded;
    up.runs = group_runs(i, p.layout, static_cast<UnitId>(u), up.step_begin, up.step_count);
  }
}

// The optimizer's tier per unit (offload_optimizer.device and ratio). Offload to host memory:
// the device leads, pinned memory trails. To NVMe: pinned memory leads, the swap file trails
// (DeepSpeed's ratio on NVMe: the fraction in the file).
void assign_optim_tiers(Placement& p) {
  const PlacementInput& i = p.in;
  const std::size_t nu = p.units.size();
  const bool nvme = i.optimizer_offload == OffloadDevice::kNvme;
  const Tier lead = nvme ? Tier::kPinned : Tier::kDevice;
  const Tier trail = nvme ? Tier::kNvme : Tier::kPinned;
  const std::size_t cut = i.optimizer_offload == OffloadDevice::kNone
                              ? nu
                              : offload_cut(p.units, i.offload_ratio, p.trainable_step);
  for (std::size_t u = 0; u < nu; ++u) {
    UnitPlacement& up = p.units[u];
    up.optim_tier = !up.frozen && u >= cut ? trail : lead;
    if (up.frozen) continue;
    if (u >= cut) p.offload_step += up.step_count;
    p.on_device = p.on_device || up.optim_tier == Tier::kDevice;
    p.offloaded = p.offloaded || up.optim_tier != Tier::kDevice;
    p.nvme_optimizer = p.nvme_optimizer || up.optim_tier == Tier::kNvme;
    // ZeRO-Offload keeps the gradient partition with the optimizer on the host: in stages 2-3
    // the reduced shards are accumulated there as they complete. Stage 1 reduces whole
    // gradients on the device at the boundary; its shard is staged chunk by chunk at the step.
    up.grads_on_host = up.optim_tier != Tier::kDevice && i.policy.shard_gradients;
  }
}

// Elements of each tier's optimizer and gradient arenas.
struct TierExtents {
  std::size_t device_step = 0, host_step = 0;    // master / state: the device's, pinned memory's
  std::size_t device_grads = 0, host_grads = 0;  // accumulated gradients: the device's, the host's
};

// Offsets in the tiers' arenas: the trainable units of each, consecutive in unit order.
TierExtents place_in_tiers(Placement& p) {
  const bool shard_gradients = p.in.policy.shard_gradients;
  TierExtents e;
  for (std::size_t u = 0; u < p.units.size(); ++u) {
    UnitPlacement& up = p.units[u];
    const UnitLayout& ul = p.layout.units[u];
    const std::size_t acc = shard_gradients ? ul.shard : ul.padded;
    const bool pinned = up.optim_tier == Tier::kPinned;
    up.optim_offset = pinned ? e.host_step : e.device_step;
    up.grads_offset = up.grads_on_host ? e.host_grads : e.device_grads;
    if (up.frozen) continue;
    if (up.optim_tier == Tier::kDevice) e.device_step += up.step_count;
    if (pinned) e.host_step += up.step_count;
    (up.grads_on_host ? e.host_grads : e.device_grads) += acc;
  }
  return e;
}

// The parameter arenas, and with offload_param = nvme the parameter swap file and its window.
void place_param_arenas(Placement& p, const ParamExtents& e) {
  const PlacementInput& i = p.in;
  const std::size_t ws = dtype_size(i.working);
  if (i.ownership == Ownership::kManaged) {
    p.params_whole = on(Tier::kDevice, MemCategory::kParams16, e.whole * ws);
  }
  p.params_shard =
      on(p.host_params ? Tier::kPinned : Tier::kDevice, MemCategory::kParams16, e.sharded * ws);
  if (!p.nvme_params) return;
  p.param_parts = {{MemCategory::kParams16, ws}};
  p.param_file = offload::ChunkSwapper::footprint(p.param_slot_elems, p.param_parts);
  p.param_window =
      on(Tier::kPinned, MemCategory::kOffloadStaging, p.param_file.staging_buffer_bytes);
  // The prefetch reads a shard straight into an aligned tail of its gathered buffer where the
  // host can address it; a discrete device reads into the window and copies.
  if (i.host_accessible) p.gather_extra = p.param_file.staging_buffer_bytes;
}

// Master and optimizer state, each in-memory tier's units in its arenas. Every stepped range is
// a whole number of int8 blocks: an arena is its ranges' sum.
void place_state_arenas(Placement& p, const TierExtents& e) {
  const MomentDType sd = p.in.state_dtype;
  if (p.separate_master) {
    p.master = on(Tier::kDevice, MemCategory::kMasterParams, e.device_step * 4);
  }
  p.state = on(Tier::kDevice, MemCategory::kOptimizerState, state_bytes(sd, e.device_step));
  p.host_master = on(Tier::kPinned, MemCategory::kMasterParams, e.host_step * 4);
  p.host_state = on(Tier::kPinned, MemCategory::kOptimizerState, state_bytes(sd, e.host_step));
}

// Elements of the offloaded step's chunk (0: nothing offloaded).
std::size_t chunk_size(const Placement& p) {
  if (!p.offloaded) return 0;
  // A chunk never needs to be larger than the largest offloaded range (DeepSpeed's
  // buffer_size default of 1e8 elements would otherwise pin gigabytes for a small model).
  std::size_t max_range = 0;
  for (const UnitPlacement& up : p.units) {
    if (!up.frozen && up.optim_tier != Tier::kDevice) {
      max_range = std::max(max_range, up.step_count);
    }
  }
  const std::size_t elems = std::max<std::size_t>(1, std::min(p.in.offload_chunk, max_range));
  // int8 moments: a chunk is a whole number of quantization blocks (each stepped whole).
  const std::size_t qb = state_block(p.in.state_dtype);
  return (elems + qb - 1) / qb * qb;
}

// The offloaded units' chunks, in unit order: the pinned tier's, then the swap file's.
void cut_chunks(Placement& p) {
  for (std::size_t u = 0; u < p.units.size(); ++u) {
    p.unit_chunk.push_back(p.chunks.size());
    const UnitPlacement& up = p.units[u];
    const std::size_t range = up.frozen || up.optim_tier == Tier::kDevice ? 0 : up.step_count;
    for (std::size_t a = 0; a < range; a += p.chunk_elems) {
      p.chunks.push_back({static_cast<UnitId>(u), a, std::min(p.chunk_elems, range - a)});
      if (up.optim_tier != Tier::kNvme) p.nvme_chunk = p.chunks.size();
    }
  }
  p.unit_chunk.push_back(p.chunks.size());
}

// The offloaded step's pinned buffers: persistent staging, one chunk per buffer (the gradient
// chunk where the gradients stay on the device, stage 1; the updated 16-bit parameters; fp32:
// the master is copied directly), and overlap_step's window of pinned chunks.
void place_offload_buffers(Placement& p) {
  const PlacementInput& i = p.in;
  const std::size_t ws = dtype_size(i.working), rs = dtype_size(i.reduce);
  if (p.offloaded) {
    if (!i.policy.shard_gradients) {
      p.staging_grad = on(Tier::kPinned, MemCategory::kOffloadStaging, p.chunk_elems * rs);
    }
    if (i.working != DType::kF32) {
      p.staging_param = on(Tier::kPinned, MemCategory::kOffloadStaging, p.chunk_elems * ws);
    }
  }
  if (i.overlap_step && p.nvme_chunk > 0) {
    // The pinned chunks' window: as many chunks as the pipeline's staging buffers.
    p.spec_chunks = std::min(i.offload_buffers, p.nvme_chunk);
    const std::size_t n = p.chunk_elems;
    p.spec_window =
        on(Tier::kPinned, MemCategory::kOffloadStaging,
           p.spec_part_offset(i.num_states + 1) + (i.working != DType::kF32 ? n * ws : 0));
  }
}

// The optimizer's swap file (the NVMe tier): a slot per chunk from nvme_chunk on, each with the
// master, the states and (overlap_step, 16-bit) the updated parameters.
void place_optim_file(Placement& p) {
  const PlacementInput& i = p.in;
  if (!p.nvme_optimizer) return;
  for (std::size_t c = p.nvme_chunk; c < p.chunks.size(); ++c) {
    p.optim_chunk_elems.push_back(p.chunks[c].count);
  }
  p.optim_parts = {{MemCategory::kMasterParams, 4}};
  for (int k = 0; k < i.num_states; ++k) {
    // The state's bytes per element and per block, from the optimizer's rule.
    const std::size_t block = state_block(i.state_dtype);
    const std::size_t per_block = state_bytes(i.state_dtype, block);
    p.optim_parts.push_back(
        {MemCategory::kOptimizerState, per_block / block, block, per_block % block});
  }
  // The speculative step's updated 16-bit parameters ride in the slot (written at the commit).
  if (i.overlap_step && i.working != DType::kF32) {
    p.optim_parts.push_back({MemCategory::kParams16, dtype_size(i.working)});
  }
  p.optim_file =
      offload::ChunkSwapper::footprint(p.optim_chunk_elems, p.optim_parts, i.optim_swap.slots);
}

// Gradients: the device's arena (none when reduced in the trainer's buffer) and the partition on
// the host.
void place_grad_arenas(Placement& p, const TierExtents& e) {
  const std::size_t rs = dtype_size(p.in.reduce);
  if (!p.grads_in_trainer) {
    p.grads = on(Tier::kDevice, MemCategory::kGradients, e.device_grads * rs);
  }
  p.host_grads = on(Tier::kPinned, MemCategory::kGradients, e.host_grads * rs);
}

// The reduce buckets (trainable units) and the post-step all-gather buckets (trainable units
// kept whole), each member's bucket and offset written into its unit.
void place_buckets(Placement& p) {
  const PlacementInput& i = p.in;
  const bool bucketed = i.policy.shard_optimizer;  // stage 0 all-reduces everything at once
  auto unit = [&p](UnitId u) -> UnitPlacement& { return p.units[static_cast<std::size_t>(u)]; };
  // A merged bucket's reduced part lands consecutively in one gradient arena: a bucket never
  // spans the device's gradients and the host partition (partial offload, stages 2-3).
  p.reduce_buckets = make_buckets(
      p.layout, bucketed ? i.reduce_bucket : 0, [&](UnitId u) { return !unit(u).frozen; },
      [&](UnitId u) { return p.grads_on_host(u); },
      [&](UnitId u, int b, std::size_t off) {
        unit(u).reduce_bucket = b;
        unit(u).reduce_offset = off;
      });
  p.gather_buckets = make_buckets(
      p.layout, i.allgather_bucket,
      [&](UnitId u) {
        return bucketed && unit(u).kept_whole && !unit(u).frozen;  // a frozen unit is never updated
      },
      [](UnitId) { return 0; },
      [&](UnitId u, int b, std::size_t off) {
        unit(u).gather_bucket = b;
        unit(u).gather_offset = off;
      });
}

// The largest of what the pools hold, in elements (one rank's part unless said).
struct PoolExtents {
  std::size_t max_trainable = 0;      // a trainable unit, padded
  std::size_t max_shard = 0;          // a sharded unit's shard
  std::size_t max_reduce_bucket = 0;  // N x a merged reduce bucket's part
  std::size_t max_gather_bucket = 0;  // N x a merged post-step all-gather bucket's part
  std::size_t max_reduce_shard = 0;   // a reduce bucket's part
  std::size_t max_host_shard = 0;     // ... of the buckets reduced into the host partition
};

PoolExtents pool_extents(const Placement& p) {
  PoolExtents e;
  for (std::size_t u = 0; u < p.units.size(); ++u) {
    const UnitLayout& ul = p.layout.units[u];
    if (!p.units[u].frozen) e.max_trainable = std::max(e.max_trainable, ul.padded);
    if (!p.units[u].kept_whole) e.max_shard = std::max(e.max_shard, ul.shard);
  }
  const auto n = static_cast<std::size_t>(p.in.world_size);
  for (const Bucket& b : p.reduce_buckets) {
    e.max_reduce_shard = std::max(e.max_reduce_shard, b.shard);
    if (p.grads_on_host(b.first)) e.max_host_shard = std::max(e.max_host_shard, b.shard);
    if (b.merged()) e.max_reduce_bucket = std::max(e.max_reduce_bucket, n * b.shard);
  }
  for (const Bucket& b : p.gather_buckets) {
    if (b.merged()) e.max_gather_bucket = std::max(e.max_gather_bucket, n * b.shard);
  }
  return e;
}

// The pools, sized by the largest buffer each takes; on a discrete device, what the host needs
// from its memory lands in pinned memory first.
void size_pools(Placement& p, const PoolExtents& e) {
  const PlacementInput& i = p.in;
  const std::size_t ws = dtype_size(i.working), rs = dtype_size(i.reduce);
  p.max_in_flight = i.overlap_comm ? kCollectivesInFlight : 0;
  // Gradients are written and reduced for trainable units only.
  p.grad_pool = {MemCategory::kGradients, e.max_trainable * ws};
  p.reduce_pool = {MemCategory::kCommBuffers, e.max_trainable * rs};
  p.bucket_pool = {MemCategory::kCommBuffers, e.max_reduce_bucket * rs};
  p.gather_pool = {MemCategory::kParams16, p.layout.max_padded * ws + p.gather_extra};
  p.gather_bucket_pool = {MemCategory::kCommBuffers, e.max_gather_bucket * ws};
  if (i.quantized_weights && e.max_shard > 0) {
    p.quant_gather_pool = {
        MemCategory::kCommBuffers,
        quantized_all_gather_staging_bytes(i.world_size, e.max_shard, i.quant_block)};
  }
  if (i.quantized_gradients) {
    std::size_t bytes =
        quantized_reduce_scatter_staging_bytes(i.world_size, e.max_reduce_shard, i.quant_block);
    if (i.replicas > 1) {
      bytes = std::max(
          bytes, quantized_all_reduce_staging_bytes(i.replicas, e.max_reduce_shard, i.quant_block));
    }
    p.quant_reduce_pool = {MemCategory::kCommBuffers, bytes};
  }
  if (!i.host_accessible) {
    const auto n = static_cast<std::size_t>(i.world_size);
    p.grad_landing = on(Tier::kPinned, MemCategory::kOffloadStaging, e.max_host_shard * rs);
    p.stats_scratch = on(Tier::kDevice, MemCategory::kCommBuffers, 4 * (n + 1) * sizeof(float));
  }
}

}  // namespace

Placement make_placement(PlacementInput in) {
  Placement p;
  // int8 moments: shards start on a quantization block (blocks never straddle two ranks).
  p.layout = make_layout(in.units, in.world_size, in.alignment, state_block(in.state_dtype));
  p.in = std::move(in);
  set_rules(p);
  // Units -> stepped ranges -> each unit's optimizer tier and its offsets in the tiers' arenas.
  const ParamExtents params = place_units(p);
  place_stepped_ranges(p);
  assign_optim_tiers(p);
  const TierExtents tiers = place_in_tiers(p);
  // Arenas per tier: parameters, master and state (the offloaded units' in chunks), gradients.
  place_param_arenas(p, params);
  place_state_arenas(p, tiers);
  p.chunk_elems = chunk_size(p);
  cut_chunks(p);
  place_offload_buffers(p);
  place_optim_file(p);
  place_grad_arenas(p, tiers);
  // Buckets, then the pools their largest members size.
  place_buckets(p);
  size_pools(p, pool_extents(p));
  return p;
}

}  // namespace zero::detail
