// Attach mode (Engine::attach): the trainer's own flat parameter and gradient buffers as the
// engine's units. Without frozen ranges the buffer is one unit, "attached"; with them
// (EngineOptions::attach_frozen) it is cut into units at the ranges' boundaries, each on the grid
// every unit is padded to, so the layout's offsets are the trainer's own and the frozen units go
// through the same placement as a managed engine's (no gradients, master or state).
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine_impl.hpp"
#include "zero/engine/engine.hpp"

namespace zero {

std::size_t attach_granularity(int world_size, std::size_t alignment) {
  ZERO_CHECK(world_size >= 1 && alignment >= 1, kInvalidArgument,
             "attach_granularity: world size and alignment must be >= 1");
  return static_cast<std::size_t>(world_size) * alignment;
}

std::size_t attach_capacity(std::size_t numel, int world_size, std::size_t alignment) {
  const std::size_t m = attach_granularity(world_size, alignment);
  return (numel + m - 1) / m * m;
}

namespace {

using Range = EngineOptions::ElementRange;

// The frozen ranges checked (inside the buffer, boundaries on the grid), sorted and merged.
std::vector<Range> frozen_ranges(std::vector<Range> frozen, std::size_t numel, int world,
                                 std::size_t alignment) {
  const std::size_t grid = attach_granularity(world, alignment);
  for (std::size_t k = 0; k < frozen.size(); ++k) {
    const Range& r = frozen[k];
    const std::string what = "EngineOptions::attach_frozen[" + std::to_string(k) + "] = [" +
                             std::to_string(r.begin) + ", " + std::to_string(r.end) + ")";
    ZERO_CHECK(r.begin < r.end && r.end <= numel, kInvalidArgument, what,
               " is empty or outside the buffer's ", numel, " elements");
    for (const std::size_t b : {r.begin, r.end}) {
      if (b == numel || b % grid == 0) continue;
      ZERO_THROW(kInvalidArgument, what, ": boundary ", b, " is not a multiple of ", grid, " (",
                 world, " ranks x alignment ", alignment,
                 "): the buffer is cut into units there and every unit is padded to that grid; "
                 "lay the frozen tensors out on it (nearest boundaries ",
                 b / grid * grid, " and ", (b / grid + 1) * grid,
                 ") or lower EngineOptions::alignment (int8 moments: at least 256, their block)");
    }
  }
  std::sort(frozen.begin(), frozen.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  std::vector<Range> merged;
  for (const Range& r : frozen) {
    if (!merged.empty() && r.begin <= merged.back().end) {
      merged.back().end = std::max(merged.back().end, r.end);
    } else {
      merged.push_back(r);
    }
  }
  return merged;
}

UnitSpec attach_unit(std::size_t begin, std::size_t end, bool trainable, bool whole) {
  const std::string name =
      whole ? std::string("attached")
            : "attached[" + std::to_string(begin) + ":" + std::to_string(end) + "]";
  return {name, {{"flat", {static_cast<std::int64_t>(end - begin)}, 0, trainable}}};
}

}  // namespace

void Engine::Impl::attach_units(std::size_t numel) {
  // int8 moments pad every unit to a multiple of their quantization block per rank (a shard
  // starts on one): the grid the frozen ranges' boundaries must lie on is that multiple's.
  const std::vector<Range> frozen =
      frozen_ranges(opts.attach_frozen, numel, input.world_size,
                    std::max(input.alignment, state_block(input.state_dtype)));
  std::vector<std::pair<Range, bool>> tiles;  // [begin, end), trainable
  std::size_t at = 0;
  for (const Range& r : frozen) {
    if (r.begin > at) tiles.push_back({{at, r.begin}, true});
    tiles.push_back({r, false});
    at = r.end;
  }
  if (at < numel) tiles.push_back({{at, numel}, true});
  for (const auto& [r, trainable] : tiles) {
    specs.push_back(attach_unit(r.begin, r.end, trainable, tiles.size() == 1));
  }
  // attach_groups (make_groups: element ranges of the whole buffer, as unit 0's) per unit.
  std::vector<detail::GroupSpan> spans;
  for (std::size_t k = 0; k < input.group_spans.size(); ++k) {
    const detail::GroupSpan& s = input.group_spans[k];
    ZERO_CHECK(s.begin < s.end && s.end <= numel, kInvalidArgument, "EngineOptions::attach_groups[",
               k, "]: the flat buffer's element range [", s.begin, ", ", s.end,
               ") is empty or outside its ", numel, " elements");
    for (std::size_t u = 0; u < tiles.size(); ++u) {
      const auto& [r, trainable] = tiles[u];
      const std::size_t lo = std::max(s.begin, r.begin), hi = std::min(s.end, r.end);
      if (!trainable || lo >= hi) continue;
      spans.push_back({static_cast<UnitId>(u), lo - r.begin, hi - r.begin, s.group});
    }
  }
  input.group_spans = std::move(spans);
}

std::unique_ptr<Engine> Engine::attach(Communicator& comm, const Config& config, void* params,
                                       void* grads, std::size_t numel, std::size_t capacity,
                                       DType dtype, EngineOptions options) {
  ZERO_CHECK(!detail::StagePolicy::of(config.zero_optimization.stage).shard_params, kConfig,
             "config key 'zero_optimization.stage' = ", config.zero_optimization.stage,
             ": attach mode runs stages 0-2; stage 3 needs the managed engine (the engine must "
             "own the parameters to shard them)");
  ZERO_CHECK(params != nullptr && grads != nullptr && numel > 0, kInvalidArgument,
             "attach: null buffer or zero parameters");
  auto impl = std::make_unique<Impl>(comm, config.resolve_batch(comm.size()), std::move(options),
                                     detail::Ownership::kAttached);
  ZERO_CHECK(dtype == impl->w, kConfig, "attach: the trainer's buffers are ", to_string(dtype),
             " but the config trains in ", to_string(impl->w),
             " (keys 'bf16.enabled' / 'fp16.enabled')");
  impl->trainer_params = static_cast<char*>(params);
  impl->trainer_grads = static_cast<char*>(grads);
  impl->trainer_capacity = capacity;
  impl->trainer_numel = numel;
  impl->attach_units(numel);
  auto e = std::unique_ptr<Engine>(new Engine(std::move(impl)));
  Impl& m = *e->impl_;
  m.lay_out();
  // Data-parallel start: every rank takes rank 0's parameters (as DDP and DeepSpeed do).
  comm.broadcast(m.trainer_params, m.trainer_params, m.place().layout.total_padded, m.w, 0);
  for (UnitId u = 0; u < static_cast<UnitId>(m.specs.size()); ++u) {
    if (!m.unit_place(u).frozen) m.optimizer->refresh_master(u, 0, m.unit_place(u).step_count);
  }
  return e;
}

}  // namespace zero
