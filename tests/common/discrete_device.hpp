// tests/common/discrete_device.hpp — a discrete device on the CPU, for the engine and offload
// tests: the engine's code for a device whose memory the host cannot address (a GPU) runs and is
// checked here, without a GPU.
//
// Its memory is host memory handed out at addresses with bit 47 set: not canonical on x86-64, so
// a host access that does not go through the DeviceOps (or the communicator wrapper below, the
// role NCCL plays for a GPU) is a segmentation fault, not a silent read. Every operation strips
// the tag and runs the CPU device's code, so results must be bitwise those of the CPU device.
// Thread safety: as the CPU device it wraps (one device per rank, its rank's thread).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>

#include "zero/comm/comm.hpp"
#include "zero/core/error.hpp"
#include "zero/device/device_ops.hpp"

namespace zero::testing {

constexpr std::uintptr_t kDeviceTag = std::uintptr_t{1} << 47;

template <typename T>
T* untag(T* p) {
  return reinterpret_cast<T*>(reinterpret_cast<std::uintptr_t>(p) & ~kDeviceTag);
}

class DiscreteCpuDevice final : public CpuDeviceOps {
 public:
  bool host_accessible() const noexcept override { return false; }
  Buffer alloc(MemoryTracker& tracker, MemCategory c, std::size_t bytes,
               AllocOptions opts = {}) override {
    Buffer b = Buffer::external(
        tracker, c, MemTier::kDevice, Device::cpu(), bytes,
        [](std::size_t n) -> void* {
          void* p = std::aligned_alloc(64, (n + 63) / 64 * 64);
          ZERO_CHECK(p != nullptr, kOutOfMemory, "discrete device: ", n, " bytes");
          return reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(p) | kDeviceTag);
        },
        [](void* p) { std::free(untag(p)); });
    if (opts.zero) CpuDeviceOps::fill(untag(b.data()), 0, bytes);
    return b;
  }
  void fill(void* dst, unsigned char byte, std::size_t bytes) override {
    CpuDeviceOps::fill(untag(dst), byte, bytes);
  }
  void copy(void* dst, const void* src, std::size_t bytes, Lane lane = Lane::kCompute) override {
    ++copies;
    CpuDeviceOps::copy(untag(dst), untag(src), bytes, lane);
  }
  void convert(const void* src, DType st, void* dst, DType dt, std::size_t n) override {
    CpuDeviceOps::convert(untag(src), st, untag(dst), dt, n);
  }
  void accumulate(void* dst, DType dt, const void* src, DType st, std::size_t n,
                  bool first) override {
    CpuDeviceOps::accumulate(untag(dst), dt, untag(src), st, n, first);
  }
  void init_state(const OptimizerParams& p, const ShardRef& s) override {
    CpuDeviceOps::init_state(p, host_ref(s));
  }
  void optimizer_step(const OptimizerParams& p, const ShardRef* shards, std::size_t count,
                      std::int64_t step, float grad_scale) override {
    for (std::size_t k = 0; k < count; ++k) {
      const ShardRef s = host_ref(shards[k]);
      CpuDeviceOps::optimizer_step(p, &s, 1, step, grad_scale);
    }
  }
  GradStats grad_stats(const void* grad, DType dtype, std::size_t count) override {
    return CpuDeviceOps::grad_stats(untag(grad), dtype, count);
  }
  void quantize_int8(const void* src, DType dtype, std::size_t count, std::size_t block,
                     std::int8_t* q, float* scales) override {
    CpuDeviceOps::quantize_int8(untag(src), dtype, count, block, untag(q), untag(scales));
  }
  void dequantize_sum_int8(const char* chunks, std::size_t stride, std::size_t scales_offset, int n,
                           std::size_t count, std::size_t block, float divisor, void* dst,
                           DType dtype) override {
    CpuDeviceOps::dequantize_sum_int8(untag(chunks), stride, scales_offset, n, count, block,
                                      divisor, untag(dst), dtype);
  }

  long copies = 0;  // copies issued (host <-> device traffic and device-internal)

 private:
  static ShardRef host_ref(ShardRef s) {
    s.master = untag(s.master);
    s.grad = untag(s.grad);
    s.state[0] = untag(s.state[0]);
    s.state[1] = untag(s.state[1]);
    s.param_copy = untag(s.param_copy);
    return s;
  }
};

// The in-process communicator over the discrete device's memory (what NCCL is to a GPU).
class DiscreteComm final : public Communicator {
 public:
  explicit DiscreteComm(Communicator& inner)
      : Communicator(inner.rank(), inner.size(), inner.world_ranks(), inner.timeout_s()),
        inner_(inner) {}
  std::string_view backend() const noexcept override { return "discrete"; }

 protected:
  CommHandle start(const detail::CollectiveArgs& a) override {
    const void* s = untag(a.send);
    void* r = untag(a.recv);
    switch (a.kind) {
      case Collective::kAllReduce: return inner_.all_reduce_async(s, r, a.count, a.dtype, a.op);
      case Collective::kReduceScatter:
        return inner_.reduce_scatter_async(s, r, a.count, a.dtype, a.op);
      case Collective::kAllGather: return inner_.all_gather_async(s, r, a.count, a.dtype);
      case Collective::kBroadcast: return inner_.broadcast_async(s, r, a.count, a.dtype, a.root);
      case Collective::kBarrier: return inner_.barrier_async();
      case Collective::kAllToAll: return inner_.all_to_all_async(s, r, a.count, a.dtype);
    }
    ZERO_THROW(kInternal, "unknown collective");
  }
  std::unique_ptr<Communicator> split_impl(int, int) override {
    ZERO_THROW(kInvalidArgument, "DiscreteComm: split is not supported");
  }

 private:
  Communicator& inner_;
};

}  // namespace zero::testing
