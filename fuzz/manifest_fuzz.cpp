// fuzz/manifest_fuzz.cpp — libFuzzer target for the checkpoint manifest reader: the bytes of a
// manifest.json as read_manifest() hands them to Manifest::parse (after the checksum, which a
// hostile or damaged checkpoint can match), and the same bytes as a rank's manifest fragment
// (Fragment::parse, the other JSON the save commits).
//
// A zero::Error is a fine outcome; any other exception (std::terminate), an abort, a sanitizer
// report or a timeout is a crash. A manifest (fragment) that parses must also survive its own
// round trip: parse(to_json()) succeeds and writes the same JSON again, else a crash.
//
// The manifest is read in its two steps, Manifest::parse_fields (every key with its type) then
// Manifest::check (every field in range and consistent with the others), so that the run can
// say how many inputs reached the semantic checks and how many those refused (printed at exit:
// a run whose inputs never get past the syntax does not test the checks); a manifest check()
// accepts must hold what a reader relies on (expect_sound, written here independently).
//
// Build and run: tools/fuzz (fuzz/README.md).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "ckpt/manifest.hpp"
#include "zero/core/error.hpp"

namespace {

using zero::ckpt::detail::Fragment;
using zero::ckpt::detail::Manifest;

[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "manifest_fuzz: %s\n%s\n", what, detail.substr(0, 4096).c_str());
  std::abort();
}

// Inputs whose fields all parsed (reaching Manifest::check), and those check refused.
struct CheckCounts {
  long reached = 0, refused = 0;
  std::string last_reached;  // the last input whose fields all parsed (the mutator starts there)
  ~CheckCounts() {
    std::fprintf(stderr, "manifest_fuzz: %ld inputs reached Manifest::check, %ld refused there\n",
                 reached, refused);
  }
};
CheckCounts counts;

// What a reader relies on in a manifest that check() accepted, restated here on its own (an
// independent reference for the check, not its code): a manifest accepted without one of these
// is a crash.
void expect_sound(const Manifest& m) {
  const auto need = [&](bool ok, const char* what) {
    if (!ok) fail(what, m.to_json());
  };
  need(m.world_size >= 1 && m.world_size <= (1 << 20), "accepted: world_size out of [1, 2^20]");
  need(m.stage >= 0 && m.stage <= 3, "accepted: stage not 0-3");
  need(m.alignment >= 1 && (m.alignment & (m.alignment - 1)) == 0,
       "accepted: alignment not a power of two");
  need(m.param_dtype == "f32" || m.param_dtype == "f16" || m.param_dtype == "bf16",
       "accepted: param_dtype not f32, f16 or bf16");
  need(m.fp16 == (m.param_dtype == "f16"), "accepted: fp16 disagrees with param_dtype");
  need(m.steps >= 0 && m.skipped >= 0 && m.skipped <= m.steps,
       "accepted: steps < 0 or skipped not in [0, steps]");
  need(!m.files.empty() && m.file("trainer.bin") != nullptr, "accepted: trainer.bin not listed");
  for (std::size_t a = 0; a < m.files.size(); ++a) {
    for (std::size_t b = a + 1; b < m.files.size(); ++b) {
      need(m.files[a].name != m.files[b].name, "accepted: a file listed twice");
    }
  }
  // A piece's bytes lie in a listed file of a rank below world_size ("rank-%05d.bin").
  const auto in_a_rank_file = [&](const zero::ckpt::detail::Piece& pc, bool master) {
    const zero::ckpt::detail::FileEntry* f = m.file(pc.file);
    need(f != nullptr, "accepted: a piece in a file not listed");
    int r = -1;
    char name[32] = "";
    if (std::sscanf(pc.file.c_str(), "rank-%9d.bin", &r) == 1 && r >= 0) {
      std::snprintf(name, sizeof name, "rank-%05d.bin", r);
    }
    need(pc.file == name && r < m.world_size,
         "accepted: a piece not in the file of a rank below world_size");
    using u128 = unsigned __int128;
    const u128 size = f->digest.size, n = pc.end - pc.begin;
    need(pc.begin < pc.end, "accepted: an empty piece");
    if (master) need(u128{pc.master_offset} + 4 * n <= size, "accepted: a master past its file");
    for (std::size_t off : pc.state_offsets) {
      need(u128{off} + n <= size, "accepted: a state past its file");  // >= 1 byte per element
    }
  };
  for (const auto& u : m.units) {
    for (const auto& p : u.params) {
      need(p.dtype == "f32", "accepted: a parameter's dtype not f32");
      unsigned __int128 numel = 1;
      for (std::int64_t e : p.shape) {
        need(e >= 1, "accepted: an extent < 1");
        numel *= static_cast<std::uint64_t>(e);
        need(numel <= (std::uint64_t{1} << 48), "accepted: numel > 2^48");
      }
      need(!p.shape.empty() && numel == p.numel, "accepted: numel not the shape's product");
      std::size_t at = 0;
      for (const auto& pc : p.pieces) {
        need(pc.begin == at && pc.end <= p.numel, "accepted: pieces that do not tile [0, numel)");
        in_a_rank_file(pc, true);
        at = pc.end;
      }
      need(at == p.numel, "accepted: pieces that do not cover [0, numel)");
    }
    for (const auto& pc : u.states) in_a_rank_file(pc, false);
  }
}

// Manifest::parse in its two steps, counted; what check() accepts held to expect_sound().
Manifest parse_counted(const std::string& text, const char* where) {
  Manifest m = Manifest::parse_fields(text, where);
  ++counts.reached;
  counts.last_reached = text;
  try {
    m.check(where);
  } catch (const zero::Error&) {
    ++counts.refused;
    throw;
  }
  expect_sound(m);
  return m;
}

// T: Manifest or Fragment. Parses `text`; when it parses, checks the round trip.
template <typename T>
void parse_and_round_trip(const std::string& text, const char* where) {
  std::string first_json;
  try {
    if constexpr (std::is_same_v<T, Manifest>) {
      first_json = parse_counted(text, where).to_json();
    } else {
      first_json = T::parse(text, where).to_json();
    }
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

// Values at the edges of the ranges Manifest::check holds the fields to, and of their types.
const nlohmann::json& edge_values() {
  static const nlohmann::json values =
      nlohmann::json::array({0,
                             -1,
                             1,
                             2,
                             3,
                             4,
                             9,
                             31,
                             32,
                             33,
                             255,
                             256,
                             1 << 20,
                             (1 << 20) + 1,
                             1000000000,
                             std::numeric_limits<std::int64_t>::max(),
                             std::numeric_limits<std::int64_t>::min(),
                             std::numeric_limits<std::uint64_t>::max(),
                             0.5,
                             -0.0,
                             1e300,
                             "f32",
                             "f16",
                             "bf16",
                             "f64",
                             "int8",
                             "Adam",
                             "AdamW",
                             "SGD",
                             "rank-00000.bin",
                             "rank-00001.bin",
                             "rank-00002.bin",
                             "rank-99999.bin",
                             "trainer.bin",
                             "",
                             true,
                             false,
                             nullptr,
                             nlohmann::json::array(),
                             nlohmann::json::object()});
  return values;
}

void collect(nlohmann::json& j, std::vector<nlohmann::json*>& nodes) {
  nodes.push_back(&j);
  if (j.is_structured()) {
    for (auto& child : j) collect(child, nodes);
  }
}

// One change to one value of a JSON document: an edge value, a number nudged, a key or an array
// element dropped, an array element repeated, or another node's value copied in. False when
// nothing changed.
bool mutate_one_value(nlohmann::json& doc, std::minstd_rand& rng) {
  std::vector<nlohmann::json*> nodes;
  collect(doc, nodes);
  nlohmann::json& n = *nodes[rng() % nodes.size()];
  switch (rng() % 5) {
    case 0: {  // mostly one of n's type, so that the field still parses and reaches check()
      const nlohmann::json& values = edge_values();
      for (int tries = 0; tries < 8; ++tries) {
        const nlohmann::json& v = values[rng() % values.size()];
        if (tries == 7 || rng() % 8 == 0 || (v.is_number() && n.is_number()) ||
            v.type() == n.type()) {
          n = v;
          return true;
        }
      }
      return false;
    }
    case 1:
      if (!n.is_number_integer()) return false;
      // In unsigned arithmetic: wraps at the int64 edges instead of overflowing.
      n = static_cast<std::int64_t>(static_cast<std::uint64_t>(n.get<std::int64_t>()) + rng() % 9 -
                                    4);
      return true;
    case 2:
      if (n.is_object() && !n.empty()) {
        auto it = n.begin();
        std::advance(it, static_cast<long>(rng() % n.size()));
        n.erase(it);
        return true;
      }
      if (n.is_array() && !n.empty()) {
        n.erase(rng() % n.size());
        return true;
      }
      return false;
    case 3:
      if (!n.is_array() || n.empty()) return false;
      n.push_back(nlohmann::json(n[rng() % n.size()]));  // a copy: push_back may reallocate
      return true;
    default: {  // another node's value, mostly of n's type
      for (int tries = 0; tries < 8; ++tries) {
        const nlohmann::json& other = *nodes[rng() % nodes.size()];
        if (tries == 7 || other.type() == n.type()) {
          n = nlohmann::json(other);  // a copy first: `other` may contain n
          return true;
        }
      }
      return false;
    }
  }
}

}  // namespace

// One mutation in eight is libFuzzer's own, on the bytes (the syntax, the field types); the
// others, on an input that is a JSON object, change values of the document and write it back, so
// that most of them reach Manifest::check with well-formed fields out of range or inconsistent
// (byte mutations of a 5 KB manifest seldom keep every field parsing).
extern "C" std::size_t LLVMFuzzerMutate(std::uint8_t* data, std::size_t size, std::size_t max_size);
extern "C" std::size_t LLVMFuzzerCustomMutator(std::uint8_t* data, std::size_t size,
                                               std::size_t max_size, unsigned int seed) {
  std::minstd_rand rng(seed);
  // libFuzzer chains up to 5 mutations per input: one byte mutation in the chain mostly breaks
  // the JSON, so they are the fewer.
  if (rng() % 8 == 0) return LLVMFuzzerMutate(data, size, max_size);
  nlohmann::json doc =
      nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    // Most of the corpus soon is broken syntax (each parse error is new coverage): half of its
    // mutations start again from the last input whose fields all parsed.
    if (counts.last_reached.empty() || rng() % 2 == 0) {
      return LLVMFuzzerMutate(data, size, max_size);
    }
    doc = nlohmann::json::parse(counts.last_reached, nullptr, /*allow_exceptions=*/false);
    if (doc.is_discarded() || !doc.is_object()) return LLVMFuzzerMutate(data, size, max_size);
  }
  bool changed = false;
  for (unsigned k = 1 + rng() % 3; k > 0; --k) changed = mutate_one_value(doc, rng) || changed;
  if (!changed) return LLVMFuzzerMutate(data, size, max_size);
  const std::string out = doc.dump();
  if (out.size() > max_size) return LLVMFuzzerMutate(data, size, max_size);
  std::memcpy(data, out.data(), out.size());
  return out.size();
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  parse_and_round_trip<Manifest>(text, "fuzz/manifest.json");
  parse_and_round_trip<Fragment>(text, "fuzz/fragment.json");
  return 0;
}
