// Ranks that disagree on their collectives, run the same way on every backend (in-process
// ThreadGroup, MPI with comm_debug detail): the last rank of the group diverges, and every rank
// must fail at the collective where it diverged with a kInvalidArgument error naming both calls
// and their units. Each scenario returns what this rank saw; the callers assert on it and print
// the time to the error next to the timeout (no assertion on the time).
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "common/mlp_training.hpp"
#include "zero/comm/comm.hpp"
#include "zero/engine/engine.hpp"

namespace zero::test {

enum class Divergence {
  kSkipsAGather,
  kOtherCount,
  kOtherModel,
  kPaddedModel,
  kOtherShapes,
  kOtherFrozen
};

struct DivergenceSeen {
  bool failed = false;
  ErrorCode code = ErrorCode::kInternal;
  std::string message;
  std::uint64_t issued = 0;  // collectives this rank had issued when it failed
  double seconds = 0;        // from the start of the scenario to the error
};

// A stage-3-like step of a model of 4 units of 8 floats: gather units 0..3, reduce-scatter
// 3..0, each collective tagged with its unit.
//   kSkipsAGather  the last rank skips unit 2's gather (seq 2: unit 2 vs unit 3).
//   kOtherCount    the last rank reduce-scatters unit 1 with 9 elements a rank, the others 8.
//   kOtherModel    the last rank's model (an Engine over the test MLP) has a hidden layer 32
//                  wider: its units' padded sizes differ (another count moved).
//   kPaddedModel   the last rank's hidden layer is 1 wider: the padding to a multiple of 32 x
//                  ranks elements absorbs it, every collective moves the same count; the units'
//                  layouts in the fingerprint (TagLayout) differ.
//   kOtherShapes   one unit of a 6 x 4 weight and a 4-bias, the last rank's weight 4 x 6: the
//                  same elements in another shape.
//   kOtherFrozen   the same unit, frozen on the last rank only (ParamSpec::trainable): the same
//                  shapes, gathered alike.
inline DivergenceSeen run_divergence(Communicator& c, Divergence d) {
  DivergenceSeen seen;
  const bool odd = c.rank() == c.size() - 1;
  const auto n = static_cast<std::size_t>(c.size());
  const auto t0 = std::chrono::steady_clock::now();
  try {
    if (d == Divergence::kOtherModel || d == Divergence::kPaddedModel) {
      std::vector<int> dims = testing::kDims;
      if (odd) dims[1] += d == Divergence::kOtherModel ? 32 : 1;
      testing::RunSpec spec{.stage = 3, .ranks = c.size()};
      const Config cfg = testing::make_config(spec);
      testing::Mlp mlp(dims);
      Engine e(c, cfg);
      mlp.declare(e);
      mlp.init(e, 42);
      testing::run_steps(e, mlp, c.rank(), 2);
    } else if (d == Divergence::kOtherShapes || d == Divergence::kOtherFrozen) {
      Engine e(c, testing::make_config(testing::RunSpec{.stage = 3, .ranks = c.size()}));
      const std::vector<std::int64_t> w = odd && d == Divergence::kOtherShapes
                                              ? std::vector<std::int64_t>{4, 6}
                                              : std::vector<std::int64_t>{6, 4};
      const bool trainable = !(odd && d == Divergence::kOtherFrozen);
      e.add_unit(UnitSpec{"layer",
                          {ParamSpec{.name = "w", .shape = w, .trainable = trainable},
                           ParamSpec{.name = "b", .shape = {4}, .trainable = trainable}}});
      GatherGuard g = e.gather(0);
    } else {
      std::vector<float> shard(9, 1.0f), full(9 * n, 0.0f);
      for (int u = 0; u < 4; ++u) {
        if (d == Divergence::kSkipsAGather && odd && u == 2) continue;
        c.tag_next(u);
        c.all_gather(shard.data(), full.data(), 8, DType::kF32);
      }
      for (int u = 3; u >= 0; --u) {
        const std::size_t count = d == Divergence::kOtherCount && odd && u == 1 ? 9 : 8;
        c.tag_next(u);
        c.reduce_scatter(full.data(), shard.data(), count, DType::kF32, ReduceOp::kSum);
      }
    }
  } catch (const Error& e) {
    seen.failed = true;
    seen.code = e.code();
    seen.message = e.message();
  }
  seen.issued = c.issued();
  seen.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return seen;
}

// What every rank's error must name: both sides' calls with their units.
inline std::vector<std::string> divergence_names(Divergence d, int size) {
  const std::string last = std::to_string(size - 1);
  switch (d) {
    case Divergence::kSkipsAGather:
      return {"rank 0 issued seq 2 all_gather(8 x f32) unit 2",
              "rank " + last + " issued seq 2 all_gather(8 x f32) unit 3"};
    case Divergence::kOtherCount:
      return {"rank 0 issued seq 6 reduce_scatter(8 x f32, sum) unit 1",
              "rank " + last + " issued seq 6 reduce_scatter(9 x f32, sum) unit 1"};
    case Divergence::kOtherModel: return {"ranks disagree on the collective: rank 0 issued seq"};
    case Divergence::kPaddedModel:
      // Unit 0 is the first layer: an 11 x 5 weight, its bias at 64 (32-aligned): 75 elements;
      // the last rank's 12 x 5 and 12: 76. Both pad to the same multiple of 32 x ranks.
      return {"the ranks' models differ: at seq 0 all_gather(",
              ") unit 0: rank 0 moves 75 parameter elements (before padding), rank " + last +
                  " moves 76;"};
    case Divergence::kOtherShapes:
    case Divergence::kOtherFrozen:
      // 24 weight elements, the bias at 32: 36 elements either way.
      return {"the ranks' models differ: at seq 0 all_gather(",
              ") unit 0: rank 0 moves 36 parameter elements (before padding), rank " + last +
                  " moves 36 in other parameter shapes, groups or frozen flags"};
  }
  return {};
}

inline const char* to_string(Divergence d) {
  switch (d) {
    case Divergence::kSkipsAGather: return "skips_a_gather";
    case Divergence::kOtherCount: return "other_count";
    case Divergence::kOtherModel: return "other_model";
    case Divergence::kPaddedModel: return "padded_model";
    case Divergence::kOtherShapes: return "other_shapes";
    case Divergence::kOtherFrozen: return "other_frozen";
  }
  return "?";
}

}  // namespace zero::test
