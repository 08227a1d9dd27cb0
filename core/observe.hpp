// core/observe.hpp — what the engine's rooms report their work to: the tracer (a timeline;
// null when tracing is off) and the byte counters behind StepMetrics' offload figures.
//
// Thread safety: IoCounters are atomics (the I/O threads count too); the tracer is thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "zero/core/trace.hpp"

namespace zero::detail {

struct IoCounters {
  std::atomic<std::uint64_t> host_to_device{0};  // offload: pinned host memory -> the device
  std::atomic<std::uint64_t> device_to_host{0};  // offload: the device -> pinned host memory
  std::atomic<std::uint64_t> nvme_read{0};       // bytes read from the swap files
  std::atomic<std::uint64_t> nvme_write{0};      // bytes written to them
  static void add(std::atomic<std::uint64_t>& c, std::uint64_t bytes) {
    c.fetch_add(bytes, std::memory_order_relaxed);
  }
};

struct Observer {
  Tracer* tracer = nullptr;  // null: tracing off (each site is one branch)
  IoCounters* io = nullptr;  // null: not counted (rooms used outside an engine, tests)

  // Adds `bytes` to one of the counters when there are counters: count(&IoCounters::nvme_read, n).
  void count(std::atomic<std::uint64_t> IoCounters::*counter, std::uint64_t bytes) const {
    if (io != nullptr) IoCounters::add(io->*counter, bytes);
  }
};

// Times one phase into a seconds counter (always) and a region on the tracer (when on).
class PhaseTimer {
 public:
  PhaseTimer(double& seconds, Tracer* tracer, TraceLane lane, const char* name,
             std::int64_t unit = -1)
      : seconds_(seconds), scope_(tracer, lane, name, unit), t0_(TraceClock::now()) {}
  ~PhaseTimer() { seconds_ += std::chrono::duration<double>(TraceClock::now() - t0_).count(); }
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

 private:
  double& seconds_;
  TraceScope scope_;
  TraceClock::time_point t0_;
};

}  // namespace zero::detail
