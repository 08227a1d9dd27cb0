// engine/flat_layout.hpp — where each unit's parameters sit in the flat buffers, and its shards.
//
// A unit is laid out as one flat range: parameter i starts at params[i].offset (a multiple of
// the alignment), the range is padded to a multiple of N x max(alignment, shard_multiple)
// (padded) and split into N shards of `shard` elements (a shard thus starts on a multiple of
// shard_multiple: the int8 moments' quantization block, so that blocks never straddle shards).
// Units are concatenated in declaration order, both as whole units (full_offset) and as shards
// (shard_offset).
//
// Thread safety: a plain value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "zero/engine/unit.hpp"

namespace zero::detail {

struct ParamLayout {
  std::size_t offset = 0;  // in the unit's flat range
  std::size_t numel = 0;
};

struct UnitLayout {
  std::vector<ParamLayout> params;
  std::size_t numel = 0;         // end of the last parameter (before padding)
  std::size_t padded = 0;        // multiple of N x alignment
  std::size_t shard = 0;         // padded / N
  std::size_t full_offset = 0;   // sum of the padded sizes of the units before
  std::size_t shard_offset = 0;  // sum of the shard sizes of the units before
  // What the unit is, beyond its size: a digest of its parameters' shapes, groups and frozen
  // flags (not their names). Ranks with the same model have the same digests; the engine's
  // collectives carry it (Communicator::tag_next) so ranks whose models differ by less than the
  // padding fail the fingerprint check instead of training apart.
  std::uint64_t digest = 0;
};

struct Layout {
  std::vector<UnitLayout> units;
  std::size_t total_padded = 0;
  std::size_t total_shard = 0;
  std::size_t max_padded = 0;
};

// Throws zero::Error(kInvalidArgument) naming the unit / parameter for an empty unit, an empty
// shape or an extent < 1, and for an alignment or shard multiple that is not a power of two.
Layout make_layout(const std::vector<UnitSpec>& units, int world_size, std::size_t alignment,
                   std::size_t shard_multiple = 1);

}  // namespace zero::detail
