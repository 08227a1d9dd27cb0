// The parameter gatherer (see engine/param_gatherer.hpp).
#include "engine/param_gatherer.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "engine/bucket_layout.hpp"
#include "offload/aio.hpp"
#include "zero/comm/quantized_comm.hpp"
#include "zero/core/error.hpp"
#include "zero/core/log.hpp"

namespace zero::detail {

namespace {
// Signalling-NaN-free poison: a quiet NaN pattern in every 16-bit or 32-bit element.
constexpr unsigned char kPoisonByte = 0xff;
}  // namespace

void PrefetchCoordinator::end_micro_step() {
  if (!valid_ || recording_ != plan_) {
    plan_ = recording_;
    valid_ = !plan_.empty();
  }
  recording_.clear();
  pos_ = 0;
}

ParamGatherer::ParamGatherer(const Placement& placement, Communicator& comm, DeviceOps& dev,
                             MemoryTracker& tracker, bool poison_released, char* trainer_params,
                             Observer observer)
    : placement_(placement),
      comm_(comm),
      dev_(dev),
      w_(placement.in.working),
      poison_(poison_released),
      trainer_params_(trainer_params),
      observer_(observer),
      params_whole_(allocate(placement.params_whole, dev, tracker, {.zero = true})),
      params_shard_(allocate(placement.params_shard, dev, tracker, {.zero = true})),
      gather_pool_(dev, tracker, placement.gather_pool),
      bucket_pool_(dev, tracker, placement.gather_bucket_pool),
      quant_pool_(dev, tracker, placement.quant_gather_pool),
      units_(placement.num_units()),
      prefetch_(placement.in.prefetch_bucket, placement.in.max_live) {
  if (!placement.nvme_params) return;
  offload::ChunkSwapper::Options so = placement.in.param_swap;
  so.aio.observer = observer;
  swapper_ = std::make_unique<offload::ChunkSwapper>(tracker, placement.param_slot_elems,
                                                     placement.param_parts, std::move(so));
  window_mem_ = allocate(placement.param_window, dev, tracker, {.zero = true});
  window_ = reinterpret_cast<char*>(
      offload::align_up(reinterpret_cast<std::uintptr_t>(window_mem_.data())));
  // The file starts as the shards do: zeros.
  for (std::size_t c = 0; c < placement.param_slot_elems.size(); ++c) {
    swapper_->write_slot(c, window_);
  }
}

ParamGatherer::~ParamGatherer() {
  for (UnitState& us : units_) {
    try {
      if (us.prefetch.valid()) us.prefetch.wait();
      if (us.shard_read != 0) swapper_->wait(std::exchange(us.shard_read, 0));
    } catch (const std::exception& e) {
      ZERO_LOG(kWarn, "a prefetch in flight at shutdown failed: ", e.what());
    }
  }
}

char* ParamGatherer::whole_base() const {
  return trainer_params_ != nullptr ? trainer_params_ : static_cast<char*>(params_whole_.data());
}

char* ParamGatherer::unit_params(UnitId u) const {
  const UnitPlacement& up = placement_.unit(u);
  if (up.kept_whole) return at(whole_base(), up.params_offset, w_);
  const UnitState& us = units_[static_cast<std::size_t>(u)];
  return us.holders > 0 ? static_cast<char*>(us.gathered.data()) : nullptr;
}

char* ParamGatherer::step_params(UnitId u) {
  const UnitPlacement& up = placement_.unit(u);
  if (up.kept_whole) return at(whole_base(), up.params_offset + up.step_begin, w_);
  if (placement_.nvme_params) return window_;
  return at(params_shard_.data(), up.params_offset, w_);
}

void ParamGatherer::load_shard(UnitId u) {
  swapper_->read_slot(placement_.unit(u).param_slot, window_);
}
void ParamGatherer::store_shard(UnitId u) {
  swapper_->write_slot(placement_.unit(u).param_slot, window_);
}

// ---- stage 3 gathering

void ParamGatherer::start_gather(UnitId u, bool async) {
  UnitState& us = units_[static_cast<std::size_t>(u)];
  const UnitLayout& ul = placement_.lay(u);
  const UnitPlacement& up = placement_.unit(u);
  us.gathered = gather_pool_.take();
  live_ += ul.padded;
  const std::size_t shard_bytes = ul.shard * dtype_size(w_);
  char* own = at(us.gathered.data(), placement_.own_begin(u), w_);
  const void* send;
  if (shard_on_nvme(u) && async && dev_.host_accessible()) {  // read now, gather later
    us.shard_read = swapper_->submit_read_slot(up.param_slot, read_target(u));
    deferred_.push_back(u);
    return;
  }
  if (shard_on_nvme(u)) {  // this rank's shard into its place; the all-gather runs in place
    load_shard(u);
    dev_.copy(own, window_, shard_bytes);  // the host window to the device
    observer_.count(&IoCounters::host_to_device, shard_bytes);
    dev_.synchronize();  // the window is reused by the next load
    send = own;
  } else if (placement_.host_params && !dev_.host_accessible()) {
    // A pinned host shard: copied into its place, all-gathered in place on the device.
    dev_.copy(own, at(params_shard_.data(), up.params_offset, w_), shard_bytes);
    observer_.count(&IoCounters::host_to_device, shard_bytes);
    send = own;
  } else {
    send = at(params_shard_.data(), up.params_offset, w_);
  }
  issue_gather(u, send, async);
}

void ParamGatherer::issue_gather(UnitId u, const void* send, bool async) {
  UnitState& us = units_[static_cast<std::size_t>(u)];
  const std::size_t shard = placement_.lay(u).shard;
  comm_.tag_next(u, placement_.tag_layout(u));
  if (placement_.in.quantized_weights) {
    us.quant = quant_pool_.take();
    CommHandle h = start_quantized_all_gather(comm_, dev_, send, shard, w_,
                                              placement_.in.quant_block, us.quant.data());
    if (async) {
      us.prefetch = std::move(h);
    } else {
      h.wait();
      finish_gather(u);
    }
  } else if (async) {
    us.prefetch = comm_.all_gather_async(send, us.gathered.data(), shard, w_);
  } else {
    comm_.all_gather(send, us.gathered.data(), shard, w_);
  }
}

void ParamGatherer::finish_gather(UnitId u) {
  UnitState& us = units_[static_cast<std::size_t>(u)];
  if (us.quant.empty()) return;
  finish_quantized_all_gather(comm_, dev_, us.quant.data(), us.gathered.data(),
                              placement_.lay(u).shard, w_, placement_.in.quant_block);
  quant_pool_.give(std::move(us.quant));
}

void ParamGatherer::prefetch_after(UnitId u) {
  prefetch_.after(
      u, [&](UnitId v) { return !placement_.unit(v).kept_whole; },
      [&](UnitId v) { return !units_[static_cast<std::size_t>(v)].gathered.empty(); },
      [&](UnitId v) { return placement_.lay(v).padded; }, [&] { return live_; },
      [&](UnitId v) { start_gather(v, /*async=*/true); });
  if (prefetch_.paused()) ZERO_LOG(kDebug, "gather order changed at unit ", u, "; prefetch paused");
}

// offload_param = nvme: where a prefetch reads unit u's shard (inside its gathered buffer).
char* ParamGatherer::read_target(UnitId u) {
  const auto p =
      reinterpret_cast<std::uintptr_t>(units_[static_cast<std::size_t>(u)].gathered.data());
  return reinterpret_cast<char*>(
      offload::align_up(p + placement_.layout.max_padded * dtype_size(w_)));
}

// Launches the all-gathers of the prefetched units whose shard reads were started, in order.
void ParamGatherer::launch_deferred() {
  while (!deferred_.empty()) {
    const UnitId u = deferred_.front();
    deferred_.pop_front();
    UnitState& us = units_[static_cast<std::size_t>(u)];
    swapper_->wait(std::exchange(us.shard_read, 0));
    const UnitLayout& ul = placement_.lay(u);
    char* own = at(us.gathered.data(), placement_.own_begin(u), w_);
    dev_.copy(own, read_target(u), ul.shard * dtype_size(w_));
    observer_.count(&IoCounters::host_to_device, ul.shard * dtype_size(w_));
    issue_gather(u, own, /*async=*/true);
  }
}

void ParamGatherer::drop_gathered(UnitId u) {
  UnitState& us = units_[static_cast<std::size_t>(u)];
  if (us.shard_read != 0) {  // prefetched, never launched: every rank drops it here alike
    swapper_->wait(std::exchange(us.shard_read, 0));
    deferred_.erase(std::find(deferred_.begin(), deferred_.end(), u));
  }
  if (us.prefetch.valid()) us.prefetch.wait();
  if (!us.quant.empty()) quant_pool_.give(std::move(us.quant));  // never read back: dropped
  if (us.gathered.empty()) return;
  const std::size_t padded = placement_.lay(u).padded;
  if (poison_) dev_.fill(us.gathered.data(), kPoisonByte, padded * dtype_size(w_));
  live_ -= padded;
  gather_pool_.give(std::move(us.gathered));
}

void ParamGatherer::acquire(UnitId u) {
  UnitState& us = units_[static_cast<std::size_t>(u)];
  if (us.shard_read != 0) launch_deferred();
  if (!placement_.unit(u).kept_whole) {
    if (us.gathered.empty()) {
      start_gather(u, /*async=*/false);
    } else if (us.prefetch.valid()) {
      us.prefetch.wait();
      finish_gather(u);
    }
  }
  ++us.holders;
}

void ParamGatherer::gather(UnitId u) {
  prefetch_.record(u);
  launch_deferred();
  acquire(u);
  if (placement_.in.policy.shard_params) prefetch_after(u);
}

void ParamGatherer::release(UnitId u) {
  UnitState& us = units_[static_cast<std::size_t>(u)];
  ZERO_CHECK(us.holders > 0, kInternal, "release of unit ", u, " with no holder");
  if (--us.holders == 0 && !placement_.unit(u).kept_whole) drop_gathered(u);
}

void ParamGatherer::end_micro_step() {
  prefetch_.end_micro_step();
  for (UnitId u = 0; u < static_cast<UnitId>(units_.size()); ++u) drop_gathered(u);
}

// ---- after the step

void ParamGatherer::gather_frozen() {
  if (!placement_.in.policy.shard_optimizer) return;
  for (UnitId u = 0; u < static_cast<UnitId>(placement_.num_units()); ++u) {
    const UnitPlacement& up = placement_.unit(u);
    if (!up.frozen || !up.kept_whole) continue;
    char* base = at(whole_base(), up.params_offset, w_);
    comm_.tag_next(u, placement_.tag_layout(u));
    comm_.all_gather(at(base, placement_.own_begin(u), w_), base, placement_.lay(u).shard, w_);
  }
}

void ParamGatherer::gather_updated() {
  if (!placement_.in.policy.shard_optimizer) return;
  const auto rank = static_cast<std::size_t>(placement_.in.rank);
  const int n = placement_.in.world_size;
  struct InFlight {
    int bucket;
    CommHandle handle;
    Buffer staging;  // merged buckets: rank-major, as the reducer's
  };
  std::deque<InFlight> in_flight;
  std::size_t merged = 0;
  // A merged bucket's gathered parts back into their units (all ranks' shards).
  auto finish_front = [&] {
    InFlight f = std::move(in_flight.front());
    in_flight.pop_front();
    f.handle.wait();
    if (f.staging.empty()) return;
    const Bucket& b = placement_.gather_buckets[static_cast<std::size_t>(f.bucket)];
    for (UnitId u = b.first; u <= b.last; ++u) {
      const UnitPlacement& up = placement_.unit(u);
      // This rank's shard is where the optimizer wrote it.
      unpack(dev_, BucketSlot(f.staging.data(), b, up.gather_offset, placement_.lay(u).shard, w_),
             at(whole_base(), up.params_offset, w_), RankSelect::except(n, placement_.in.rank));
    }
    bucket_pool_.give(std::move(f.staging));
    --merged;
  };
  for (std::size_t bi = 0; bi < placement_.gather_buckets.size(); ++bi) {
    const Bucket& b = placement_.gather_buckets[bi];
    InFlight f;
    f.bucket = static_cast<int>(bi);
    if (!b.merged()) {  // in place in the unit
      char* base = at(whole_base(), placement_.unit(b.first).params_offset, w_);
      comm_.tag_next(b.first, placement_.tag_layout(b));
      f.handle = comm_.all_gather_async(at(base, placement_.own_begin(b.first), w_), base,
                                        placement_.lay(b.first).shard, w_);
      in_flight.push_back(std::move(f));
      continue;
    }
    f.staging = bucket_pool_.take();
    char* own = at(f.staging.data(), rank * b.shard, w_);
    for (UnitId u = b.first; u <= b.last; ++u) {
      const UnitPlacement& up = placement_.unit(u);
      pack(dev_, at(whole_base(), up.params_offset, w_), w_,
           BucketSlot(f.staging.data(), b, up.gather_offset, placement_.lay(u).shard, w_),
           RankSelect::just(n, placement_.in.rank));
    }
    comm_.tag_next(b.first, placement_.tag_layout(b));
    f.handle = comm_.all_gather_async(own, f.staging.data(), b.shard, w_);
    in_flight.push_back(std::move(f));
    ++merged;
    while (merged > placement_.max_in_flight) finish_front();
  }
  while (!in_flight.empty()) finish_front();
}

// ---- the planner's replays

ParamGatherer::GatherPools ParamGatherer::predicted_gather_pools(const Placement& p,
                                                                 const std::vector<UnitId>& order) {
  GatherPools out;
  if (!p.in.policy.shard_params) return out;
  PrefetchCoordinator coordinator(p.in.prefetch_bucket, p.in.max_live);
  std::vector<bool> gathered(p.num_units(), false), in_flight(p.num_units(), false);
  std::size_t live = 0, in_use = 0, pool = 0, flying = 0, staging = 0;
  auto sharded = [&](UnitId v) { return !p.unit(v).kept_whole; };
  auto take = [&](UnitId v) {
    gathered[static_cast<std::size_t>(v)] = true;
    live += p.lay(v).padded;
    pool = std::max(pool, ++in_use);
  };
  auto prefetch = [&](UnitId v) {  // its staging is held until the trainer's gather waits on it
    take(v);
    in_flight[static_cast<std::size_t>(v)] = true;
    staging = std::max(staging, ++flying);
  };
  for (int micro_step = 0; micro_step < 2; ++micro_step) {
    for (UnitId u : order) {
      coordinator.record(u);
      const auto us = static_cast<std::size_t>(u);
      if (sharded(u) && !gathered[us]) {  // a blocking gather: staging taken and given back
        take(u);
        staging = std::max(staging, flying + 1);
      } else if (in_flight[us]) {
        in_flight[us] = false;
        --flying;
      }
      coordinator.after(
          u, sharded, [&](UnitId v) { return gathered[static_cast<std::size_t>(v)]; },
          [&](UnitId v) { return p.lay(v).padded; }, [&] { return live; }, prefetch);
      if (sharded(u)) {  // released after use
        gathered[static_cast<std::size_t>(u)] = false;
        live -= p.lay(u).padded;
        --in_use;
      }
    }
    coordinator.end_micro_step();  // step(): unused prefetches are dropped
    std::fill(gathered.begin(), gathered.end(), false);
    std::fill(in_flight.begin(), in_flight.end(), false);
    live = 0;
    in_use = 0;
    flying = 0;
  }
  out.gathered = pool;
  out.quant = p.in.quantized_weights ? staging : 0;
  return out;
}

std::size_t ParamGatherer::predicted_bucket_buffers(const Placement& p) {
  if (!p.in.policy.shard_optimizer) return 0;
  std::size_t merged = 0;
  for (const Bucket& b : p.gather_buckets) merged += b.merged() ? 1 : 0;
  return std::min(merged, p.max_in_flight + 1);
}

}  // namespace zero::detail
