// tests/optim/isas.hpp — the CPU optimizer's instruction sets this machine runs (scalar always),
// for the tests that check every path against the scalar path.
#pragma once

#include <vector>

#include "zero/core/cpu_features.hpp"

namespace zero::testing {

inline std::vector<Isa> available_isas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (isa_supported(isa)) out.push_back(isa);
  }
  return out;
}

}  // namespace zero::testing
