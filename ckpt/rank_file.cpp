#include "ckpt/rank_file.hpp"

#include <cstdio>

namespace zero::ckpt::detail {

std::string rank_file(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank-%05d.bin", rank);
  return buf;
}

RankLayout rank_layout(Engine& e) {
  RankLayout l;
  // Stage 0: every rank steps the same whole units; rank 0's copy is the checkpoint's.
  if (e.stage() == 0 && e.comm().rank() != 0) return l;
  l.file = rank_file(e.comm().rank());
  l.shards = e.param_shards();
  const OptimizerParams& op = e.optimizer_params();
  ZERO_CHECK(op.state_dtype() != MomentDType::kInt8, kInvalidArgument,
             "checkpoint save: int8 moments are not supported yet");
  const std::size_t sd = state_bytes(op.state_dtype(), 1);
  for (const ParamShard& s : l.shards) {
    Piece p;
    p.file = l.file;
    p.begin = s.begin;
    p.end = s.end;
    const std::size_t n = s.end - s.begin;
    p.master_offset = l.bytes;
    l.bytes += n * 4;
    for (int k = 0; k < op.num_states(); ++k) {
      p.state_offsets.push_back(l.bytes);
      l.bytes += n * sd;
    }
    l.pieces.push_back(std::move(p));
  }
  return l;
}

}  // namespace zero::ckpt::detail
