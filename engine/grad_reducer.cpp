// The gradient reducer (see engine/grad_reducer.hpp).
#include "engine/grad_reducer.hpp"

#include <algorithm>
#include <cstring>
#include <utility>

#include "device/grad_accumulate.hpp"
#include "engine/bucket_layout.hpp"
#include "zero/comm/quantized_comm.hpp"
#include "zero/core/error.hpp"
#include "zero/core/log.hpp"

namespace zero::detail {

// ---- GradReducer

GradReducer::GradReducer(const Placement& placement, Communicator& comm, DeviceOps& dev,
                         const CpuOptimizer& host, MemoryTracker& tracker, char* trainer_grads,
                         Observer observer, Communicator* replicas, bool all_reduce)
    : placement_(placement),
      comm_(comm),
      dev_(dev),
      host_(host),
      trainer_grads_(trainer_grads),
      observer_(observer),
      replicas_(replicas),
      all_reduce_(all_reduce && !placement.in.policy.shard_params),
      w_(placement.in.working),
      r_(placement.in.reduce),
      acc_(allocate(placement.grads, dev, tracker, {.zero = true})),
      host_acc_(allocate(placement.host_grads, dev, tracker, {.zero = true})),
      grad_landing_(allocate(placement.grad_landing, dev, tracker)),
      stats_scratch_(allocate(placement.stats_scratch, dev, tracker)),
      grad_pool_(dev, tracker, placement.grad_pool),
      reduce_pool_(dev, tracker, placement.reduce_pool),
      bucket_pool_(dev, tracker, placement.bucket_pool),
      quant_pool_(dev, tracker, placement.quant_reduce_pool),
      units_(placement.num_units()),
      bucket_staging_(placement.reduce_buckets.size()),
      bucket_left_(placement.reduce_buckets.size(), 0) {}

GradReducer::~GradReducer() {
  // Collectives still in flight reference these buffers: let them finish first.
  for (std::deque<Pending>* q : {&pending_, &replicating_}) {
    for (Pending& p : *q) {
      try {
        p.handle.wait();
      } catch (const std::exception& e) {
        ZERO_LOG(kWarn, "a gradient reduction in flight at shutdown failed: ", e.what());
      }
    }
  }
}

char* GradReducer::acc_base() const {
  return placement_.grads_in_trainer ? trainer_grads_ : static_cast<char*>(acc_.data());
}

char* GradReducer::unit_acc(UnitId u) const {
  char* base = placement_.grads_on_host(u) ? static_cast<char*>(host_acc_.data()) : acc_base();
  return at(base, placement_.unit(u).grads_offset, r_);
}

char* GradReducer::step_grads(UnitId u) {
  return at(unit_acc(u), placement_.step_grads_offset(u) - placement_.unit(u).grads_offset, r_);
}

char* GradReducer::unit_grads(UnitId u) {
  UnitState& us = units_[static_cast<std::size_t>(u)];
  if (us.grad.empty()) {
    us.grad = grad_pool_.take();
    dev_.fill(us.grad.data(), 0, placement_.lay(u).padded * dtype_size(w_));
  }
  return static_cast<char*>(us.grad.data());
}

void GradReducer::grads_ready(UnitId u) {
  UnitState& us = units_[static_cast<std::size_t>(u)];
  us.ready = true;
  if (placement_.unit(u).frozen) return;  // nothing to reduce
  (void)unit_grads(u);                    // no gradient written: a zero gradient
  const UnitLayout& ul = placement_.lay(u);
  if (!placement_.in.policy.shard_gradients) {
    dev_.accumulate(unit_acc(u), r_, us.grad.data(), w_, ul.padded, micro_ == 0);
    grad_pool_.give(std::move(us.grad));
    return;
  }
  const UnitPlacement& up = placement_.unit(u);
  const Bucket& bucket = placement_.reduce_buckets[static_cast<std::size_t>(up.reduce_bucket)];
  if (!bucket.merged()) {
    Pending p;
    p.bucket = up.reduce_bucket;
    if (w_ == r_) {  // the gradient buffer itself is reduced in place
      p.buffer = std::move(us.grad);
      p.source = Source::kGradPool;
    } else {
      p.buffer = reduce_pool_.take();
      dev_.convert(us.grad.data(), w_, p.buffer.data(), r_, ul.padded);
      grad_pool_.give(std::move(us.grad));
      p.source = Source::kReducePool;
    }
    start_reduce(p, static_cast<char*>(p.buffer.data()), ul.shard, placement_.tag_layout(u), u);
    pending_.push_back(std::move(p));
  } else {
    // Shard q of the unit goes to rank q's part of the bucket, at the unit's offset in it.
    const auto b = static_cast<std::size_t>(up.reduce_bucket);
    Buffer& staging = bucket_staging_[b];
    if (staging.empty()) {
      staging = bucket_pool_.take();
      bucket_left_[b] = static_cast<std::size_t>(bucket.last - bucket.first + 1);
    }
    pack(dev_, static_cast<const char*>(us.grad.data()), w_,
         BucketSlot(staging.data(), bucket, up.reduce_offset, ul.shard, r_),
         RankSelect::all(placement_.in.world_size));
    grad_pool_.give(std::move(us.grad));
    if (--bucket_left_[b] == 0) launch_bucket(up.reduce_bucket);
  }
  while (pending_.size() > placement_.max_in_flight) finish_front();
}

// A merged bucket is complete: one reduce-scatter over its rank-major staging.
void GradReducer::launch_bucket(int b) {
  const Bucket& bucket = placement_.reduce_buckets[static_cast<std::size_t>(b)];
  Pending p;
  p.bucket = b;
  p.buffer = std::move(bucket_staging_[static_cast<std::size_t>(b)]);
  p.source = Source::kBucketPool;
  start_reduce(p, static_cast<char*>(p.buffer.data()), bucket.shard, placement_.tag_layout(bucket),
               bucket.first);
  pending_.push_back(std::move(p));
  ++merged_in_flight_;
}

void GradReducer::start_reduce(Pending& p, char* base, std::size_t count, TagLayout layout,
                               UnitId tag) {
  comm_.tag_next(tag, layout);
  if (placement_.in.quantized_gradients) {
    p.quant = quant_pool_.take();
    p.handle = start_quantized_reduce_scatter(comm_, dev_, base, count, r_,
                                              placement_.in.quant_block, p.quant.data());
    return;
  }
  const auto rank = static_cast<std::size_t>(placement_.in.rank);
  p.handle = reduce_async(base, at(base, rank * count, r_), count);
}

CommHandle GradReducer::reduce_async(char* base, char* own, std::size_t count) {
  if (all_reduce_) {
    return comm_.all_reduce_async(base, base, count * static_cast<std::size_t>(comm_.size()), r_,
                                  ReduceOp::kAvg);
  }
  return comm_.reduce_scatter_async(base, own, count, r_, ReduceOp::kAvg);
}

void GradReducer::take_trainer_grads() {
  // The trainer's buffer tiles the units: their layout offsets are its offsets (engine/attach.cpp).
  const Layout& lay = placement_.layout;
  const std::size_t ws = dtype_size(w_);
  std::size_t numel = 0;
  for (const UnitSpec& s : placement_.in.units) numel += s.params[0].numel();
  // The padding must be zero (it is reduced and stepped like the rest).
  dev_.fill(trainer_grads_ + numel * ws, 0, (lay.total_padded - numel) * ws);
  if (placement_.grads_in_trainer) return;  // reduced there in place
  // The trainable units' gradients into the accumulation (a frozen unit's are never read).
  for (std::size_t u = 0; u < lay.units.size(); ++u) {
    if (placement_.units[u].frozen) continue;
    const UnitLayout& ul = lay.units[u];
    dev_.accumulate(unit_acc(static_cast<UnitId>(u)), r_, trainer_grads_ + ul.full_offset * ws, w_,
                    ul.padded, micro_ == 0);
  }
}

void GradReducer::finish_front() {
  Pending p = std::move(pending_.front());
  pending_.pop_front();
  p.handle.wait();
  const Bucket& bucket = placement_.reduce_buckets[static_cast<std::size_t>(p.bucket)];
  if (p.boundary) {
    // Stage 1: this rank's reduced shards back to their places in the whole-unit accumulation
    // (a bucket of one unit was reduced there in place).
    if (bucket.merged()) {
      for (UnitId u = bucket.first; u <= bucket.last; ++u) {
        unpack(dev_,
               BucketSlot(p.buffer.data(), bucket, placement_.unit(u).reduce_offset,
                          placement_.lay(u).shard, r_),
               unit_acc(u), RankSelect::just(placement_.in.world_size, placement_.in.rank));
      }
    }
    if (replicas_ != nullptr) {  // hybrid: the group's mean, averaged across the groups
      for (UnitId u = bucket.first; u <= bucket.last; ++u) {
        char* own = at(unit_acc(u), placement_.own_begin(u), r_);
        replicas_->tag_next(u, placement_.tag_layout(u));
        replicas_->all_reduce(own, own, placement_.lay(u).shard, r_, ReduceOp::kAvg);
      }
    }
  } else {
    // Stages 2-3: the group's reduction is complete (qgZ: its chunks still to be read back).
    const Reduced r = reduced_part(p);
    if (!p.quant.empty()) {  // qgZ: the received chunks read back and summed in f32
      finish_quantized_reduce_scatter(comm_, dev_, p.quant.data(), r.data, r.count, r_,
                                      placement_.in.quant_block, ReduceOp::kAvg);
    }
    if (replicas_ != nullptr) {
      // Hybrid: the group's mean, averaged across the groups; it runs while the trainer goes on
      // (the accumulation waits for it in finish_replica).
      replicas_->tag_next(bucket.first, placement_.tag_layout(bucket));
      p.handle = !p.quant.empty()
                     ? start_quantized_all_gather(*replicas_, dev_, r.data, r.count, r_,
                                                  placement_.in.quant_block, p.quant.data())
                     : replicas_->all_reduce_async(r.data, r.data, r.count, r_, ReduceOp::kAvg);
      replicating_.push_back(std::move(p));
      while (replicating_.size() > placement_.max_in_flight) finish_replica();
      return;
    }
    accumulate_reduced(p);  // gives the buffers back
    return;
  }
  if (p.source == Source::kBucketPool) --merged_in_flight_;
  give(p.source, std::move(p.buffer));
}

GradReducer::Reduced GradReducer::reduced_part(Pending& p) const {
  const Bucket& bucket = placement_.reduce_buckets[static_cast<std::size_t>(p.bucket)];
  const UnitId u = bucket.first;
  const auto rank = static_cast<std::size_t>(placement_.in.rank);
  char* base = static_cast<char*>(p.buffer.data());
  if (bucket.merged()) return {at(base, rank * bucket.shard, r_), bucket.shard};
  return {at(base, placement_.own_begin(u), r_), placement_.lay(u).shard};
}

void GradReducer::finish_replica() {
  Pending p = std::move(replicating_.front());
  replicating_.pop_front();
  p.handle.wait();
  if (!p.quant.empty()) {  // qgZ: every replica's chunk read back, summed in rank order
    const Reduced r = reduced_part(p);
    finish_quantized_all_reduce(*replicas_, dev_, p.quant.data(), r.data, r.count, r_,
                                placement_.in.quant_block, ReduceOp::kAvg);
  }
  accumulate_reduced(p);
}

// The reduced part (the members' shards, consecutive) into the accumulated shards, which the
// placement keeps consecutive in unit order too; then the buffers go back to their pools.
void GradReducer::accumulate_reduced(Pending& p) {
  const Reduced r = reduced_part(p);
  // A bucket's members share one gradient arena (the placement splits buckets there).
  const UnitId u = placement_.reduce_buckets[static_cast<std::size_t>(p.bucket)].first;
  const std::size_t rs = dtype_size(r_);
  if (!p.quant.empty()) quant_pool_.give(std::move(p.quant));
  char* dst = unit_acc(u);
  const bool first = micro_ == 0;
  if (!placement_.grads_on_host(u)) {
    dev_.accumulate(dst, r_, r.data, r_, r.count, first);
  } else {
    // The reduced shard to the host partition: the device-to-host traffic of ZeRO-Offload (on
    // the CPU device the same bytes, read straight from the reduce buffer).
    TraceScope region(observer_.tracer, TraceLane::kOffload, "reduced grads to host", u,
                      static_cast<std::int64_t>(r.count * rs));
    observer_.count(&IoCounters::device_to_host, r.count * rs);
    if (dev_.host_accessible()) {
      detail::accumulate(dst, r_, r.data, r_, r.count, first);
    } else {  // device -> host on the copy lane (the collective is complete), then on the host
      dev_.copy(grad_landing_.data(), r.data, r.count * rs, DeviceOps::Lane::kCopy);
      dev_.wait(dev_.record(DeviceOps::Lane::kCopy));
      detail::accumulate(dst, r_, grad_landing_.data(), r_, r.count, first);
    }
    if (final_micro_ && landed_) {
      const Bucket& b = placement_.reduce_buckets[static_cast<std::size_t>(p.bucket)];
      for (UnitId m = b.first; m <= b.last; ++m) landed_(m);
    }
  }
  if (p.source == Source::kBucketPool) --merged_in_flight_;
  give(p.source, std::move(p.buffer));
}

void GradReducer::give(Source s, Buffer b) {
  switch (s) {
    case Source::kGradPool: grad_pool_.give(std::move(b)); break;
    case Source::kReducePool: reduce_pool_.give(std::move(b)); break;
    case Source::kBucketPool: bucket_pool_.give(std::move(b)); break;
    case Source::kNone: break;
  }
}

void GradReducer::finish_all() {
  while (!pending_.empty()) finish_front();
  while (!replicating_.empty()) finish_replica();
}

void GradReducer::end_micro_step() {
  finish_all();
  for (UnitState& us : units_) us.ready = false;
  ++micro_;
}

void GradReducer::reduce_at_boundary() {
  const StagePolicy& pol = placement_.in.policy;
  if (pol.shard_gradients) return;  // reduced every micro-step
  if (!pol.shard_optimizer) {
    if (placement_.trainable_padded == 0) return;  // every unit frozen
    comm_.all_reduce(acc_base(), acc_base(), placement_.trainable_padded, r_, ReduceOp::kAvg);
    return;
  }
  const auto rank = static_cast<std::size_t>(placement_.in.rank);
  for (std::size_t b = 0; b < placement_.reduce_buckets.size(); ++b) {
    const Bucket& bucket = placement_.reduce_buckets[b];
    Pending p;
    p.bucket = static_cast<int>(b);
    p.boundary = true;
    if (!bucket.merged()) {  // in place on the whole unit
      char* base = unit_acc(bucket.first);
      comm_.tag_next(bucket.first, placement_.tag_layout(bucket));
      p.handle = reduce_async(base, at(base, placement_.own_begin(bucket.first), r_),
                              placement_.lay(bucket.first).shard);
      pending_.push_back(std::move(p));
      continue;
    }
    p.buffer = bucket_pool_.take();
    p.source = Source::kBucketPool;
    for (UnitId u = bucket.first; u <= bucket.last; ++u) {
      pack(dev_, unit_acc(u), r_,
           BucketSlot(p.buffer.data(), bucket, placement_.unit(u).reduce_offset,
                      placement_.lay(u).shard, r_),
           RankSelect::all(placement_.in.world_size));
    }
    char* base = static_cast<char*>(p.buffer.data());
    comm_.tag_next(bucket.first, placement_.tag_layout(bucket));
    p.handle = reduce_async(base, at(base, rank * bucket.shard, r_), bucket.shard);
    pending_.push_back(std::move(p));
    ++merged_in_flight_;
    while (merged_in_flight_ > placement_.max_in_flight) finish_front();
  }
  finish_all();
}

GradStats GradReducer::stats(UnitId u, const void* grad, std::size_t count) {
  // Where the reduced gradients live decides who reads them.
  return placement_.grads_on_host(u) ? host_.grad_stats(grad, r_, count)
                                     : dev_.grad_stats(grad, r_, count);
}

GradTotals GradReducer::totals() {
  const Layout& layout = placement_.layout;
  const std::size_t nu = layout.units.size();
  const int n = placement_.in.world_size;
  if (!placement_.in.policy.shard_optimizer) {
    GradTotals total;
    for (int q = 0; q < n; ++q) {
      double s = 0.0;
      for (std::size_t u = 0; u < nu; ++u) {
        const auto id = static_cast<UnitId>(u);
        if (placement_.unit(id).frozen) continue;
        const std::size_t shard = layout.units[u].shard;
        const GradStats g =
            stats(id, at(unit_acc(id), static_cast<std::size_t>(q) * shard, r_), shard);
        s += g.sum_squares;
        total.non_finite = total.non_finite || g.non_finite;
      }
      total.sum_squares += s;
    }
    return total;
  }
  double local = 0.0;
  bool bad = false;
  for (std::size_t u = 0; u < nu; ++u) {
    if (placement_.unit(static_cast<UnitId>(u)).frozen) continue;
    const auto id = static_cast<UnitId>(u);
    const GradStats g = stats(id, step_grads(id), layout.units[u].shard);
    local += g.sum_squares;
    bad = bad || g.non_finite;
  }
  // One all-gather of (sum, flag) from every rank: bits are copied, not reduced, so the sum
  // below runs in rank order on every rank, and every rank sees every overflow flag.
  float mine[4] = {0, 0, bad ? 1.0f : 0.0f, 0};
  std::memcpy(mine, &local, sizeof local);
  std::vector<float> all(static_cast<std::size_t>(4 * n));
  if (dev_.host_accessible()) {
    comm_.all_gather(mine, all.data(), 4, DType::kF32);
  } else {  // the communicator runs on device memory
    float* scratch = stats_scratch_.as<float>();
    dev_.copy(scratch, mine, sizeof mine);
    comm_.all_gather(scratch, scratch + 4, 4, DType::kF32);
    dev_.copy(all.data(), scratch + 4, all.size() * sizeof(float));
    dev_.synchronize();
  }
  GradTotals total;
  for (int q = 0; q < n; ++q) {
    double s = 0.0;
    std::memcpy(&s, &all[static_cast<std::size_t>(4 * q)], sizeof s);
    total.sum_squares += s;
    total.non_finite = total.non_finite || all[static_cast<std::size_t>(4 * q + 2)] != 0.0f;
  }
  return total;
}

GradReducer::Pools GradReducer::predicted_pools(const Placement& p, int grads_held) {
  Pools out;
  if (p.in.ownership != Ownership::kManaged) return out;
  out.grads = static_cast<std::size_t>(std::max(1, grads_held));
  std::size_t singles = 0, merged = 0;
  for (const Bucket& b : p.reduce_buckets) (b.merged() ? merged : singles) += 1;
  // Hybrid sharding (stages 2-3): up to max_in_flight reductions inside the group and as many
  // all-reduces across the replicas run at once, each holding its buffers.
  const bool replicated = p.in.replicas > 1 && p.in.policy.shard_gradients;
  const std::size_t in_flight = p.max_in_flight * (replicated ? 2 : 1);
  const std::size_t cap = in_flight + 1;  // in flight, plus the one being launched
  if (p.in.policy.shard_gradients && singles > 0) {
    if (p.in.working == p.in.reduce) {
      // A reduction in flight holds its unit's gradient buffer while the next unit's is written;
      // the trainer takes its last buffer when all but the `out.grads` it holds open are
      // reduced (after that no buffer is taken).
      const std::size_t before_last_take =
          p.reduce_buckets.size() > out.grads ? p.reduce_buckets.size() - out.grads : 0;
      out.grads += std::min({in_flight, singles, before_last_take});
    } else {
      out.reduce = std::min(cap, singles);
    }
  }
  if (p.in.policy.shard_optimizer && merged > 0) out.buckets = std::min(cap, merged);
  // qgZ: one staging buffer per reduction in flight, merged or not.
  if (p.in.quantized_gradients) out.quant = std::min(cap, p.reduce_buckets.size());
  return out;
}

}  // namespace zero::detail
