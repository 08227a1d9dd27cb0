// zero/config_reader.hpp — the one place a merged config document becomes a Config: every key
// read with its type and range, unknown keys refused with a suggestion, contradictions named
// (zero/config.cpp). The sources that build the document (file, environment, --set, arguments)
// are zero/config_builder.cpp's.
//
// Thread safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>

#include "zero/config.hpp"

namespace zero::detail {

// Throws zero::Error(kConfig) naming the full key path and the value.
Config read_config(const nlohmann::json& doc);

}  // namespace zero::detail
