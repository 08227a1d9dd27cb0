// Offline: a checkpoint rewritten for another world size (reshard), and safetensors converted
// into a step-0 checkpoint (import_checkpoint): the model and config of a checkpoint, built as
// in-process engines, filled, and saved again.
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "ckpt/manifest.hpp"
#include "zero/ckpt/ckpt.hpp"
#include "zero/core/error.hpp"

namespace zero::ckpt {

using namespace detail;

namespace {

// Builds the checkpoint `dir`'s model and config as `world_size` in-process engines, fills each
// with `fill` (returning the trainer bytes to save) and saves them into the root `out`.
std::string rewrite(const std::string& dir, int world_size, const std::string& out,
                    const std::function<std::string(Engine&)>& fill) {
  const Manifest m = read_manifest(dir);
  Config cfg = parse_config(m.config_json);
  // The rewrite runs in host memory: the offload tiers of the run that saved do not matter.
  cfg.zero_optimization.offload_optimizer.device = OffloadDevice::kNone;
  cfg.zero_optimization.offload_param.device = OffloadDevice::kNone;
  // The saving run's train_batch_size held for its world size; the rewrite keeps the per-rank
  // micro batch and accumulation and leaves the global batch for the resuming run to state.
  cfg.train_batch_size = 0;
  std::vector<UnitSpec> units;
  for (const UnitEntry& u : m.units) {
    UnitSpec s;
    s.name = u.name;
    for (const ParamEntry& p : u.params) s.params.push_back({p.name, p.shape});
    units.push_back(std::move(s));
  }
  std::string written;
  std::mutex mu;
  ThreadGroup::run(world_size, [&](Communicator& comm) {
    EngineOptions eo;
    eo.alignment = m.alignment;
    Engine e(comm, cfg, eo);
    for (const UnitSpec& s : units) e.add_unit(s);
    const std::string trainer_state = fill(e);
    Saver saver(e, {.dir = out});
    const SaveInfo info = saver.save(trainer_state);
    std::lock_guard<std::mutex> lock(mu);
    written = info.path;
  });
  return written;
}

}  // namespace

std::string reshard(const std::string& path, int world_size, const std::string& out) {
  ZERO_CHECK(world_size >= 1, kInvalidArgument, "reshard: --world-size ", world_size,
             " (must be >= 1)");
  const std::string dir = resolve(path);
  return rewrite(dir, world_size, out, [&](Engine& e) { return load(e, dir).trainer_state; });
}

std::string import_checkpoint(const std::string& safetensors, const std::string& like,
                              int world_size, const std::string& out,
                              const ImportOptions& options) {
  ZERO_CHECK(world_size >= 0, kInvalidArgument, "import: --world-size ", world_size,
             " (must be >= 1; 0: the --like checkpoint's)");
  const std::string dir = resolve(like);
  const int n = world_size > 0 ? world_size : read_manifest(dir).world_size;
  return rewrite(dir, n, out, [&](Engine& e) {
    import_safetensors(e, safetensors, options);
    return std::string();
  });
}

}  // namespace zero::ckpt
