// zero/config/config_reader.hpp — the one place a merged config document becomes a Config: every
// key read with its type and range, unknown keys refused with a suggestion, contradictions named
// (zero/config/config.cpp). The sources that build the document (file, environment, --set,
// arguments) are zero/config/config_builder.cpp's; the bounds below are what both sides enforce.
//
// Thread safety: pure functions.
#pragma once

#include <array>
#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "zero/config.hpp"

namespace zero::detail {

// ---- bounds on what a config source may hold (documented in include/zero/config.hpp)

inline constexpr std::size_t kMaxConfigBytes = std::size_t{16} << 20;  // one file or JSON text
// Objects and arrays open at once, the document's top-level object included. Enforced while
// parsing, so nothing recursive (merge, copy, dump, destruction) ever sees a deeper document.
inline constexpr int kMaxConfigDepth = 64;
inline constexpr std::size_t kMaxKeyBytes = 256;
inline constexpr std::size_t kMaxStringBytes = 4096;  // PATH_MAX: nvme_path is the longest
inline constexpr std::size_t kMaxEchoBytes = 80;      // of a key or value quoted in a message

// `s` as it may appear in a message: bytes outside printable ASCII as \xNN, at most `max` bytes
// of it, then "... (N bytes)". Every echo of input goes through it.
std::string printable(std::string_view s, std::size_t max = kMaxEchoBytes);

// The offset of the first byte of `s` that is not well-formed UTF-8 (RFC 3629: no overlong
// forms, no surrogates, nothing above U+10FFFF), or nullopt.
std::optional<std::size_t> utf8_error(std::string_view s);

// The values of optimizer.type and scheduler.type the reader accepts.
inline constexpr std::array<std::string_view, 5> kOptimizerTypes = {"Adam", "AdamW", "SGD", "Lion",
                                                                    "Adagrad"};
inline constexpr std::array<std::string_view, 4> kSchedulerTypes = {"WarmupLR", "WarmupDecayLR",
                                                                    "WarmupCosineLR", "OneCycle"};

// Throws zero::Error(kConfig) naming the full key path and the value. A key given with a value
// that has no effect here is named once, at warn level (detail::config_keys()). `asked`, when
// given, receives the full path of every key this read asked for, given or not (the keys test
// derives the accepted keys from it).
Config read_config(const nlohmann::json& doc, std::set<std::string>* asked = nullptr);

// optimizer.param_groups (zero/config/param_group_rules.cpp): the rules of `value`, validated
// (kConfig naming "<path>[i].<key>"), and their JSON as the reader takes it.
std::vector<ParamGroupRule> read_param_group_rules(const nlohmann::json& value,
                                                   const std::string& path);
nlohmann::json param_group_rules_json(const std::vector<ParamGroupRule>& rules);

}  // namespace zero::detail
