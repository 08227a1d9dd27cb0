// engine/param_gatherer.hpp — the parameter gatherer: the working parameters, stage 3's gather
// on use with the prefetch coordinator and the live limit, and the all-gather of the updated
// parameters after the step.
//
// What it owns: the working parameters (params_whole: every unit kept whole; params_shard: the
// stage-3 shards, in pinned memory with offload_param = cpu; with offload_param = nvme the
// shards' swap file and its window), the gathered buffers of stage-3 units (a pool), the
// holders of each unit, the prefetches in flight and the recorded gather order.
//
// Prefetch (PrefetchCoordinator): the order of gather() calls of one micro-step is recorded
// and becomes the plan of the next; after gather(u) at its place in the plan the all-gathers of
// the units that come next start, while their elements stay within stage3_prefetch_bucket_size
// (the next unit always, when the bucket is > 0) and the live gathered elements within
// stage3_max_live_parameters. Every rank follows the same order and counts, so every rank
// issues the same collectives. The planner replays the same coordinator.
//
// Thread safety: belongs to one rank's engine; used from the rank's thread.
#pragma once

#include <cstddef>
#include <deque>
#include <memory>
#include <vector>

#include "core/observe.hpp"
#include "engine/buffer_pool.hpp"
#include "engine/placement.hpp"
#include "offload/nvme_swapper.hpp"
#include "zero/comm/comm.hpp"
#include "zero/device/device_ops.hpp"

namespace zero::detail {

class PrefetchCoordinator {
 public:
  PrefetchCoordinator(std::size_t bucket, std::size_t max_live)
      : bucket_(bucket), max_live_(max_live) {}
  // A training gather of unit u, in the trainer's order.
  void record(UnitId u) { recording_.push_back(u); }
  // After gather(u): start(next) for every unit to prefetch now. sharded(v): v is gathered on
  // use; gathered(v): v's buffer is taken; padded(v): its elements; live(): gathered elements.
  template <typename Sharded, typename Gathered, typename Padded, typename Live, typename Start>
  void after(UnitId u, Sharded sharded, Gathered gathered, Padded padded, Live live, Start start);
  // The micro-step's order becomes the plan of the next ones.
  void end_micro_step();
  // The trainer left the plan this micro-step (prefetch paused until the next one).
  bool paused() const noexcept { return !valid_; }

 private:
  std::size_t bucket_, max_live_;
  std::vector<UnitId> plan_, recording_;
  bool valid_ = false;
  std::size_t pos_ = 0;
};

class ParamGatherer {
 public:
  // trainer_params: attach mode, the trainer's flat parameter buffer (W); null when managed.
  // observer: where the shard file's NVMe requests are traced and counted, and the pinned
  // shards' copies to the device counted (its tracer and counters, either may be null, outlive
  // this).
  ParamGatherer(const Placement& placement, Communicator& comm, DeviceOps& dev,
                MemoryTracker& tracker, bool poison_released, char* trainer_params,
                Observer observer);
  ~ParamGatherer();  // waits for prefetches in flight (logging failures)
  ParamGatherer(const ParamGatherer&) = delete;
  ParamGatherer& operator=(const ParamGatherer&) = delete;

  // ---- the trainer's side
  // A training gather: recorded for the prefetch plan; makes u whole for one more holder
  // (stage 3 all-gathers it or waits for its prefetch) and starts the prefetch of what follows.
  void gather(UnitId u);
  // Makes u whole for one more holder without entering the recorded order (read_param).
  void acquire(UnitId u);
  void release(UnitId u);
  int holders(UnitId u) const { return units_[static_cast<std::size_t>(u)].holders; }
  // The whole unit's working parameters: kept whole, or gathered (null when not gathered).
  char* unit_params(UnitId u) const;
  // The end of a micro-step: the recorded order becomes the plan; every gathered stage-3 unit
  // is dropped (prefetches must not cross the update).
  void end_micro_step();

  // ---- the optimizer's side
  // The working-dtype storage of unit u's stepped range. offload_param = nvme: the window,
  // which holds u's shard only between load_shard(u) (or the optimizer writing all of it) and
  // store_shard(u).
  char* step_params(UnitId u);
  bool shard_on_nvme(UnitId u) const { return placement_.shard_on_nvme(u); }
  void load_shard(UnitId u);
  void store_shard(UnitId u);
  // After the step: all-gathers the updated shards of the units kept whole (stages 1-3), merged
  // in buckets of allgather_bucket_size.
  void gather_updated();
  // After a checkpoint's load: all-gathers the frozen units kept whole (stages 1-3), which each
  // rank loaded over its own shard only and gather_updated() passes by (they never change).
  void gather_frozen();

  std::size_t gathered_bytes() const { return gather_pool_.allocated_bytes(); }
  std::size_t bucket_bytes() const {
    return bucket_pool_.allocated_bytes() + quant_pool_.allocated_bytes();
  }

  // The planner's count of gathered buffers the pool ends up with over two micro-steps of
  // `order` (the first records the plan, the second prefetches), each unit released before the
  // next is gathered, and of the qwZ staging buffers (one per all-gather in flight); and of
  // post-step all-gather bucket buffers.
  struct GatherPools {
    std::size_t gathered = 0, quant = 0;
  };
  static GatherPools predicted_gather_pools(const Placement& placement,
                                            const std::vector<UnitId>& order);
  static std::size_t predicted_bucket_buffers(const Placement& placement);

 private:
  struct UnitState {
    Buffer gathered;      // stage 3: the whole unit's parameters
    CommHandle prefetch;  // stage 3: all-gather in flight into `gathered`
    Buffer quant;     // qwZ: the packed int8 chunks of the all-gather in flight (read back at wait)
    int holders = 0;  // live guards
    offload::AioQueue::Ticket shard_read = 0;  // offload_param = nvme: prefetch read in flight
  };

  char* whole_base() const;
  void start_gather(UnitId u, bool async);
  // Issues unit u's all-gather from `send` (quantized with qwZ); blocking unless async.
  void issue_gather(UnitId u, const void* send, bool async);
  // The all-gather of u has completed: qwZ reads its chunks back into the gathered buffer.
  void finish_gather(UnitId u);
  void prefetch_after(UnitId u);
  char* read_target(UnitId u);
  void launch_deferred();
  void drop_gathered(UnitId u);

  const Placement& placement_;
  Communicator& comm_;
  DeviceOps& dev_;
  DType w_;
  bool poison_;
  char* trainer_params_;
  Observer observer_;
  Buffer params_whole_, params_shard_;
  // offload_param = nvme: the shards' swap file and the window that carries a shard between the
  // file and its users.
  std::unique_ptr<offload::ChunkSwapper> swapper_;
  Buffer window_mem_;
  char* window_ = nullptr;
  // A prefetch reads the shard into an aligned tail of the unit's gathered buffer while the
  // trainer computes; the all-gather is launched at the next gather() (a point every rank reaches
  // in the same order), from `deferred_`, in read order.
  std::deque<UnitId> deferred_;
  BufferPool gather_pool_, bucket_pool_, quant_pool_;
  std::vector<UnitState> units_;
  std::size_t live_ = 0;  // elements in gathered buffers
  PrefetchCoordinator prefetch_;
};

// ---- PrefetchCoordinator

template <typename Sharded, typename Gathered, typename Padded, typename Live, typename Start>
void PrefetchCoordinator::after(UnitId u, Sharded sharded, Gathered gathered, Padded padded,
                                Live live, Start start) {
  if (!valid_) return;
  if (pos_ >= plan_.size() || plan_[pos_] != u) {
    valid_ = false;  // the trainer left the recorded order: stop predicting
    return;
  }
  ++pos_;
  std::size_t ahead = 0;
  for (std::size_t j = pos_; j < plan_.size() && ahead < bucket_; ++j) {
    const UnitId next = plan_[j];
    if (!sharded(next)) continue;
    ahead += padded(next);
    if (gathered(next)) continue;
    if (live() + padded(next) > max_live_) break;
    start(next);
  }
}

}  // namespace zero::detail
