// engine/bucket_layout.hpp — where a unit's shards sit in a merged bucket's staging, and the one
// copy between a unit and its place there (the reducer's and the gatherer's packs and unpacks).
//
// A merged bucket's staging is rank-major: rank q's part of the collective at q x bucket.shard
// elements, and in every part each unit of the bucket at its offset (UnitPlacement's
// reduce_offset / gather_offset). A unit laid out whole holds rank q's shard at q x shard.
//
// Thread safety: plain functions over the caller's buffers.
#pragma once

#include <cstddef>

#include "engine/placement.hpp"
#include "zero/core/dtype.hpp"
#include "zero/device/device_ops.hpp"

namespace zero::detail {

// A unit's place in a merged bucket's staging.
struct BucketSlot {
  void* staging = nullptr;       // the bucket's staging (world_size parts of bucket_shard)
  std::size_t bucket_shard = 0;  // elements per rank's part
  std::size_t offset = 0;        // the unit's offset in every part (elements)
  std::size_t shard = 0;         // the unit's shard (elements)
  DType dtype = DType::kF32;     // the staging's dtype
  BucketSlot(void* s, const Bucket& b, std::size_t unit_offset, std::size_t unit_shard, DType d)
      : staging(s), bucket_shard(b.shard), offset(unit_offset), shard(unit_shard), dtype(d) {}
  char* part(int q) const;  // the unit's shard in rank q's part
};

// Which ranks' shards a copy moves: all of [0, world), only one, or all but one.
struct RankSelect {
  int world = 1;
  int only = -1;  // >= 0: this rank's shard only
  int skip = -1;  // >= 0: every rank's but this one
  static RankSelect all(int world) { return {world, -1, -1}; }
  static RankSelect just(int world, int rank) { return {world, rank, -1}; }
  static RankSelect except(int world, int rank) { return {world, -1, rank}; }
};

// The unit's shards (rank q's at `unit` + q x shard elements of unit_dtype) into the slot,
// converted to the slot's dtype where they differ.
void pack(DeviceOps& dev, const char* unit, DType unit_dtype, const BucketSlot& slot,
          RankSelect ranks);
// The slot's shards back into the unit (same dtype).
void unpack(DeviceOps& dev, const BucketSlot& slot, char* unit, RankSelect ranks);

}  // namespace zero::detail
