// comm/flight_recorder.hpp — each rank's last K collectives, written when something goes
// wrong, so that one look at all ranks tells which rank is where.
//
// A FlightRecorder lives in its communicator's EventLog and is fed from the same path every
// collective's timestamps take (communicator.cpp opens the event: issued; the backend's
// EventProbe stamps started and finished; a failed wait: failed). It keeps a ring of the last
// `capacity` collectives by seq (Fingerprint + times) and the engine's phase.
//
// Writing (write_flight_records): a summary per rank to stderr and, when a directory is set, one
// JSON file per world rank (<dir>/flight_rank<r>.json, replaced atomically; read by
// flight_report.hpp / zero-doctor). Triggers: the first failed wait of a communicator; SIGUSR1
// (written, the process goes on) and SIGTERM (written, then the previous disposition runs:
// by default the process ends) once a recorder with a directory exists. Signals: the handler
// only write()s the signal number to a pipe (async-signal-safe); a detached thread reads it and
// does the writing in an ordinary context (locks, allocation, files).
//
// Process state: the registry of live recorders, the directory and the signal pipe are one per
// process, because signals are: it is the one process global of comm/, created on first
// use and never destroyed (the writer thread may run until the process ends).
//
// Thread safety: every member function is safe for concurrent access from multiple threads (one
// mutex; set_phase is two relaxed atomic stores).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "comm/fingerprint.hpp"

namespace zero::detail {

class FlightRecorder {
 public:
  // Times in nanoseconds of std::chrono::steady_clock; 0: not yet.
  struct Entry {
    Fingerprint call;
    std::int64_t issued_ns = 0;
    std::int64_t started_ns = 0;
    std::int64_t finished_ns = 0;
    bool failed = false;
  };
  struct Snapshot {
    int world_rank = 0;
    std::vector<int> ranks;  // the group's world ranks
    std::string backend;
    std::string phase;  // "" when never set
    std::int64_t phase_unit = -1;
    std::string failure;       // the first failed wait's error; "" if none
    std::vector<Entry> calls;  // oldest (lowest seq) first
  };

  // Starts (capacity > 0) or stops (0: drops the record) recording.
  void configure(std::size_t capacity, int world_rank, std::vector<int> ranks,
                 std::string_view backend);
  bool on() const noexcept { return on_.load(std::memory_order_relaxed); }

  void issued(const Fingerprint& call);
  void started(std::uint64_t seq);
  void finished(std::uint64_t seq);
  // Marks `seq` failed; true the first time this recorder records a failure (the caller then
  // writes the records).
  bool failed(std::uint64_t seq, const std::string& why);
  void set_phase(const char* phase, std::int64_t unit) noexcept {
    phase_unit_.store(unit, std::memory_order_relaxed);
    phase_.store(phase, std::memory_order_relaxed);
  }
  Snapshot snapshot() const;

 private:
  Entry* slot(std::uint64_t seq);  // REQUIRES: mu_ held, on

  std::atomic<bool> on_{false};
  std::atomic<const char*> phase_{nullptr};
  std::atomic<std::int64_t> phase_unit_{-1};
  mutable std::mutex mu_;
  std::vector<Entry> ring_;  // by seq % size
  int world_rank_ = 0;
  std::vector<int> ranks_;
  std::string backend_;
  std::string failure_;
};

// Registers `recorder` (kept alive by `owner`, held weakly) with the process's writer; with a
// non-empty `dir`, sets the directory records are written to and installs the signal handlers
// (once per process).
void register_flight_recorder(const std::shared_ptr<void>& owner, const FlightRecorder* recorder,
                              const std::string& dir);

// Writes the records of world rank `world_rank` (-1: every rank of this process) with `reason`:
// a summary to stderr, and the file when a directory is set. Returns the paths written.
std::vector<std::string> write_flight_records(int world_rank, const std::string& reason);

// The file of one rank: JSON {"rank", "pid", "reason", "wall_ns", "groups": [snapshot...]}.
std::string flight_record_json(int world_rank, const std::string& reason,
                               const std::vector<FlightRecorder::Snapshot>& groups);

}  // namespace zero::detail
