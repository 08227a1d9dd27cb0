// What the engine shows of a run: the measured window behind StepResult::metrics, the tracer,
// and the Chrome trace of every rank written by one collective call (see zero/engine/engine.hpp).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "engine/engine_impl.hpp"

namespace zero {

// ---- StepMetrics

namespace {
void read_io(const detail::IoCounters& io, std::uint64_t out[4]) {
  out[0] = io.host_to_device.load(std::memory_order_relaxed);
  out[1] = io.device_to_host.load(std::memory_order_relaxed);
  out[2] = io.nvme_read.load(std::memory_order_relaxed);
  out[3] = io.nvme_write.load(std::memory_order_relaxed);
}
}  // namespace

void Engine::Impl::open_window() {
  if (window_open) return;
  window_open = true;
  window = StepMetrics{};
  if (window_start == TraceClock::time_point{}) window_start = TraceClock::now();
  comm_at_start = comm.stats();
  if (groups.replicas != nullptr) replicas_at_start = groups.replicas->stats();
  read_io(io, io_at_start);
}

StepMetrics Engine::Impl::close_window(bool boundary) {
  const TraceClock::time_point now = TraceClock::now();
  StepMetrics m = window;
  ++window.micro_steps;
  m.micro_steps = window.micro_steps;
  m.window_s = std::chrono::duration<double>(now - window_start).count();
  // Since the window opened, over the engine's communicators (its group and, with hybrid
  // sharding, the replicas); a trainer that reset a communicator's stats inside the window
  // (Communicator::reset_stats) gets what that one counted since the reset.
  auto add = [&](const CommStats& c, const CommStats& start) {
    const bool reset = c.resets != start.resets;
    auto since = [&](std::uint64_t now, std::uint64_t then) { return reset ? now : now - then; };
    m.comm_busy_s += static_cast<double>(since(c.busy_ns, start.busy_ns)) * 1e-9;
    m.comm_wait_s += static_cast<double>(since(c.wait_ns, start.wait_ns)) * 1e-9;
    m.comm_bytes_sent += since(c.bytes_sent(), start.bytes_sent());
    m.comm_bytes_received += since(c.bytes_received(), start.bytes_received());
    return since(c.bytes_sent(), start.bytes_sent());
  };
  add(comm.stats(), comm_at_start);
  if (groups.replicas != nullptr) {
    m.comm_cross_group_bytes_sent = add(groups.replicas->stats(), replicas_at_start);
  }
  std::uint64_t io_now[4];
  read_io(io, io_now);
  m.host_to_device_bytes = io_now[0] - io_at_start[0];
  m.device_to_host_bytes = io_now[1] - io_at_start[1];
  m.nvme_read_bytes = io_now[2] - io_at_start[2];
  m.nvme_write_bytes = io_now[3] - io_at_start[3];
  if (boundary) {  // the next window starts here
    window_open = false;
    window_start = now;
  }
  return m;
}

std::string to_json(const StepMetrics& m) {
  char buf[1024];
  std::snprintf(buf, sizeof buf,
                "{\"micro_steps\":%d,\"window_s\":%.9g,\"trainer_s\":%.9g,\"gather_s\":%.9g,"
                "\"grads_ready_s\":%.9g,\"step_s\":%.9g,\"reduce_s\":%.9g,"
                "\"optimizer_s\":%.9g,\"param_gather_s\":%.9g,\"comm_busy_s\":%.9g,"
                "\"comm_wait_s\":%.9g,\"comm_sent_bytes\":%llu,\"comm_received_bytes\":%llu,"
                "\"comm_cross_group_sent_bytes\":%llu,\"host_to_device_bytes\":%llu,\"device_to_"
                "host_bytes\":%llu,"
                "\"nvme_read_bytes\":%llu,\"nvme_write_bytes\":%llu,\"speculated_units\":%d,"
                "\"redone_units\":%d}",
                m.micro_steps, m.window_s, m.trainer_s(), m.gather_s, m.grads_ready_s, m.step_s,
                m.reduce_s, m.optimizer_s, m.param_gather_s, m.comm_busy_s, m.comm_wait_s,
                static_cast<unsigned long long>(m.comm_bytes_sent),
                static_cast<unsigned long long>(m.comm_bytes_received),
                static_cast<unsigned long long>(m.comm_cross_group_bytes_sent),
                static_cast<unsigned long long>(m.host_to_device_bytes),
                static_cast<unsigned long long>(m.device_to_host_bytes),
                static_cast<unsigned long long>(m.nvme_read_bytes),
                static_cast<unsigned long long>(m.nvme_write_bytes), m.speculated_units,
                m.redone_units);
  return buf;
}

// ---- the timeline

Tracer* Engine::tracer() noexcept { return impl_->tracer; }

namespace {

// Bytes through a communicator that moves f32 elements: whole words, the tail zero-padded.
std::size_t words(std::size_t bytes) { return (bytes + 3) / 4; }

std::string with_rank(const std::string& path, int rank) {
  const std::size_t slash = path.find_last_of('/');
  const std::size_t dot = path.find_last_of('.');
  const std::string suffix = ".rank" + std::to_string(rank);
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) {
    return path + suffix;
  }
  return path.substr(0, dot) + suffix + path.substr(dot);
}

void write_text(const std::string& path, const std::string& head, const std::string& body,
                const std::string& tail) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  ZERO_CHECK(out.good(), kIO, "write_trace: cannot open '", path, "' for writing");
  out << head << body << tail;
  out.flush();
  ZERO_CHECK(out.good(), kIO, "write_trace: writing '", path, "' failed");
}

}  // namespace

void Engine::write_trace(const std::string& path) {
  Impl& m = *impl_;
  ZERO_CHECK(m.tracer != nullptr, kInvalidArgument, "write_trace('", path,
             "'): tracing is off (set config key 'trace.enabled' or "
             "EngineOptions::tracer)");
  Communicator& comm = m.world;  // every rank's timeline, whatever group it shards over
  const std::vector<TraceEvent> events = m.tracer->events();
  const std::string head = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  const std::string tail = "\n]}\n";
  std::int64_t origin = events.empty() ? 0 : events.front().begin_ns;
  for (const TraceEvent& e : events) origin = std::min(origin, e.begin_ns);
  if (comm.backend() == "nccl") {  // device buffers only: one document per rank
    write_text(with_rank(path, comm.rank()), head,
               chrome_trace_fragment(comm.rank(), events, origin, m.tracer->dropped()), tail);
    return;
  }
  // One origin for all ranks (the earliest event of any); rank 0 opens the file and says whether
  // it could (so every rank fails alike); then each rank's fragment in turn, broadcast from it
  // (a rank holds one fragment at a time, not all of them). 64-bit values travel as two f32
  // words (the collectives copy bits).
  const auto n = static_cast<std::size_t>(comm.size());
  std::vector<std::int64_t> origins(n);
  comm.all_gather(&origin, origins.data(), 2, DType::kF32);
  std::int64_t common = origin;
  for (std::size_t q = 0; q < n; ++q) {
    // A rank without events sent its 0: skip it unless every rank has none.
    if (origins[q] != 0) common = common == 0 ? origins[q] : std::min(common, origins[q]);
  }
  std::ofstream out;
  float opened = 1.0f;
  if (comm.rank() == 0) {
    out.open(path, std::ios::binary | std::ios::trunc);
    opened = out.good() ? 1.0f : 0.0f;
  }
  comm.broadcast(&opened, &opened, 1, DType::kF32, 0);
  ZERO_CHECK(opened == 1.0f, kIO, "write_trace: rank 0 cannot open '", path, "' for writing");
  out << head;
  const std::string mine = chrome_trace_fragment(comm.rank(), events, common, m.tracer->dropped());
  bool first = true;
  for (int q = 0; q < comm.size(); ++q) {
    std::int64_t len = q == comm.rank() ? static_cast<std::int64_t>(mine.size()) : 0;
    comm.broadcast(&len, &len, 2, DType::kF32, q);
    std::vector<float> words_of(words(static_cast<std::size_t>(len)), 0.0f);
    if (q == comm.rank()) std::memcpy(words_of.data(), mine.data(), mine.size());
    comm.broadcast(words_of.data(), words_of.data(), words_of.size(), DType::kF32, q);
    if (comm.rank() != 0 || len == 0) continue;
    if (!first) out << ",\n";
    first = false;
    out.write(reinterpret_cast<const char*>(words_of.data()), len);
  }
  if (comm.rank() != 0) return;
  out << tail;
  out.flush();
  ZERO_CHECK(out.good(), kIO, "write_trace: writing '", path, "' failed");
}

}  // namespace zero
