// config/config_keys.hpp — the one table of every DeepSpeed (and zero) config key the
// reader accepts, with what each does here: implemented (DeepSpeed's meaning; the test file that
// shows its effect), no effect (named once per read at warn level, with what DeepSpeed would do
// and why it is not needed here, unless given the value that behaves here as in DeepSpeed), or
// refused (only the value that behaves as here is accepted; any other is an error naming it).
//
// The reader (config/config.cpp) looks every key it reads up here; the test
// tests/config/config_keys_test.cpp enumerates the keys the reader asks for (read_config's
// `asked`) and fails for a key without a row, a row the reader never reads, an implemented key
// whose value does not reach the Config or whose test file does not name it, a no-effect key
// without its message and a refused key that is not refused. README.md's key table lists the
// same rows.
//
// Thread safety: constant data.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string_view>

namespace zero::detail {

enum class KeyHandling : std::uint8_t {
  kImplemented,  // does what DeepSpeed does (or is a zero extension)
  kNoEffect,     // accepted; named once with `meaning` unless the value is `quiet`
  kRefused,      // accepted only with the value `quiet`; the reader refuses any other
};

struct ConfigKey {
  std::string_view path;  // full key path: "zero_optimization.reduce_scatter"
  KeyHandling handling;
  // JSON text of the value that behaves here as in DeepSpeed (no message, not refused); "" for
  // kNoEffect: any value is named. Not used by kImplemented.
  std::string_view quiet;
  // JSON text of a valid value the keys test sets (kNoEffect: not `quiet`; kRefused: refused).
  std::string_view sample;
  // kImplemented: the test file (from the project root) where its effect is checked.
  std::string_view effect_test;
  // What it means here. kNoEffect: what DeepSpeed would do and why it is not needed here (the
  // message).
  std::string_view meaning;
  // JSON text merged into the keys test's document before the sample is set (a stage the key
  // applies at), or "".
  std::string_view context = "";
};

// Every accepted key, in the order of the README table.
std::span<const ConfigKey> config_keys();
// The row of a full key path, or null.
const ConfigKey* find_config_key(std::string_view path);
// Whether `value` is the row's quiet value (an object whose "enabled" is false is quiet too: a
// disabled block does nothing anywhere).
bool is_quiet(const ConfigKey& row, const nlohmann::json& value);

}  // namespace zero::detail
