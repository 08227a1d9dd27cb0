// A unit's shards in a merged bucket's rank-major staging (see engine/bucket_layout.hpp).
#include "engine/bucket_layout.hpp"

namespace zero::detail {

char* BucketSlot::part(int q) const {
  return at(staging, static_cast<std::size_t>(q) * bucket_shard + offset, dtype);
}

namespace {
template <class Fn>
void for_ranks(RankSelect ranks, Fn fn) {
  for (int q = 0; q < ranks.world; ++q) {
    if ((ranks.only >= 0 && q != ranks.only) || q == ranks.skip) continue;
    fn(q);
  }
}
}  // namespace

void pack(DeviceOps& dev, const char* unit, DType unit_dtype, const BucketSlot& slot,
          RankSelect ranks) {
  for_ranks(ranks, [&](int q) {
    const char* src = at(unit, static_cast<std::size_t>(q) * slot.shard, unit_dtype);
    if (unit_dtype == slot.dtype) {
      dev.copy(slot.part(q), src, slot.shard * dtype_size(slot.dtype));
    } else {
      dev.convert(src, unit_dtype, slot.part(q), slot.dtype, slot.shard);
    }
  });
}

void unpack(DeviceOps& dev, const BucketSlot& slot, char* unit, RankSelect ranks) {
  for_ranks(ranks, [&](int q) {
    dev.copy(at(unit, static_cast<std::size_t>(q) * slot.shard, slot.dtype), slot.part(q),
             slot.shard * dtype_size(slot.dtype));
  });
}

}  // namespace zero::detail
