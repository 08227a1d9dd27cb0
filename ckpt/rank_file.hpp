// ckpt/rank_file.hpp — what one rank's data file holds and where: for each parameter range the
// rank steps (Engine::param_shards), the fp32 master then each optimizer state, in unit order.
// With int8 moments the parameter ranges hold the master alone, and each unit's stepped range's
// states follow, as the engine holds them (codes and each block's absmax: a block spans
// parameters, so the state is saved as is, by unit range).
// Shared by the save (which writes it) and its fragment (which the manifest merges).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "ckpt/manifest.hpp"
#include "zero/engine/engine.hpp"

namespace zero::ckpt::detail {

struct RankLayout {
  std::string file;  // rank-<r>.bin; empty when the rank writes no data (stage 0, rank > 0)
  std::vector<ParamShard> shards;
  std::vector<Piece> pieces;  // one per shard, with its byte offsets in `file`
  // int8 moments: per unit, its stepped range's state piece (range in the unit's padded
  // elements), none for a unit the rank does not step; empty otherwise.
  std::vector<std::vector<Piece>> unit_states;
  std::size_t bytes = 0;
};

std::string rank_file(int rank);
RankLayout rank_layout(Engine& engine);

}  // namespace zero::ckpt::detail
