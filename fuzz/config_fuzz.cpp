// fuzz/config_fuzz.cpp — libFuzzer target for the config reader, reached the way users reach
// it: a JSON text (ConfigBuilder::merge_json, as --config FILE does) and --set assignments
// (ConfigBuilder::set), then build().
//
// Input: the JSON text, then any number of "\n--set <key.path=value>" parts, e.g.
//   {"zero_optimization": {"stage": 2}}
//   --set zero_optimization.stage=3
// An empty JSON part is skipped (only --set). A zero::Error is a fine outcome; any other
// exception (std::terminate), an abort, a sanitizer report or a timeout is a crash.
// A config that builds must also survive its own round trip, as the checkpoint relies on
// (Config::to_json: "parse_config(to_json()) is the same configuration"): a second
// parse_config of to_json() that throws or writes a different JSON is a crash too.
//
// Build and run: tools/fuzz (fuzz/README.md).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "zero/config/config.hpp"
#include "zero/core/error.hpp"
#include "zero/core/log.hpp"

namespace {

constexpr std::string_view kSetMarker = "\n--set ";

[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "config_fuzz: %s\n%s\n", what, detail.substr(0, 4096).c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Warnings (accepted-but-ignored keys) would write a line per input.
  zero::set_log_level(zero::LogLevel::kError);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  std::string first_json;
  zero::Config cfg;
  try {
    zero::ConfigBuilder builder;
    std::size_t at = input.find(kSetMarker);
    const std::string_view text = input.substr(0, at);
    if (text.find_first_not_of(" \t\r\n") != std::string_view::npos) {
      builder.merge_json(text, "fuzz");
    }
    while (at != std::string_view::npos) {
      const std::size_t start = at + kSetMarker.size();
      at = input.find(kSetMarker, start);
      builder.set(input.substr(start, at == std::string_view::npos ? at : at - start), "--set");
    }
    cfg = builder.build();
    first_json = cfg.to_json();
  } catch (const zero::Error&) {
    return 0;  // refused with the library's error: what hostile input should get
  }
  // The round trip: a built config's JSON reads back as the same config.
  std::string second_json;
  try {
    second_json = zero::parse_config(first_json).to_json();
  } catch (const zero::Error& e) {
    fail("a config that built is refused when its to_json() is read back", e.what());
  }
  if (second_json != first_json) {
    fail("parse_config(to_json()) differs from to_json()", first_json + "\n---\n" + second_json);
  }
  return 0;
}
