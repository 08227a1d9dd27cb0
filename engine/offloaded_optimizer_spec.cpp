// The offloaded optimizer's step during backward, offload_optimizer.overlap_step (see
// engine/offloaded_optimizer.hpp): SuperOffload's speculation then validation. A unit's step runs
// on a worker while the trainer's backward goes on, with the options known before the global
// norm (clip coefficient 1, the loss scaler's scale); its results are held apart from the state
// (a window of pinned buffers, the swap file's alternate slots) until the end of backward says
// whether they are the step's (no clipping, no overflow: commit) or not (dropped; the engine
// redoes the units in step(), or skips the step on overflow). Every result is computed by the
// same fused host step on the same inputs as step()'s, so a commit is bitwise today's step.
#include <algorithm>
#include <cstring>
#include <utility>

#include "engine/offloaded_optimizer.hpp"
#include "zero/core/error.hpp"
#include "zero/core/log.hpp"

namespace zero::detail {

using offload::ChunkSwapper;

OffloadedOptimizer::~OffloadedOptimizer() {
  if (!worker_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    jobs_.clear();
  }
  cv_.notify_all();
  worker_.join();
}

char* OffloadedOptimizer::window_part(std::size_t slot, int k) const {
  return window_[slot].as<char>() + placement_.spec_part_offset(k);
}

void OffloadedOptimizer::speculate(UnitId u, const StepOptions& options) {
  if (!placement_.in.overlap_step || placement_.unit(u).frozen) return;
  if (placement_.unit_chunk[static_cast<std::size_t>(u)] ==
      placement_.unit_chunk[static_cast<std::size_t>(u) + 1]) {
    return;  // on the device (a partial offload)
  }
  std::lock_guard<std::mutex> lock(mutex_);
  // The first unit of a step fixes its options (the worker reads them only while it has jobs).
  if (!spec_open_) spec_options_ = options;
  spec_open_ = true;
  jobs_.push_back({u, access_.grads(u)});
  if (!worker_.joinable()) worker_ = std::thread([this] { worker_loop(); });
  cv_.notify_all();
}

void OffloadedOptimizer::worker_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
    if (stop_) return;
    // Every unit landed so far, in one batch: units landing together (the reductions still in
    // flight at the end of backward) share one pass of the swapper's pipeline.
    std::vector<SpecJob> batch(jobs_.begin(), jobs_.end());
    jobs_.clear();
    busy_ = true;
    lock.unlock();
    std::exception_ptr error;
    int held = 0;
    try {
      if (spec_error_ == nullptr) held = spec_units(batch);  // after a failure the rest wait
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    spec_units_ += held;
    if (error != nullptr && spec_error_ == nullptr) spec_error_ = error;
    busy_ = false;
    cv_.notify_all();
  }
}

// On the worker: the batch's units' chunks stepped apart from the state, the pinned ones job by
// job, then the swap file's. Returns how many units had a chunk held.
int OffloadedOptimizer::spec_units(const std::vector<SpecJob>& batch) {
  int held_units = 0;
  std::vector<SpecJob> nvme;  // the units with chunks in the swap file
  for (const SpecJob& job : batch) {
    const auto ui = static_cast<std::size_t>(job.unit);
    const std::size_t c0 = placement_.unit_chunk[ui], c1 = placement_.unit_chunk[ui + 1];
    bool held = spec_pinned(job);
    // Before the file's first write there is nothing to read: stepped at the boundary.
    if (c1 > std::max(c0, placement_.nvme_chunk) && nvme_written_) {
      nvme.push_back(job);
      held = true;
    }
    held_units += held ? 1 : 0;
  }
  spec_nvme(std::move(nvme));
  return held_units;
}

// Chunk c of the speculative step on the given master, states and (16-bit working parameters)
// updated copy, with the gradients of its unit at `grads`.
ShardRef OffloadedOptimizer::spec_ref(std::size_t c, const char* grads, float* master,
                                      char* const* states, void* copy) const {
  const Chunk& ch = placement_.chunks[c];
  ShardRef part;
  part.count = ch.count;
  part.master = master;
  part.grad = grads + ch.at * dtype_size(r_);
  part.grad_dtype = r_;
  for (int k = 0; k < params_.num_states(); ++k) part.state[k] = states[k];
  if (w_ != DType::kF32) {
    part.param_copy = copy;
    part.param_copy_dtype = w_;
  }
  return part;
}

// The job's pinned chunks: copied into the window's next buffer and stepped there, while it
// lasts (the rest are stepped at the boundary). Whether any was held.
bool OffloadedOptimizer::spec_pinned(const SpecJob& job) {
  const StepOptions& o = spec_options_;
  const int ns = params_.num_states();
  const MomentDType sd = params_.state_dtype();
  const auto ui = static_cast<std::size_t>(job.unit);
  const std::size_t c0 = placement_.unit_chunk[ui], c1 = placement_.unit_chunk[ui + 1];
  bool held = false;
  for (std::size_t c = c0; c < std::min(c1, placement_.nvme_chunk); ++c) {
    if (window_used_ == window_.size()) break;
    const Chunk& ch = placement_.chunks[c];
    const std::size_t slot = window_used_++;
    char* st[2] = {};
    std::memcpy(window_part(slot, 0), master(ch.unit) + ch.at, ch.count * 4);
    for (int k = 0; k < ns; ++k) {
      st[k] = window_part(slot, 1 + k);
      std::memcpy(st[k], state(ch.unit, k) + state_bytes(sd, ch.at), state_bytes(sd, ch.count));
    }
    ShardRef part = spec_ref(c, job.grads, reinterpret_cast<float*>(window_part(slot, 0)), st,
                             window_part(slot, 1 + ns));
    host_step(o.groups, c, part, spec_runs_, o.step, o.grad_scale, "optimizer chunk (speculative)");
    spec_slot_[c] = slot + 1;
    held = true;
  }
  return held;
}

// The NVMe chunks of `nvme`'s units: read from the current slot, stepped in the staging buffer,
// written to the alternate slot; units whose chunks follow one another in one pass, in file
// order.
void OffloadedOptimizer::spec_nvme(std::vector<SpecJob> nvme) {
  const StepOptions& o = spec_options_;
  const int ns = params_.num_states();
  std::sort(nvme.begin(), nvme.end(),
            [](const SpecJob& a, const SpecJob& b) { return a.unit < b.unit; });
  const std::size_t base = placement_.nvme_chunk;
  for (std::size_t i = 0; i < nvme.size();) {
    const auto first_unit = static_cast<std::size_t>(nvme[i].unit);
    std::size_t j = i + 1;
    while (j < nvme.size() &&
           placement_.unit_chunk[static_cast<std::size_t>(nvme[j].unit)] ==
               placement_.unit_chunk[static_cast<std::size_t>(nvme[j - 1].unit) + 1]) {
      ++j;
    }
    const std::size_t first = std::max(placement_.unit_chunk[first_unit], base);
    const std::size_t last = placement_.unit_chunk[static_cast<std::size_t>(nvme[j - 1].unit) + 1];
    std::size_t k = i;  // the job whose unit holds the chunk being stepped (chunks ascend)
    swapper_->run(
        first - base, last - base, /*read=*/true, /*write=*/true,
        [&](const ChunkSwapper::Staged& s) {
          const std::size_t c = base + s.chunk;
          while (placement_.chunks[c].unit != nvme[k].unit) ++k;
          ShardRef part = spec_ref(c, nvme[k].grads, reinterpret_cast<float*>(s.part[0]),
                                   s.part + 1, w_ != DType::kF32 ? s.part[1 + ns] : nullptr);
          host_step(o.groups, c, part, spec_runs_, o.step, o.grad_scale,
                    "optimizer chunk (speculative)");
        },
        /*to_alternate=*/true);
    for (std::size_t c = first; c < last; ++c) spec_slot_[c] = 1;
    i = j;
  }
}

Settled OffloadedOptimizer::settle(bool commit) {
  Settled out;
  if (!placement_.in.overlap_step) return out;
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return jobs_.empty() && !busy_; });
    error = std::exchange(spec_error_, nullptr);
    out.units = std::exchange(spec_units_, 0);
    spec_open_ = false;
  }
  if (error == nullptr && commit) {
    for (std::size_t c = 0; c < spec_slot_.size(); ++c) {
      if (spec_slot_[c] != 0) ++out.chunks_committed;
    }
    if (out.chunks_committed > 0) commit_speculated();
  }
  // Dropped or committed, the held results are spent (an alternate slot is simply unused).
  spec_slot_.assign(spec_slot_.size(), 0);
  window_used_ = 0;
  if (error != nullptr) std::rethrow_exception(error);
  return out;
}

// The speculative chunks' results become the state; their updated parameters go out.
void OffloadedOptimizer::commit_speculated() {
  TraceScope region(observer_.tracer, TraceLane::kOptimizer, "commit");
  // The copy lane writes the working parameters after the trainer's compute that reads them.
  dev_.join(DeviceOps::Lane::kCopy, DeviceOps::Lane::kCompute);
  const int ns = params_.num_states();
  const MomentDType sd = params_.state_dtype();
  std::vector<std::size_t> nvme;
  for (std::size_t c = 0; c < spec_slot_.size(); ++c) {
    if (spec_slot_[c] == 0) continue;
    committed_[c] = true;
    if (c >= placement_.nvme_chunk) {
      swapper_->flip(c - placement_.nvme_chunk);
      nvme.push_back(c - placement_.nvme_chunk);
      continue;
    }
    const Chunk& ch = placement_.chunks[c];
    const std::size_t slot = spec_slot_[c] - 1;
    std::memcpy(master(ch.unit) + ch.at, window_part(slot, 0), ch.count * 4);
    for (int k = 0; k < ns; ++k) {
      std::memcpy(state(ch.unit, k) + state_bytes(sd, ch.at), window_part(slot, 1 + k),
                  state_bytes(sd, ch.count));
    }
    params_out(c, window_part(slot, w_ != DType::kF32 ? 1 + ns : 0));
  }
  if (nvme.empty()) return;
  // The updated parameters of the NVMe chunks: the copy part of their (now current) slots, or
  // in fp32 training the master.
  const std::size_t part = w_ != DType::kF32 ? static_cast<std::size_t>(1 + ns) : 0;
  swapper_->read_part(nvme, part, [&](std::size_t slot, const char* data) {
    params_out(placement_.nvme_chunk + slot, data);
  });
}

void OffloadedOptimizer::params_out(std::size_t c, const void* updated) {
  const Chunk& ch = placement_.chunks[c];
  const std::size_t bytes = ch.count * dtype_size(w_);
  const TraceClock::time_point begin = trace_now();
  dev_.copy(access_.params(ch.unit) + ch.at * dtype_size(w_), updated, bytes,
            DeviceOps::Lane::kCopy);
  observer_.count(&IoCounters::host_to_device, bytes);
  dev_.wait(dev_.record(DeviceOps::Lane::kCopy));  // `updated` is reused (a staging buffer)
  trace_copy_out(begin, c, bytes, 0);
}

}  // namespace zero::detail
