// tests/common/trace_json.hpp — a Chrome trace document read back the way a viewer reads it:
// every event must have ph, ts, pid and tid; "B"/"E" pairs must match per (pid, tid) track in file
// order with time never going back on a track. Any breach is a test failure; the matched regions
// come back for the test to measure (the prefetch overlap, the regions per rank).
// Thread safety: pure functions of the document.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace zero::testing {

struct Region {
  int pid = 0, tid = 0;
  double begin = 0, end = 0;  // microseconds
  std::string name, cat;
  nlohmann::json args;
  std::int64_t arg(const char* key) const { return args.value(key, std::int64_t{-1}); }
};

inline std::vector<Region> regions_of(const nlohmann::json& doc) {
  using json = nlohmann::json;
  std::vector<Region> out;
  EXPECT_TRUE(doc.is_object() && doc.contains("traceEvents") && doc["traceEvents"].is_array());
  std::map<std::pair<int, int>, std::vector<Region>> open;
  std::map<std::pair<int, int>, double> last_ts;
  for (const json& e : doc["traceEvents"]) {
    for (const char* k : {"ph", "ts", "pid", "tid"}) {
      EXPECT_TRUE(e.contains(k)) << "event without " << k << ": " << e.dump();
    }
    if (!e.contains("ph")) continue;
    const std::string ph = e["ph"];
    EXPECT_TRUE(ph == "B" || ph == "E" || ph == "M") << e.dump();
    EXPECT_TRUE(e["ts"].is_number() && e["pid"].is_number_integer() && e["tid"].is_number_integer())
        << e.dump();
    const std::pair<int, int> track{e["pid"].get<int>(), e["tid"].get<int>()};
    const double ts = e["ts"].get<double>();
    if (ph == "M") continue;
    EXPECT_GE(ts, last_ts[track]) << "time goes back on track " << track.first << "/"
                                  << track.second << ": " << e.dump();
    last_ts[track] = ts;
    if (ph == "B") {
      EXPECT_TRUE(e.contains("name") && e.contains("cat")) << e.dump();
      Region r;
      r.pid = track.first;
      r.tid = track.second;
      r.begin = ts;
      r.name = e.value("name", "");
      r.cat = e.value("cat", "");
      r.args = e.value("args", json::object());
      open[track].push_back(r);
    } else {
      EXPECT_FALSE(open[track].empty()) << "E without B on " << track.first << "/" << track.second;
      if (open[track].empty()) continue;
      Region r = open[track].back();
      open[track].pop_back();
      r.end = ts;
      out.push_back(r);
    }
  }
  for (const auto& [track, stack] : open) {
    EXPECT_TRUE(stack.empty()) << stack.size() << " regions never closed on " << track.first << "/"
                               << track.second;
  }
  return out;
}

}  // namespace zero::testing
