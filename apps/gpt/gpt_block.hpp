// gpt/gpt_block.hpp — the twelve parameters of a transformer block in the order GptModel::declare
// gives them (llm.c's order), as f32 pointers: shared by the CPU model and the CUDA model (host
// or device pointers).
//
// Thread safety: a plain value.
#pragma once

#include <vector>

namespace zero::gpt {

struct BlockTensors {
  static constexpr int kCount = 12;
  const float *ln1_w, *ln1_b, *qkv_w, *qkv_b, *proj_w, *proj_b, *ln2_w, *ln2_b, *fc_w, *fc_b,
      *fcproj_w, *fcproj_b;
  // REQUIRES: p.size() >= kCount, in declaration order.
  explicit BlockTensors(const std::vector<const float*>& p)
      : ln1_w(p[0]),
        ln1_b(p[1]),
        qkv_w(p[2]),
        qkv_b(p[3]),
        proj_w(p[4]),
        proj_b(p[5]),
        ln2_w(p[6]),
        ln2_b(p[7]),
        fc_w(p[8]),
        fc_b(p[9]),
        fcproj_w(p[10]),
        fcproj_b(p[11]) {}
};

}  // namespace zero::gpt
