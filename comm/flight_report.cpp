// zero::flight_report (zero/comm/comm.hpp): the flight recorder's files (flight_recorder.cpp writes
// them) merged into the one-screen answer zero-doctor prints.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "zero/comm/comm.hpp"

namespace zero {

namespace {

using nlohmann::json;

struct RankRecord {
  std::string file;
  std::string reason;
  std::string phase;
  std::int64_t phase_unit = -1;
  bool any_finished = false;
  std::uint64_t last_finished = 0;
  std::string last_finished_call;
  bool open = false;  // a collective issued and not finished
  std::uint64_t open_seq = 0;
  std::string open_call;
  bool open_started = false;
  double open_age_s = 0;
  std::uint64_t next() const { return open ? open_seq : any_finished ? last_finished + 1 : 0; }
};

std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(ranks[i]);
  }
  return s;
}

std::string round1(double s) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(1);
  os << s;
  return os.str();
}

std::string phase_text(const RankRecord& r) {
  if (r.phase.empty()) return "";
  return detail::cat(", phase ", r.phase,
                     r.phase_unit >= 0 ? detail::cat(" unit ", r.phase_unit) : "");
}

// Where one recorded rank is.
std::string where(const RankRecord& r) {
  if (r.open) {
    return detail::cat("at ", r.open_call, " (issued ", round1(r.open_age_s),
                       " s before the record, ",
                       r.open_started ? "started, never finished" : "never started", ")");
  }
  if (r.any_finished) return detail::cat("after ", r.last_finished_call);
  return "before its first collective";
}

RankRecord read_group(const json& g, const std::string& file, const std::string& reason) {
  RankRecord r;
  r.file = file;
  r.reason = reason;
  r.phase = g.at("phase").get<std::string>();
  r.phase_unit = g.at("phase_unit").get<std::int64_t>();
  for (const json& c : g.at("calls")) {
    const auto seq = c.at("seq").get<std::uint64_t>();
    if (c.at("finished_ago_s").get<double>() >= 0) {
      if (!r.any_finished || seq > r.last_finished) {
        r.any_finished = true;
        r.last_finished = seq;
        r.last_finished_call = c.at("call").get<std::string>();
      }
    } else if (!r.open || seq < r.open_seq) {
      r.open = true;
      r.open_seq = seq;
      r.open_call = c.at("call").get<std::string>();
      r.open_started = c.at("started_ago_s").get<double>() >= 0;
      r.open_age_s = c.at("issued_ago_s").get<double>();
    }
  }
  return r;
}

namespace fs = std::filesystem;

// The flight_rank<r>.json files in `dir`. Throws kIO when it cannot be listed or has none.
std::vector<fs::path> record_files(const std::string& dir) {
  std::error_code ec;
  std::vector<fs::path> files;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind("flight_rank", 0) == 0 && it->path().extension() == ".json") {
      files.push_back(it->path());
    }
  }
  ZERO_CHECK(!ec, kIO, "flight records: cannot list ", dir, ": ", ec.message());
  ZERO_CHECK(!files.empty(), kIO, "flight records: no flight_rank<r>.json in ", dir,
             " (set comm_flight_dir, or CommOptions::flight_dir, for the ranks to write them)");
  return files;
}

// Group ranks -> rank -> its record.
using Groups = std::map<std::vector<int>, std::map<int, RankRecord>>;

// Each file's largest group: the world (splits are reported by their own group, not here).
// Throws kCorruption naming a file that is not a flight record.
Groups read_groups(const std::vector<fs::path>& files) {
  Groups groups;
  for (const fs::path& path : files) {
    std::ifstream in(path);
    json j;
    try {
      in >> j;
      const int rank = j.at("rank").get<int>();
      const auto& gs = j.at("groups");
      if (gs.empty()) continue;
      const json* best = &gs[0];
      for (const json& g : gs) {
        if (g.at("ranks").size() > best->at("ranks").size()) best = &g;
      }
      groups[best->at("ranks").get<std::vector<int>>()][rank] =
          read_group(*best, path.filename().string(), j.at("reason").get<std::string>());
    } catch (const json::exception& e) {
      ZERO_THROW(kCorruption, "flight record ", path.string(), " is not one: ", e.what());
    }
  }
  return groups;
}

// How far the recorded ranks got: those without a record, and the lowest and highest next
// collective of those with one.
struct Progress {
  std::vector<int> missing;
  std::uint64_t lowest = UINT64_MAX, highest = 0;
};

// A line per rank of the group: where it is, its phase and why it wrote the record.
std::string rank_lines(const std::vector<int>& ranks, const std::map<int, RankRecord>& recs,
                       Progress& progress) {
  std::string out;
  for (int r : ranks) {
    const auto it = recs.find(r);
    if (it == recs.end()) {
      progress.missing.push_back(r);
      out += detail::cat("  rank ", r, ": no record (stopped, killed, or writing none)\n");
      continue;
    }
    const RankRecord& rec = it->second;
    progress.lowest = std::min(progress.lowest, rec.next());
    progress.highest = std::max(progress.highest, rec.next());
    std::string reason = rec.reason.substr(0, 60);
    if (rec.reason.size() > 60) reason += "...";
    out += detail::cat("  rank ", r, ": ", where(rec), phase_text(rec), " [", reason, "]\n");
  }
  return out;
}

// The verdict: the ranks behind and where the others wait. While some rank waits in a
// collective, the furthest such collective (`front`) is what the group waits for: a rank is
// behind when it waits at an earlier one, or waits at none and has not issued `front` (it
// stopped between collectives). When no rank waits, the ranks that issued the fewest are.
std::vector<std::string> verdict(const std::map<int, RankRecord>& recs, const Progress& progress) {
  std::vector<std::string> parts;
  for (int r : progress.missing) {
    std::string s = detail::cat("rank ", r, " has no record");
    if (!recs.empty()) {
      s += detail::cat(" (stopped or killed: it has not joined what the others wait for)");
    }
    parts.push_back(s);
  }
  bool any_open = false;
  std::uint64_t front = 0;
  for (const auto& [r, rec] : recs) {
    if (rec.open) front = any_open ? std::max(front, rec.open_seq) : rec.open_seq;
    any_open = any_open || rec.open;
  }
  std::map<std::uint64_t, std::vector<int>> waiting;  // open seq -> ranks
  for (const auto& [r, rec] : recs) {
    const bool behind = any_open
                            ? (rec.open ? rec.open_seq < front : rec.next() <= front)
                            : progress.lowest < progress.highest && rec.next() == progress.lowest;
    if (behind) {
      std::string s = detail::cat("rank ", r, " stopped ", where(rec), phase_text(rec));
      if (!rec.open) s += detail::cat(" (seq ", front, " never issued)");
      parts.push_back(std::move(s));
    } else if (rec.open) {
      waiting[rec.open_seq].push_back(r);
    }
  }
  for (const auto& [seq, rs] : waiting) {
    const std::string call = recs.at(rs.front()).open_call;
    parts.push_back(detail::cat(rank_list(rs), " wait", rs.size() == 1 ? "s" : "", " at ", call));
  }
  if (parts.empty()) parts.push_back("every rank is at the same place: none waits on another");
  return parts;
}

}  // namespace

std::string flight_report(const std::string& dir) {
  const Groups groups = read_groups(record_files(dir));
  ZERO_CHECK(!groups.empty(), kIO, "flight records in ", dir, " hold no collective group");
  auto world = std::max_element(groups.begin(), groups.end(), [](const auto& a, const auto& b) {
    return a.first.size() < b.first.size();
  });
  const std::vector<int>& ranks = world->first;
  const std::map<int, RankRecord>& recs = world->second;

  std::string out =
      detail::cat("flight records of ", recs.size(), " of ", ranks.size(), " ranks in ", dir, "\n");
  Progress progress;
  out += rank_lines(ranks, recs, progress);
  const std::vector<std::string> parts = verdict(recs, progress);
  out += "=> ";
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) out += "; ";
    out += parts[i];
  }
  out += '\n';
  return out;
}

}  // namespace zero
