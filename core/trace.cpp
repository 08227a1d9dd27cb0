// The tracer's ring and the Chrome trace writer (see zero/core/trace.hpp).
#include "zero/core/trace.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstdio>

#include "core/nvtx.hpp"
#include "zero/core/error.hpp"

namespace zero {

std::string_view to_string(TraceLane lane) noexcept {
  switch (lane) {
    case TraceLane::kTrainer: return "trainer";
    case TraceLane::kEngine: return "engine";
    case TraceLane::kComm: return "comm";
    case TraceLane::kCommInFlight: return "comm in flight";
    case TraceLane::kCommWait: return "comm wait";
    case TraceLane::kOptimizer: return "optimizer";
    case TraceLane::kOffload: return "offload";
    case TraceLane::kNvme: return "nvme";
  }
  return "unknown";
}

// ---------------------------------------------------------------------------------------------
// Tracer

Tracer::Tracer(int rank, std::size_t capacity) : rank_(rank), capacity_(capacity) {
  ZERO_CHECK(capacity >= 1, kInvalidArgument, "trace capacity must be >= 1 event, got ", capacity);
}

void Tracer::record(TraceLane lane, const char* name, TraceClock::time_point begin,
                    TraceClock::time_point end, std::int64_t unit, std::int64_t bytes,
                    std::int64_t seq) {
  record(TraceEvent{trace_ns(begin), trace_ns(end), name, unit, bytes, seq, lane});
}

void Tracer::record(const TraceEvent& event_in) {
  TraceEvent event = event_in;
  event.end_ns = std::max(event.end_ns, event.begin_ns);  // a clock never runs backwards here
  std::lock_guard<std::mutex> lock(mu_);
  if (ring_.size() < capacity_) {
    ring_.push_back(event);
    return;
  }
  ring_[head_] = event;  // the oldest
  head_ = (head_ + 1) % capacity_;
  ++dropped_;
}

std::vector<TraceEvent> Tracer::events() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<TraceEvent> out;
  out.reserve(ring_.size());
  out.insert(out.end(), ring_.begin() + static_cast<std::ptrdiff_t>(head_), ring_.end());
  out.insert(out.end(), ring_.begin(), ring_.begin() + static_cast<std::ptrdiff_t>(head_));
  return out;
}

std::uint64_t Tracer::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

void Tracer::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  ring_.clear();
  head_ = 0;
  dropped_ = 0;
}

void TraceScope::begin(TraceLane lane, const char* name, std::int64_t unit, std::int64_t bytes) {
  event_.lane = lane;
  event_.name = name;
  event_.unit = unit;
  event_.bytes = bytes;
  detail::nvtx_push(name);
  event_.begin_ns = trace_ns(TraceClock::now());
}

void TraceScope::end() {
  event_.end_ns = trace_ns(TraceClock::now());
  detail::nvtx_pop();
  tracer_->record(event_);
}

// ---------------------------------------------------------------------------------------------
// Chrome trace JSON

namespace {

constexpr int kTidsPerLane = 100;  // sub-tracks of one lane: tid = 100 x lane + sub-track

// JSON string contents: names are literals of ours, but escape what JSON requires anyway.
void append_escaped(std::string& out, const char* s) {
  for (; *s != '\0'; ++s) {
    const auto c = static_cast<unsigned char>(*s);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
}

void append_ts(std::string& out, std::int64_t ns, std::int64_t origin_ns) {
  char buf[40];
  const std::int64_t d = ns - origin_ns;
  // Microseconds with the nanoseconds kept (three decimals), never a float's rounding.
  std::snprintf(buf, sizeof buf, "%s%" PRId64 ".%03" PRId64, d < 0 ? "-" : "",
                (d < 0 ? -d : d) / 1000, (d < 0 ? -d : d) % 1000);
  out += buf;
}

void append_event(std::string& out, char ph, const TraceEvent& e, int pid, int tid,
                  std::int64_t origin_ns) {
  if (!out.empty()) out += ",\n";
  out += "{\"ph\":\"";
  out += ph;
  out += "\",\"pid\":";
  out += std::to_string(pid);
  out += ",\"tid\":";
  out += std::to_string(tid);
  out += ",\"ts\":";
  append_ts(out, ph == 'B' ? e.begin_ns : e.end_ns, origin_ns);
  if (ph == 'E') {
    out += '}';
    return;
  }
  out += ",\"cat\":\"";
  out += to_string(e.lane);
  out += "\",\"name\":\"";
  append_escaped(out, e.name);
  out += '"';
  if (e.unit >= 0 || e.bytes >= 0 || e.seq >= 0) {
    out += ",\"args\":{";
    bool first = true;
    for (auto [key, v] : {std::pair<const char*, std::int64_t>{"unit", e.unit},
                          {"bytes", e.bytes},
                          {"seq", e.seq}}) {
      if (v < 0) continue;
      if (!first) out += ',';
      first = false;
      out += '"';
      out += key;
      out += "\":";
      out += std::to_string(v);
    }
    out += '}';
  }
  out += '}';
}

void append_meta(std::string& out, const char* what, int pid, int tid, const std::string& name) {
  if (!out.empty()) out += ",\n";
  out += "{\"ph\":\"M\",\"pid\":";
  out += std::to_string(pid);
  out += ",\"tid\":";
  out += std::to_string(tid);
  out += ",\"ts\":0,\"name\":\"";
  out += what;
  out += "\",\"args\":{\"name\":\"";
  append_escaped(out, name.c_str());
  out += "\"}}";
}

}  // namespace

std::string chrome_trace_fragment(int rank, const std::vector<TraceEvent>& events,
                                  std::int64_t origin_ns, std::uint64_t dropped) {
  std::string out;
  append_meta(out, "process_name", rank, 0,
              "rank " + std::to_string(rank) +
                  (dropped > 0 ? " (" + std::to_string(dropped) + " older events dropped)" : ""));
  if (!out.empty()) out += ",\n";
  out += "{\"ph\":\"M\",\"pid\":" + std::to_string(rank) +
         ",\"tid\":0,\"ts\":0,\"name\":\"process_sort_index\",\"args\":{\"sort_index\":" +
         std::to_string(rank) + "}}";
  for (std::size_t lane = 0; lane < kNumTraceLanes; ++lane) {
    std::vector<const TraceEvent*> mine;
    for (const TraceEvent& e : events) {
      if (static_cast<std::size_t>(e.lane) == lane) mine.push_back(&e);
    }
    if (mine.empty()) continue;
    // Outer regions first where two begin together, so nesting is seen from the outside in.
    std::stable_sort(mine.begin(), mine.end(), [](const TraceEvent* a, const TraceEvent* b) {
      return a->begin_ns != b->begin_ns ? a->begin_ns < b->begin_ns : a->end_ns > b->end_ns;
    });
    // Sub-tracks: a region goes on the first one where it nests in the open region or follows
    // it; B/E pairs then nest on every track, as the format requires.
    struct Track {
      std::vector<const TraceEvent*> open;  // the stack of open regions
      std::string body;                     // kept apart to write each track contiguously
    };
    std::vector<Track> tracks;
    for (const TraceEvent* e : mine) {
      std::size_t k = 0;
      for (; k < tracks.size(); ++k) {
        Track& t = tracks[k];
        while (!t.open.empty() && t.open.back()->end_ns <= e->begin_ns) {
          append_event(t.body, 'E', *t.open.back(), rank, static_cast<int>(lane * kTidsPerLane + k),
                       origin_ns);
          t.open.pop_back();
        }
        if (t.open.empty() || e->end_ns <= t.open.back()->end_ns) break;
      }
      if (k == tracks.size()) {
        if (tracks.size() == kTidsPerLane - 1) continue;  // past 99 overlapping: not drawn
        tracks.emplace_back();
      }
      const int tid = static_cast<int>(lane * kTidsPerLane + k);
      append_event(tracks[k].body, 'B', *e, rank, tid, origin_ns);
      tracks[k].open.push_back(e);
    }
    for (std::size_t k = 0; k < tracks.size(); ++k) {
      Track& t = tracks[k];
      const int tid = static_cast<int>(lane * kTidsPerLane + k);
      while (!t.open.empty()) {
        append_event(t.body, 'E', *t.open.back(), rank, tid, origin_ns);
        t.open.pop_back();
      }
      std::string name(to_string(static_cast<TraceLane>(lane)));
      if (k > 0) name += " #" + std::to_string(k + 1);
      append_meta(out, "thread_name", rank, tid, name);
      out += ",\n{\"ph\":\"M\",\"pid\":" + std::to_string(rank) +
             ",\"tid\":" + std::to_string(tid) +
             ",\"ts\":0,\"name\":\"thread_sort_index\",\"args\":{" +
             "\"sort_index\":" + std::to_string(tid) + "}}";
      out += ",\n";
      out += t.body;
    }
  }
  return out;
}

std::int64_t trace_origin_ns(const std::vector<const Tracer*>& ranks) {
  std::int64_t origin = 0;
  bool any = false;
  for (const Tracer* t : ranks) {
    for (const TraceEvent& e : t->events()) {
      if (!any || e.begin_ns < origin) origin = e.begin_ns;
      any = true;
    }
  }
  return origin;
}

void write_chrome_trace(std::ostream& out, const std::vector<const Tracer*>& ranks) {
  const std::int64_t origin = trace_origin_ns(ranks);
  out << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  bool first = true;
  for (const Tracer* t : ranks) {
    const std::string f = chrome_trace_fragment(t->rank(), t->events(), origin, t->dropped());
    if (f.empty()) continue;
    if (!first) out << ",\n";
    first = false;
    out << f;
  }
  out << "\n]}\n";
}

}  // namespace zero
