// fuzz/manifest_fuzz.cpp — libFuzzer target for the checkpoint manifest reader: the bytes of a
// manifest.json as read_manifest() hands them to Manifest::parse (after the checksum, which a
// hostile or damaged checkpoint can match), and the same bytes as a rank's manifest fragment
// (Fragment::parse, the other JSON the save commits).
//
// A zero::Error is a fine outcome; any other exception (std::terminate), an abort, a sanitizer
// report or a timeout is a crash. A manifest (fragment) that parses must also survive its own
// round trip: parse(to_json()) succeeds and writes the same JSON again, else a crash.
//
// Build and run: tools/fuzz (fuzz/README.md).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "ckpt/manifest.hpp"
#include "zero/error.hpp"

namespace {

using zero::ckpt::detail::Fragment;
using zero::ckpt::detail::Manifest;

[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "manifest_fuzz: %s\n%s\n", what, detail.substr(0, 4096).c_str());
  std::abort();
}

// T: Manifest or Fragment. Parses `text`; when it parses, checks the round trip.
template <typename T>
void parse_and_round_trip(const std::string& text, const char* where) {
  std::string first_json;
  try {
    first_json = T::parse(text, where).to_json();
  } catch (const zero::Error&) {
    return;  // refused with the library's error
  }
  std::string second_json;
  try {
    second_json = T::parse(first_json, where).to_json();
  } catch (const zero::Error& e) {
    fail("a manifest that parsed is refused when its to_json() is read back", e.what());
  }
  if (second_json != first_json) {
    fail("parse(to_json()) differs from to_json()", first_json + "\n---\n" + second_json);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  parse_and_round_trip<Manifest>(text, "fuzz/manifest.json");
  parse_and_round_trip<Fragment>(text, "fuzz/fragment.json");
  return 0;
}
