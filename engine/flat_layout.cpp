#include "engine/flat_layout.hpp"

#include <algorithm>

#include <xxhash.h>

#include "zero/core/error.hpp"

namespace zero {

std::size_t ParamSpec::numel() const {
  std::size_t n = 1;
  for (std::int64_t e : shape) n *= static_cast<std::size_t>(e);
  return n;
}

namespace detail {

Layout make_layout(const std::vector<UnitSpec>& units, int world_size, std::size_t alignment,
                   std::size_t shard_multiple) {
  ZERO_CHECK(alignment >= 1 && (alignment & (alignment - 1)) == 0, kInvalidArgument,
             "alignment must be a power of two, got ", alignment);
  ZERO_CHECK(shard_multiple >= 1 && (shard_multiple & (shard_multiple - 1)) == 0, kInternal,
             "shard multiple must be a power of two, got ", shard_multiple);
  const std::size_t shard_align = std::max(alignment, shard_multiple);  // powers of two: the lcm
  ZERO_CHECK(world_size >= 1, kInvalidArgument, "world size must be >= 1, got ", world_size);
  const std::size_t n = static_cast<std::size_t>(world_size);
  auto round_up = [](std::size_t x, std::size_t m) { return (x + m - 1) / m * m; };
  Layout out;
  for (const UnitSpec& u : units) {
    ZERO_CHECK(!u.params.empty(), kInvalidArgument, "unit '", u.name, "' has no parameters");
    UnitLayout ul;
    std::size_t at = 0;
    std::vector<std::int64_t> described;  // per parameter: rank, extents, group, trainable
    for (const ParamSpec& p : u.params) {
      described.push_back(static_cast<std::int64_t>(p.shape.size()));
      described.insert(described.end(), p.shape.begin(), p.shape.end());
      described.push_back(p.group);
      described.push_back(p.trainable ? 1 : 0);
      ZERO_CHECK(!p.shape.empty(), kInvalidArgument, "parameter '", u.name, ".", p.name,
                 "' has an empty shape");
      for (std::int64_t e : p.shape) {
        ZERO_CHECK(e >= 1, kInvalidArgument, "parameter '", u.name, ".", p.name, "' has an extent ",
                   e, " (must be >= 1)");
      }
      at = round_up(at, alignment);
      ul.params.push_back({at, p.numel()});
      at += p.numel();
    }
    ul.numel = at;
    ul.digest = XXH3_64bits(described.data(), described.size() * sizeof(std::int64_t));
    ul.padded = round_up(at, n * shard_align);
    ul.shard = ul.padded / n;
    ul.full_offset = out.total_padded;
    ul.shard_offset = out.total_shard;
    out.total_padded += ul.padded;
    out.total_shard += ul.shard;
    out.max_padded = std::max(out.max_padded, ul.padded);
    out.units.push_back(std::move(ul));
  }
  return out;
}

}  // namespace detail
}  // namespace zero
