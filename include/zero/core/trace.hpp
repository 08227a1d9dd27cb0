// zero/core/trace.hpp — a timeline of one rank's run: what the engine, its communicator, the
// offload tiers and the trainer did and when, kept in a bounded ring and written as Chrome
// trace JSON (chrome://tracing, https://ui.perfetto.dev: one process per rank, one track per
// lane).
//
// Who records: the trainer (TraceScope around its own regions: forward / backward of a unit),
// the engine (gather waits, grads_ready, the phases of step()), the communicator (each
// collective's execution on the thread that runs it, its time in flight from issue to
// completion, and every wait of the caller on it: the exposed part), the offloaded optimizer
// (chunks, host<->device copies) and the NVMe queue (each read / write from submit to
// completion). A Tracer is attached with EngineOptions::tracer (or the config's
// `trace.enabled`, and the engine owns one: Engine::tracer()).
//
// Cost: with no tracer attached every recording site is one branch on a null pointer. With
// one, a region costs two clock reads and one short critical section (the ring's mutex):
// bench_trace measures both, and zero-bench --trace reports the step time against the same
// run without.
//
// With a CUDA build the regions recorded through TraceScope on the calling thread are NVTX
// ranges too (Nsight Systems shows them beside the kernels).
//
// Thread safety: a Tracer is safe for concurrent access from multiple threads (one mutex);
// record() is called from the rank's thread, the communicator's worker and the I/O threads.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace zero {

// The tracks of one rank. Regions of one lane nest or follow each other when they come from one
// thread; where they overlap without nesting (collectives in flight, NVMe requests) the writer
// spreads them over sub-tracks of the lane.
enum class TraceLane : std::uint8_t {
  kTrainer,       // the trainer's marked regions (TraceScope in its code)
  kEngine,        // inside the engine's hooks: gather, grads_ready, step and its phases
  kComm,          // a collective executing (started -> finished, on the thread that runs it)
  kCommInFlight,  // a collective from issue to completion
  kCommWait,      // the rank's thread blocked on a collective: exposed communication
  kOptimizer,     // optimizer work on this rank's shards (per chunk with offload)
  kOffload,       // copies between the device and pinned host memory
  kNvme,          // NVMe reads and writes, submit -> completion
};
inline constexpr std::size_t kNumTraceLanes = 8;
std::string_view to_string(TraceLane lane) noexcept;

// One region. Times are steady_clock nanoseconds since its epoch (one clock for every thread of
// a process, and CLOCK_MONOTONIC for every process of a Linux machine).
struct TraceEvent {
  std::int64_t begin_ns = 0;
  std::int64_t end_ns = 0;
  const char* name = "";    // static storage (a string literal): the ring stores the pointer
  std::int64_t unit = -1;   // the unit / chunk / slot the region is about; -1: none
  std::int64_t bytes = -1;  // bytes moved; -1: none
  std::int64_t seq = -1;    // the collective's index on its communicator (CollectiveEvent::seq)
  TraceLane lane = TraceLane::kTrainer;
};

using TraceClock = std::chrono::steady_clock;

inline std::int64_t trace_ns(TraceClock::time_point t) noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

class Tracer {
 public:
  static constexpr std::size_t kDefaultCapacity = std::size_t{1} << 20;  // events (~56 MiB)

  // Keeps the last `capacity` events of rank `rank` (older ones are dropped and counted).
  // REQUIRES: capacity >= 1.
  explicit Tracer(int rank, std::size_t capacity = kDefaultCapacity);
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  int rank() const noexcept { return rank_; }
  std::size_t capacity() const noexcept { return capacity_; }

  // Records a finished region. `name` must outlive the tracer (a string literal).
  void record(TraceLane lane, const char* name, TraceClock::time_point begin,
              TraceClock::time_point end, std::int64_t unit = -1, std::int64_t bytes = -1,
              std::int64_t seq = -1);
  void record(const TraceEvent& event);

  // The kept events, oldest recorded first; and how many were dropped from the ring.
  std::vector<TraceEvent> events() const;
  std::uint64_t dropped() const;
  void clear();

 private:
  const int rank_;
  const std::size_t capacity_;
  mutable std::mutex mu_;
  std::vector<TraceEvent> ring_;  // grows to capacity_, then wraps at head_
  std::size_t head_ = 0;
  std::uint64_t dropped_ = 0;
};

// A region from construction to destruction. With a null tracer: one branch, nothing else.
class TraceScope {
 public:
  TraceScope(Tracer* tracer, TraceLane lane, const char* name, std::int64_t unit = -1,
             std::int64_t bytes = -1)
      : tracer_(tracer) {
    if (tracer_ != nullptr) [[unlikely]] {
      begin(lane, name, unit, bytes);
    }
  }
  ~TraceScope() {
    if (tracer_ != nullptr) [[unlikely]] {
      end();
    }
  }
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  void begin(TraceLane lane, const char* name, std::int64_t unit, std::int64_t bytes);
  void end();
  Tracer* tracer_;
  TraceEvent event_;
};

// ---- Chrome trace JSON (the "JSON Array/Object Format" of the Trace Event Format)
//
// One process per rank (pid = rank, named "rank r"), one thread per lane and sub-track (tid =
// 100 x lane + sub-track, named after the lane), "B"/"E" pairs that nest on every track, ts in
// microseconds from `origin_ns` (the earliest event when negative). Each region's unit, bytes and
// seq are its args. `dropped` events are named in the metadata.

// The events of one rank as the comma-separated members of a traceEvents array (no brackets):
// fragments of several ranks (from other processes too) join with commas.
std::string chrome_trace_fragment(int rank, const std::vector<TraceEvent>& events,
                                  std::int64_t origin_ns, std::uint64_t dropped = 0);
// A whole trace document of the given ranks' tracers.
void write_chrome_trace(std::ostream& out, const std::vector<const Tracer*>& ranks);
// The earliest begin over the tracers (0 when all are empty).
std::int64_t trace_origin_ns(const std::vector<const Tracer*>& ranks);

}  // namespace zero
