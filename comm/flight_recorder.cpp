#include "comm/flight_recorder.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>
#include <utility>

#include "zero/core/log.hpp"

namespace zero::detail {

namespace {

std::int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The ring

void FlightRecorder::configure(std::size_t capacity, int world_rank, std::vector<int> ranks,
                               std::string_view backend) {
  std::lock_guard lock(mu_);
  ring_.assign(capacity, Entry{});
  world_rank_ = world_rank;
  ranks_ = std::move(ranks);
  backend_ = std::string(backend);
  on_.store(capacity > 0, std::memory_order_relaxed);
}

FlightRecorder::Entry* FlightRecorder::slot(std::uint64_t seq) {
  if (ring_.empty()) return nullptr;
  Entry& e = ring_[seq % ring_.size()];
  return e.call.valid && e.call.seq == seq ? &e : nullptr;
}

void FlightRecorder::issued(const Fingerprint& call) {
  const std::int64_t now = steady_ns();
  std::lock_guard lock(mu_);
  if (ring_.empty()) return;
  ring_[call.seq % ring_.size()] = Entry{call, now, 0, 0, false};
}

void FlightRecorder::started(std::uint64_t seq) {
  const std::int64_t now = steady_ns();
  std::lock_guard lock(mu_);
  if (Entry* e = slot(seq)) e->started_ns = now;
}

void FlightRecorder::finished(std::uint64_t seq) {
  const std::int64_t now = steady_ns();
  std::lock_guard lock(mu_);
  if (Entry* e = slot(seq)) {
    if (e->started_ns == 0) e->started_ns = e->issued_ns;
    e->finished_ns = now;
  }
}

bool FlightRecorder::failed(std::uint64_t seq, const std::string& why) {
  std::lock_guard lock(mu_);
  if (Entry* e = slot(seq)) e->failed = true;
  if (!failure_.empty() || ring_.empty()) return false;
  failure_ = why.empty() ? "failed" : why;
  return true;
}

FlightRecorder::Snapshot FlightRecorder::snapshot() const {
  Snapshot s;
  const char* phase = phase_.load(std::memory_order_relaxed);
  s.phase = phase != nullptr ? phase : "";
  s.phase_unit = phase_unit_.load(std::memory_order_relaxed);
  std::lock_guard lock(mu_);
  s.world_rank = world_rank_;
  s.ranks = ranks_;
  s.backend = backend_;
  s.failure = failure_;
  for (const Entry& e : ring_) {
    if (e.call.valid) s.calls.push_back(e);
  }
  std::sort(s.calls.begin(), s.calls.end(),
            [](const Entry& a, const Entry& b) { return a.call.seq < b.call.seq; });
  return s;
}

// ---------------------------------------------------------------------------------------------
// The process's writer: registry, files, signals

namespace {

struct Registry {
  std::mutex mu;
  std::vector<std::pair<std::weak_ptr<void>, const FlightRecorder*>> recorders;
  std::string dir;
  bool handlers = false;
  struct sigaction old_usr1 {};
  struct sigaction old_term {};
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: the writer thread may outlive main()
  return *r;
}

std::atomic<int> g_signal_fd{-1};

extern "C" void on_flight_signal(int sig) {
  const int saved = errno;
  const unsigned char b = static_cast<unsigned char>(sig);
  const int fd = g_signal_fd.load(std::memory_order_relaxed);
  if (fd >= 0) {
    [[maybe_unused]] const ssize_t n = ::write(fd, &b, 1);
  }
  errno = saved;
}

void writer_thread(int fd) {
  for (;;) {
    unsigned char b = 0;
    const ssize_t n = ::read(fd, &b, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    const int sig = b;
    write_flight_records(-1, sig == SIGTERM ? "signal SIGTERM" : "signal SIGUSR1");
    if (sig == SIGTERM) {
      // The disposition the process had before ours, then the signal again: by default the
      // process ends the way SIGTERM ends it.
      Registry& r = registry();
      struct sigaction old {};
      {
        std::lock_guard lock(r.mu);
        old = r.old_term;
      }
      sigaction(SIGTERM, &old, nullptr);
      std::raise(SIGTERM);
    }
  }
}

void install_handlers(Registry& r) {  // REQUIRES: r.mu held
  if (r.handlers) return;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    ZERO_LOG(kWarn, "flight recorder: no signal pipe (", std::strerror(errno),
             "): records are written on failures only");
    return;
  }
  g_signal_fd.store(fds[1], std::memory_order_relaxed);
  std::thread(writer_thread, fds[0]).detach();
  struct sigaction sa {};
  sa.sa_handler = on_flight_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &sa, &r.old_usr1);
  sigaction(SIGTERM, &sa, &r.old_term);
  r.handlers = true;
}

double age_s(std::int64_t now, std::int64_t t) { return t == 0 ? -1.0 : 1e-9 * (now - t); }

std::string ago(double s) {
  return detail::cat(static_cast<double>(static_cast<long>(s * 10)) / 10);
}

// One line per group of the rank: where it is.
std::string summary(int world_rank, const std::string& reason,
                    const std::vector<FlightRecorder::Snapshot>& groups, std::int64_t now) {
  std::string out;
  for (const auto& g : groups) {
    std::string line = detail::cat("zero flight recorder: rank ", world_rank, " (pid ", ::getpid(),
                                   ", ", reason, ")");
    if (groups.size() > 1) line += detail::cat(" group of ", g.ranks.size());
    if (!g.phase.empty()) {
      line += detail::cat(", phase ", g.phase);
      if (g.phase_unit >= 0) line += detail::cat(" unit ", g.phase_unit);
    }
    const FlightRecorder::Entry* last_done = nullptr;
    const FlightRecorder::Entry* first_open = nullptr;
    for (const auto& e : g.calls) {
      if (e.finished_ns != 0) last_done = &e;
      if (e.finished_ns == 0 && first_open == nullptr) first_open = &e;
    }
    line += last_done != nullptr ? detail::cat("; last finished ", to_string(last_done->call))
                                 : std::string("; nothing finished in the record");
    if (first_open != nullptr) {
      line += detail::cat("; waits at ", to_string(first_open->call), " (issued ",
                          ago(age_s(now, first_open->issued_ns)), " s ago, ",
                          first_open->started_ns != 0 ? "started" : "never started", ")");
    }
    out += line;
    out += '\n';
  }
  return out;
}

}  // namespace

void register_flight_recorder(const std::shared_ptr<void>& owner, const FlightRecorder* recorder,
                              const std::string& dir) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  std::erase_if(r.recorders, [](const auto& p) { return p.first.expired(); });
  const bool known = std::any_of(r.recorders.begin(), r.recorders.end(),
                                 [&](const auto& p) { return p.second == recorder; });
  if (!known) r.recorders.emplace_back(owner, recorder);
  if (!dir.empty()) {
    r.dir = dir;
    install_handlers(r);
  }
}

std::string flight_record_json(int world_rank, const std::string& reason,
                               const std::vector<FlightRecorder::Snapshot>& groups) {
  using nlohmann::json;
  const std::int64_t now = steady_ns();
  const std::int64_t wall = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count();
  json j = {{"rank", world_rank},
            {"pid", static_cast<long>(::getpid())},
            {"reason", reason},
            {"wall_ns", wall},
            {"groups", json::array()}};
  for (const auto& g : groups) {
    json calls = json::array();
    for (const auto& e : g.calls) {
      calls.push_back({{"seq", e.call.seq},
                       {"call", to_string(e.call)},
                       {"kind", to_string(static_cast<Collective>(e.call.kind))},
                       {"count", e.call.count},
                       {"unit", e.call.tag},
                       {"issued_ago_s", age_s(now, e.issued_ns)},
                       {"started_ago_s", age_s(now, e.started_ns)},
                       {"finished_ago_s", age_s(now, e.finished_ns)},
                       {"failed", e.failed}});
    }
    j["groups"].push_back({{"ranks", g.ranks},
                           {"backend", g.backend},
                           {"phase", g.phase},
                           {"phase_unit", g.phase_unit},
                           {"failure", g.failure},
                           {"calls", std::move(calls)}});
  }
  return j.dump(1);
}

std::vector<std::string> write_flight_records(int world_rank, const std::string& reason) {
  Registry& r = registry();
  std::vector<std::pair<std::shared_ptr<void>, const FlightRecorder*>> live;
  std::string dir;
  {
    std::lock_guard lock(r.mu);
    dir = r.dir;
    for (const auto& [owner, rec] : r.recorders) {
      if (auto p = owner.lock()) live.emplace_back(std::move(p), rec);
    }
  }
  // Group the snapshots by world rank (the in-process backend: several ranks in one process).
  std::vector<std::pair<int, std::vector<FlightRecorder::Snapshot>>> by_rank;
  for (const auto& [owner, rec] : live) {
    if (!rec->on()) continue;
    FlightRecorder::Snapshot s = rec->snapshot();
    if (world_rank >= 0 && s.world_rank != world_rank) continue;
    auto it = std::find_if(by_rank.begin(), by_rank.end(),
                           [&](const auto& p) { return p.first == s.world_rank; });
    if (it == by_rank.end()) {
      by_rank.emplace_back(s.world_rank, std::vector<FlightRecorder::Snapshot>{});
      it = std::prev(by_rank.end());
    }
    it->second.push_back(std::move(s));
  }
  std::vector<std::string> written;
  const std::int64_t now = steady_ns();
  for (auto& [rank, groups] : by_rank) {
    // Largest group (the world) first.
    std::stable_sort(groups.begin(), groups.end(),
                     [](const auto& a, const auto& b) { return a.ranks.size() > b.ranks.size(); });
    const std::string text = summary(rank, reason, groups, now);
    std::fwrite(text.data(), 1, text.size(), stderr);
    if (dir.empty()) continue;
    const std::filesystem::path path =
        std::filesystem::path(dir) / detail::cat("flight_rank", rank, ".json");
    const std::filesystem::path tmp = path.string() + detail::cat(".tmp", ::getpid());
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    {
      std::ofstream f(tmp, std::ios::trunc);
      f << flight_record_json(rank, reason, groups) << '\n';
      if (!f) {
        ZERO_LOG(kWarn, "flight recorder: cannot write ", tmp.string());
        continue;
      }
    }
    std::filesystem::rename(tmp, path, ec);
    if (ec) {
      ZERO_LOG(kWarn, "flight recorder: cannot write ", path.string(), ": ", ec.message());
      continue;
    }
    written.push_back(path.string());
  }
  std::fflush(stderr);
  return written;
}

}  // namespace zero::detail
