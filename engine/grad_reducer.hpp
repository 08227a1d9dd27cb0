// engine/grad_reducer.hpp — the gradient reducer: the trainer's gradient buffers of a micro-step,
// their reduction (all-reduce, reduce-scatter, in buckets), accumulation over micro-steps, and
// the global statistics (norm, overflow) of the accumulated gradients.
//
// What it owns: the gradient pool (a whole unit's W-typed gradients, taken when the trainer
// first asks for a unit's gradient in a micro-step), the reduction staging (R-typed copies of
// units and merged buckets in flight), the queue of reductions in flight, and the accumulation
// buffers (R-typed: whole units in stages 0-1, this rank's shards in stages 2-3; on the device,
// and in pinned host memory for the units whose gradient partition ZeRO-Offload keeps with their
// offloaded optimizer state: each unit in the one the placement names).
//
// Stages 2-3 reduce every micro-step, as each bucket's last unit becomes ready (its
// reduce-scatter runs while the trainer computes the backward of the units before it; with
// hybrid sharding the all-reduce across the replicas follows it, also in flight); stages 0-1
// accumulate locally and reduce once at the boundary. Reductions average over ranks; the
// engine divides by the accumulation steps at the step (DeepSpeed's mean over N x A
// micro-batches), so the accumulated values are sums over micro-steps of rank means.
//
// A merged bucket (reduce_bucket_size) is one collective over a rank-major staging buffer:
// for every rank q, shard q of each member unit, in unit order. Rank r's reduced part is then
// its shards of the members, consecutive, which is how the accumulation buffer holds them.
//
// Thread safety: belongs to one rank's engine; used from the rank's thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "core/observe.hpp"
#include "engine/buffer_pool.hpp"
#include "engine/placement.hpp"
#include "zero/comm/comm.hpp"
#include "zero/device/device_ops.hpp"
#include "zero/optim/optimizer.hpp"

namespace zero::detail {

// The global statistics of the accumulated gradients, identical on every rank.
struct GradTotals {
  double sum_squares = 0.0;
  bool non_finite = false;
};

class GradReducer {
 public:
  // trainer_grads: attach mode, the trainer's flat gradient buffer (W); null when managed.
  // observer: where the reduced shards' move to the host partition (ZeRO-Offload, stages 2-3)
  // is counted as device-to-host bytes and traced (either may be null; both outlive this).
  // replicas: hybrid sharding, the ranks holding the same shards in the other groups: every
  // reduced shard is then all-reduced (averaged) across them (null: none).
  // all_reduce: stages 1-2 (zero_optimization.reduce_scatter = false, DeepSpeed's meaning): each
  // reduction is an all-reduce of the whole buffer, of which this rank keeps its part (where the
  // reduce-scatter would have left it; the in-process communicator gives the same bits).
  GradReducer(const Placement& placement, Communicator& comm, DeviceOps& dev,
              const CpuOptimizer& host, MemoryTracker& tracker, char* trainer_grads,
              Observer observer = {}, Communicator* replicas = nullptr, bool all_reduce = false);
  ~GradReducer();  // waits for reductions in flight (logging failures)
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // ---- a micro-step
  // Unit u's gradient buffer (W, the whole padded unit), zeroed when first asked for in this
  // micro-step. REQUIRES: not ready(u).
  char* unit_grads(UnitId u);
  bool ready(UnitId u) const { return units_[static_cast<std::size_t>(u)].ready; }
  // Unit u's gradients are complete: stages 0-1 accumulate them; stages 2-3 pack them into their
  // bucket and launch the bucket's reduce-scatter when it is complete, leaving up to
  // max_in_flight reductions running. A unit without gradients counts as zero.
  void grads_ready(UnitId u);
  // Attach mode: the trainer's buffer holds this micro-step's gradients (its padding is zeroed
  // here); accumulates them unless the buffer is reduced in place.
  void take_trainer_grads();
  // Waits for every reduction, clears the ready flags and counts the micro-step.
  void end_micro_step();
  std::int64_t micro_steps() const noexcept { return micro_; }  // in the current window

  // offload_optimizer.overlap_step: while `final` (set for the micro-step that ends the
  // accumulation window), each unit of a bucket whose reduced shard has just been accumulated
  // into the host partition is passed to `landed` (its gradients are final for the step).
  void on_final_host_grads(std::function<void(UnitId)> landed) { landed_ = std::move(landed); }
  void set_final_micro_step(bool final) { final_micro_ = final; }

  // ---- the boundary
  // Stages 0-1: the reduction (all-reduce / reduce-scatter in buckets) of the accumulation.
  void reduce_at_boundary();
  // Sum of squares and overflow of the reduced gradients over every rank, summed shard by shard
  // in rank order so every stage gets the same bits.
  GradTotals totals();
  // Starts the next accumulation window.
  void end_window() { micro_ = 0; }
  // The reduced gradients of unit u's stepped range (R): device memory, or pinned host memory
  // when the placement keeps unit u's gradient partition on the host.
  char* step_grads(UnitId u);

  std::size_t in_flight_grad_bytes() const { return grad_pool_.allocated_bytes(); }
  std::size_t staging_bytes() const {
    return reduce_pool_.allocated_bytes() + bucket_pool_.allocated_bytes() +
           quant_pool_.allocated_bytes();
  }

  // The pool buffers a micro-step takes (planner): `grads_held` unit gradients the trainer holds
  // open at once, the trainer finishing units in reverse order (backward). Exact when every
  // bucket is one unit, every bucket is merged, or the merged buckets come first; otherwise an
  // upper bound.
  struct Pools {
    std::size_t grads = 0, reduce = 0, buckets = 0, quant = 0;
  };
  static Pools predicted_pools(const Placement& placement, int grads_held);

 private:
  struct UnitState {
    Buffer grad;  // W: this micro-step's gradients
    bool ready = false;
  };
  enum class Source : unsigned char { kGradPool, kReducePool, kBucketPool, kNone };
  struct Pending {
    int bucket = 0;
    CommHandle handle;
    Buffer buffer;  // what the collective reduces (empty: in place on the accumulation)
    Buffer quant;   // qgZ: the packed int8 chunks sent and received
    Source source = Source::kNone;
    bool boundary = false;  // stage 1's reduction at the boundary
  };

  char* acc_base() const;          // the device's accumulation (or the trainer's buffer)
  char* unit_acc(UnitId u) const;  // the unit's region in its accumulation buffer
  void launch_bucket(int b);
  // Starts the reduce-scatter (qgZ: quantized) of `base`, N parts of `count`, into this rank's
  // part, for p; tagged with unit `tag`.
  void start_reduce(Pending& p, char* base, std::size_t count, TagLayout layout, UnitId tag);
  // The reduction of `base` (N parts of `count`) leaving this rank's part at `own`: a
  // reduce-scatter, or with all_reduce_ an all-reduce of the whole in place.
  CommHandle reduce_async(char* base, char* own, std::size_t count);
  // The front reduction has completed: stage 1 and without replicas, accumulated now; with
  // hybrid sharding the replicas' all-reduce is started (replicating_).
  void finish_front();
  // The front all-reduce across the replicas has completed: accumulated.
  void finish_replica();
  void finish_all();
  // Where a stages 2-3 reduction leaves this rank's part, and its elements.
  struct Reduced {
    char* data;
    std::size_t count;
  };
  Reduced reduced_part(Pending& p) const;
  void accumulate_reduced(Pending& p);
  void give(Source s, Buffer b);
  // Unit u's gradients at `grad`: read by the host where they live there, else the device.
  GradStats stats(UnitId u, const void* grad, std::size_t count);

  const Placement& placement_;
  Communicator& comm_;
  DeviceOps& dev_;
  const CpuOptimizer& host_;
  char* trainer_grads_;
  Observer observer_;
  Communicator* replicas_;
  bool all_reduce_;
  DType w_, r_;
  Buffer acc_, host_acc_;
  Buffer grad_landing_;
  Buffer stats_scratch_;
  BufferPool grad_pool_, reduce_pool_, bucket_pool_, quant_pool_;
  std::vector<UnitState> units_;
  std::vector<Buffer> bucket_staging_;    // per bucket: the merged bucket being packed
  std::vector<std::size_t> bucket_left_;  // per bucket: members not yet ready this micro-step
  std::deque<Pending> pending_;
  std::deque<Pending> replicating_;  // hybrid: all-reduces across the replicas in flight
  std::size_t merged_in_flight_ = 0;
  std::int64_t micro_ = 0;
  std::function<void(UnitId)> landed_;
  bool final_micro_ = false;
};

}  // namespace zero::detail
