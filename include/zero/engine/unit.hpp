// zero/engine/unit.hpp — what a trainer declares to the engine: units and their parameters.
//
// A unit (a layer, a block) is the granularity of gather and reduce: its parameters are laid
// out in one flat buffer and sharded together (DESIGN.md). Units are numbered 0, 1, ... in the
// order they are declared.
//
// Thread safety: plain values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace zero {

using UnitId = int;

struct ParamSpec {
  std::string name;
  std::vector<std::int64_t> shape;  // every extent >= 1
  // The parameter group whose hyper-parameters step it (zero/optim/optimizer.hpp ParamGroup): 0 is
  // the config's optimizer block, k >= 1 the k-th group added with Engine::add_param_group.
  int group = 0;
  // false: a frozen parameter. Kept (sharded at stage 3, gathered for forward and backward) but
  // never stepped: it gets no gradient buffer, no reduction, no master copy and no optimizer
  // state (Engine::grad of it is an error naming it). The parameters of one unit are either all
  // trainable or all frozen: the unit is the granularity of reduce and step (docs/param_groups.md,
  // "Frozen parameters"); give a frozen part its own unit.
  bool trainable = true;
  std::size_t numel() const;
};

struct UnitSpec {
  std::string name;
  std::vector<ParamSpec> params;  // at least one
};

}  // namespace zero
