// The offloaded optimizer's chunk pipeline (see engine/offloaded_optimizer.hpp).
#include "engine/offloaded_optimizer.hpp"

#include <cstring>
#include <string>
#include <utility>

#include "device/host_staging.hpp"
#include "zero/core/error.hpp"

namespace zero::detail {

using offload::ChunkSwapper;

OffloadedOptimizer::OffloadedOptimizer(const Placement& placement, DeviceOps& dev,
                                       const CpuOptimizer& host, const OptimizerParams& params,
                                       MemoryTracker& tracker, ShardAccess& access,
                                       Observer observer)
    : placement_(placement),
      dev_(dev),
      host_(host),
      params_(params),
      tracker_(tracker),
      access_(access),
      w_(placement.in.working),
      r_(placement.in.reduce),
      observer_(observer) {
  ZERO_CHECK(placement.offloaded, kInternal, "OffloadedOptimizer without optimizer offload");
  master_ = allocate(placement.host_master, dev, tracker, {.zero = true});
  for (int k = 0; k < params.num_states(); ++k) {
    state_.push_back(allocate(placement.host_state, dev, tracker));
  }
  for (std::size_t b = 0; b < placement.in.offload_buffers; ++b) {
    staging_grad_.push_back(allocate(placement.staging_grad, dev, tracker));
    staging_param_.push_back(allocate(placement.staging_param, dev, tracker));
  }
  for (std::size_t b = 0; b < placement.spec_chunks; ++b) {
    window_.push_back(allocate(placement.spec_window, dev, tracker));
  }
  if (placement.in.overlap_step) {
    spec_slot_.assign(placement.chunks.size(), 0);
    committed_.assign(placement.chunks.size(), false);
  }
  if (placement.nvme_optimizer) {
    ChunkSwapper::Options so = placement.in.optim_swap;
    so.aio.observer = observer;
    swapper_ = std::make_unique<ChunkSwapper>(tracker, placement.optim_chunk_elems,
                                              placement.optim_parts, std::move(so));
  }
  // Zero the pinned state in the partitioning the step uses (first touch lands here).
  for (UnitId u = 0; u < static_cast<UnitId>(placement.num_units()); ++u) {
    if (!pinned(u)) continue;  // frozen (no state), on the device or in the swap file
    ShardRef ref;
    ref.count = placement.unit(u).step_count;
    for (int k = 0; k < params.num_states(); ++k) ref.state[k] = state(u, k);
    host.init_state(params, ref);
  }
}

bool OffloadedOptimizer::pinned(UnitId u) const {
  const UnitPlacement& up = placement_.unit(u);
  return !up.frozen && up.optim_tier == Tier::kPinned;
}

float* OffloadedOptimizer::master(UnitId u) {
  ZERO_CHECK(placement_.optim_tier(u) != Tier::kNvme, kInvalidArgument,
             "the master lives in NVMe files (offload_optimizer.device = nvme); use "
             "copy_master_shard()");
  return master_.as<float>() + placement_.unit(u).optim_offset;
}

char* OffloadedOptimizer::state(UnitId u, int k) {
  ZERO_CHECK(placement_.optim_tier(u) != Tier::kNvme, kInvalidArgument,
             "the optimizer state lives in NVMe files (offload_optimizer.device = nvme); use "
             "copy_state_shard()");
  return state_[static_cast<std::size_t>(k)].as<char>() +
         state_bytes(params_.state_dtype(), placement_.unit(u).optim_offset);
}

// One chunk: gradients in, the fused step on the host, the updated parameters out.
void OffloadedOptimizer::chunk_step(const std::vector<OptimizerParams>& groups, std::size_t c,
                                    float* master_part, char* const* state_part, std::int64_t step,
                                    float grad_scale) {
  const Chunk& ch = placement_.chunks[c];
  const std::size_t rs = dtype_size(r_), ws = dtype_size(w_);
  const std::size_t buffers = placement_.in.offload_buffers;
  const std::size_t b = c % buffers;
  const char* grad = access_.grads(ch.unit) + ch.at * rs;
  if (!placement_.grads_on_host(ch.unit)) {
    // Double-buffered: chunk c + 1's gradients are copied in while chunk c steps (with two or
    // more buffers; the buffer it takes was last used by a chunk already stepped).
    const std::size_t ahead = std::min(placement_.chunks.size(), c + (buffers > 1 ? 2 : 1));
    while (grads_issued_ < ahead) issue_grad_copy(grads_issued_++);
    dev_.wait(grad_fence_[b]);
    if (observer_.tracer != nullptr) [[unlikely]] {
      const CopyInFlight& g = grad_copy_[b];
      observer_.tracer->record(TraceLane::kOffload, "grads to host", g.begin, TraceClock::now(),
                               static_cast<std::int64_t>(g.chunk),
                               static_cast<std::int64_t>(g.bytes));
    }
    grad = static_cast<const char*>(staging_grad_[b].data());
  }
  ShardRef part;
  part.count = ch.count;
  part.master = master_part;
  part.grad = grad;
  part.grad_dtype = r_;
  for (int k = 0; k < params_.num_states(); ++k) part.state[k] = state_part[k];
  char* params = access_.params(ch.unit) + ch.at * ws;
  if (w_ != DType::kF32) {
    if (param_fence_[b] != 0) {
      const std::uint64_t fence = std::exchange(param_fence_[b], 0);
      dev_.wait(fence);
      copies_out_waited(fence);
    }
    part.param_copy = staging_param_[b].data();
    part.param_copy_dtype = w_;
  }
  host_step(groups, c, part, runs_, step, grad_scale, "optimizer chunk");
  // fp32: the parameters are the master's copy.
  const void* updated = w_ != DType::kF32 ? part.param_copy : part.master;
  const bool in_window = access_.params_on_nvme(ch.unit);
  if (in_window) {
    std::memcpy(params, updated, ch.count * ws);  // the window is host memory
  } else {
    const TraceClock::time_point copy_begin = trace_now();
    dev_.copy(params, updated, ch.count * ws, DeviceOps::Lane::kCopy);
    observer_.count(&IoCounters::host_to_device, ch.count * ws);
    if (w_ != DType::kF32) {
      param_fence_[b] = dev_.record(DeviceOps::Lane::kCopy);
      trace_copy_out(copy_begin, c, ch.count * ws, param_fence_[b]);
    } else if (placement_.optim_tier(ch.unit) == Tier::kNvme) {
      dev_.wait(dev_.record(DeviceOps::Lane::kCopy));  // the swapper reuses the master's buffer
      trace_copy_out(copy_begin, c, ch.count * ws, 0);
    } else if (observer_.tracer != nullptr) [[unlikely]] {
      // Nothing waits for this copy before the step's end: a point for its region alone.
      trace_copy_out(copy_begin, c, ch.count * ws, dev_.record(DeviceOps::Lane::kCopy));
    }
  }
  // The window now holds the unit's whole updated shard: back to its file slot.
  if (in_window && ch.at + ch.count == placement_.unit(ch.unit).step_count) {
    access_.store_params(ch.unit);
  }
}

void OffloadedOptimizer::host_step(const std::vector<OptimizerParams>& groups, std::size_t c,
                                   ShardRef& part, std::vector<StepRun>& runs, std::int64_t step,
                                   float grad_scale, const char* what) {
  const Chunk& ch = placement_.chunks[c];
  const std::size_t bytes = ch.count * 4 + static_cast<std::size_t>(params_.num_states()) *
                                               state_bytes(params_.state_dtype(), ch.count);
  TraceScope region(observer_.tracer, TraceLane::kOptimizer, what, static_cast<std::int64_t>(c),
                    static_cast<std::int64_t>(bytes));
  // The chunk in one call with each parameter group's runs of it (an int8 quantization block
  // may span two groups' runs).
  runs.clear();
  placement_.for_each_run(ch.unit, ch.at, ch.count, [&](std::size_t at, std::size_t n, int g) {
    runs.push_back({at - ch.at, n, g});
  });
  host_.step(groups.data(), groups.size(), part, runs.data(), runs.size(), step, grad_scale);
}

// Chunk c's gradients (stage 1: on the device) into its staging buffer, on the copy lane.
void OffloadedOptimizer::issue_grad_copy(std::size_t c) {
  const Chunk& ch = placement_.chunks[c];
  const std::size_t rs = dtype_size(r_), b = c % placement_.in.offload_buffers;
  const TraceClock::time_point begin = trace_now();
  dev_.copy(staging_grad_[b].data(), access_.grads(ch.unit) + ch.at * rs, ch.count * rs,
            DeviceOps::Lane::kCopy);
  grad_fence_[b] = dev_.record(DeviceOps::Lane::kCopy);
  observer_.count(&IoCounters::device_to_host, ch.count * rs);
  if (observer_.tracer != nullptr) [[unlikely]] {
    grad_copy_[b] = {begin, grad_fence_[b], c, ch.count * rs};  // ends at chunk c's wait
  }
}

// ---- observation

TraceClock::time_point OffloadedOptimizer::trace_now() const {
  return observer_.tracer != nullptr ? TraceClock::now() : TraceClock::time_point{};
}

void OffloadedOptimizer::trace_copy_out(TraceClock::time_point begin, std::size_t c,
                                        std::size_t bytes, std::uint64_t fence) {
  if (observer_.tracer == nullptr) [[likely]] {
    return;
  }
  if (fence == 0) {
    record_copy_out({begin, 0, c, bytes}, TraceClock::now());
    return;
  }
  copies_out_.push_back({begin, fence, c, bytes});
}

void OffloadedOptimizer::copies_out_waited(std::uint64_t fence) {
  if (observer_.tracer == nullptr || copies_out_.empty()) [[likely]] {
    return;
  }
  const TraceClock::time_point now = TraceClock::now();
  std::erase_if(copies_out_, [&](const CopyInFlight& copy) {
    if (copy.fence != fence) return false;
    record_copy_out(copy, now);
    return true;
  });
}

void OffloadedOptimizer::all_copies_out_waited() {
  if (observer_.tracer == nullptr || copies_out_.empty()) [[likely]] {
    return;
  }
  const TraceClock::time_point now = TraceClock::now();
  for (const CopyInFlight& copy : copies_out_) record_copy_out(copy, now);
  copies_out_.clear();
}

void OffloadedOptimizer::record_copy_out(const CopyInFlight& copy, TraceClock::time_point end) {
  observer_.tracer->record(TraceLane::kOffload, "params to device", copy.begin, end,
                           static_cast<std::int64_t>(copy.chunk),
                           static_cast<std::int64_t>(copy.bytes));
}

// On a discrete device to_host_f32 copies the parameters to the host first; on the CPU device
// it reads them in place. Counted alike, as device -> host traffic.
void OffloadedOptimizer::master_from_params(const char* src, bool on_device, float* out,
                                            std::size_t n, std::int64_t chunk) {
  const std::size_t bytes = n * dtype_size(w_);
  TraceScope region(on_device ? observer_.tracer : nullptr, TraceLane::kOffload, "params to host",
                    chunk, static_cast<std::int64_t>(bytes));
  to_host_f32(dev_, tracker_, src, w_, on_device, out, n);
  if (on_device) observer_.count(&IoCounters::device_to_host, bytes);
}

void OffloadedOptimizer::step(const std::vector<OptimizerParams>& p, std::int64_t step,
                              float grad_scale) {
  // The copy lane starts after the gradients are complete; the host's next writes to the master
  // and the trainer's next forward come after the last parameter copy.
  dev_.join(DeviceOps::Lane::kCopy, DeviceOps::Lane::kCompute);
  param_fence_.assign(placement_.in.offload_buffers, 0);
  grad_fence_.assign(placement_.in.offload_buffers, 0);
  grads_issued_ = 0;
  if (observer_.tracer != nullptr) [[unlikely]] {
    grad_copy_.assign(placement_.in.offload_buffers, CopyInFlight{});
    copies_out_.clear();  // a step that threw left its copies behind
  }
  // The pinned tier's chunks in place, then the swap file's through its staging slots (one
  // chunk sequence: the staging buffers and the gradient copies run on across both).
  if (placement_.nvme_optimizer) write_nvme_state();
  // overlap_step: the chunks a settle() committed are stepped already (taken here, so that a
  // step that throws leaves none marked for the next).
  const std::vector<bool> committed =
      std::exchange(committed_, std::vector<bool>(committed_.size(), false));
  auto done = [&](std::size_t c) { return !committed.empty() && committed[c]; };
  for (std::size_t c = 0; c < placement_.nvme_chunk; ++c) {
    if (done(c)) continue;
    const Chunk& ch = placement_.chunks[c];
    char* st[2] = {};
    for (int k = 0; k < params_.num_states(); ++k) {
      st[k] = state(ch.unit, k) + state_bytes(params_.state_dtype(), ch.at);
    }
    chunk_step(p, c, master(ch.unit) + ch.at, st, step, grad_scale);
  }
  if (placement_.nvme_optimizer) {
    // Each run of chunks not committed through the swapper's pipeline.
    const std::size_t first = placement_.nvme_chunk, slots = placement_.optim_chunk_elems.size();
    for (std::size_t lo = 0; lo < slots;) {
      if (done(first + lo)) {
        ++lo;
        continue;
      }
      std::size_t hi = lo + 1;
      while (hi < slots && !done(first + hi)) ++hi;
      swapper_->run(lo, hi, /*read=*/true, /*write=*/true, [&](const ChunkSwapper::Staged& s) {
        chunk_step(p, first + s.chunk, reinterpret_cast<float*>(s.part[0]), s.part + 1, step,
                   grad_scale);
      });
      lo = hi;
    }
  }
  dev_.wait(dev_.record(DeviceOps::Lane::kCopy));
  all_copies_out_waited();
  dev_.join(DeviceOps::Lane::kCompute, DeviceOps::Lane::kCopy);
}

// NVMe: the first time the state is needed, the file is written chunk by chunk: the master from
// the working parameters (as set_param makes it), the optimizer state zeroed.
void OffloadedOptimizer::write_nvme_state() {
  if (nvme_written_) return;
  swapper_->run(0, placement_.optim_chunk_elems.size(), /*read=*/false, /*write=*/true,
                [&](const ChunkSwapper::Staged& s) {
                  const std::size_t c = placement_.nvme_chunk + s.chunk;
                  const Chunk& ch = placement_.chunks[c];
                  const bool in_window = access_.params_on_nvme(ch.unit);
                  if (ch.at == 0 && in_window) access_.load_params(ch.unit);
                  master_from_params(access_.params(ch.unit) + ch.at * dtype_size(w_), !in_window,
                                     reinterpret_cast<float*>(s.part[0]), ch.count,
                                     static_cast<std::int64_t>(c));
                  ShardRef z;
                  z.count = ch.count;
                  for (int k = 0; k < params_.num_states(); ++k) z.state[k] = s.part[1 + k];
                  host_.init_state(params_, z);
                });
  nvme_written_ = true;
}

// NVMe: runs fn(chunk, staged) over unit u's chunks, read first and (write) written back.
void OffloadedOptimizer::nvme_unit_pass(
    UnitId u, bool write,
    const std::function<void(const Chunk&, const ChunkSwapper::Staged&)>& fn) {
  write_nvme_state();
  const auto ui = static_cast<std::size_t>(u);
  const std::size_t first = placement_.nvme_chunk;  // the swap file's slot 0
  swapper_->run(placement_.unit_chunk[ui] - first, placement_.unit_chunk[ui + 1] - first,
                /*read=*/true, write,
                [&](const ChunkSwapper::Staged& s) { fn(placement_.chunks[first + s.chunk], s); });
}

void OffloadedOptimizer::copy_master(UnitId u, float* out) {
  if (placement_.optim_tier(u) != Tier::kNvme) {
    std::memcpy(out, master(u), placement_.unit(u).step_count * 4);
    return;
  }
  nvme_unit_pass(u, /*write=*/false, [&](const Chunk& ch, const ChunkSwapper::Staged& s) {
    std::memcpy(out + ch.at, s.part[0], ch.count * 4);
  });
}

void OffloadedOptimizer::copy_state(UnitId u, int k, void* out) {
  const MomentDType t = params_.state_dtype();
  if (placement_.optim_tier(u) != Tier::kNvme) {
    std::memcpy(out, state(u, k), state_bytes(t, placement_.unit(u).step_count));
    return;
  }
  nvme_unit_pass(u, /*write=*/false, [&](const Chunk& ch, const ChunkSwapper::Staged& s) {
    std::memcpy(static_cast<char*>(out) + state_bytes(t, ch.at), s.part[1 + k],
                state_bytes(t, ch.count));
  });
}

void OffloadedOptimizer::refresh_master(UnitId u, std::size_t lo, std::size_t hi) {
  const bool on_device = !access_.params_on_nvme(u);
  if (placement_.optim_tier(u) != Tier::kNvme) {
    master_from_params(access_.params(u) + lo * dtype_size(w_), on_device, master(u) + lo, hi - lo,
                       -1);
    return;
  }
  // Before the file is first written it is made from the working copy; after, the chunks that
  // hold [lo, hi) are read, patched and written back.
  if (!nvme_written_) return;
  nvme_unit_pass(u, /*write=*/true, [&](const Chunk& ch, const ChunkSwapper::Staged& s) {
    const std::size_t clo = std::max(lo, ch.at), chi = std::min(hi, ch.at + ch.count);
    if (clo >= chi) return;
    master_from_params(access_.params(u) + clo * dtype_size(w_), on_device,
                       reinterpret_cast<float*>(s.part[0]) + (clo - ch.at), chi - clo,
                       static_cast<std::int64_t>(s.chunk));
  });
}

void OffloadedOptimizer::load_unit(UnitId u, const float* master, const void* const* states) {
  const MomentDType t = params_.state_dtype();
  if (placement_.optim_tier(u) != Tier::kNvme) {
    const std::size_t n = placement_.unit(u).step_count;
    std::memcpy(this->master(u), master, n * 4);
    for (int k = 0; k < params_.num_states(); ++k) {
      std::memcpy(state(u, k), states[k], state_bytes(t, n));
    }
    return;
  }
  nvme_unit_pass(u, /*write=*/true, [&](const Chunk& ch, const ChunkSwapper::Staged& s) {
    std::memcpy(s.part[0], master + ch.at, ch.count * 4);
    for (int k = 0; k < params_.num_states(); ++k) {
      std::memcpy(s.part[1 + k], static_cast<const char*>(states[k]) + state_bytes(t, ch.at),
                  state_bytes(t, ch.count));
    }
  });
}

}  // namespace zero::detail
