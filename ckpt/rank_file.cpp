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
  const bool by_unit = op.state_dtype() == MomentDType::kInt8;
  const std::size_t sd = by_unit ? 0 : state_bytes(op.state_dtype(), 1);
  const int piece_states = by_unit ? 0 : op.num_states();
  for (const ParamShard& s : l.shards) {
    Piece p;
    p.file = l.file;
    p.begin = s.begin;
    p.end = s.end;
    const std::size_t n = s.end - s.begin;
    p.master_offset = l.bytes;
    l.bytes += n * 4;
    for (int k = 0; k < piece_states; ++k) {
      p.state_offsets.push_back(l.bytes);
      l.bytes += n * sd;
    }
    l.pieces.push_back(std::move(p));
  }
  if (!by_unit || op.num_states() == 0) return l;
  l.unit_states.resize(static_cast<std::size_t>(e.num_units()));
  for (UnitId u = 0; u < e.num_units(); ++u) {
    const std::size_t n = e.unit_step_numel(u);
    if (n == 0) continue;
    Piece p;
    p.file = l.file;
    p.begin = e.unit_step_begin(u);
    p.end = p.begin + n;
    for (int k = 0; k < op.num_states(); ++k) {
      p.state_offsets.push_back(l.bytes);
      l.bytes += state_bytes(op.state_dtype(), n);
    }
    l.unit_states[static_cast<std::size_t>(u)].push_back(std::move(p));
  }
  return l;
}

}  // namespace zero::ckpt::detail
