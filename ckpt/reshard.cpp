// Offline: a checkpoint rewritten for another world size (reshard): loaded into an engine per
// new rank (in-process ranks) and saved again.
#include <mutex>
#include <string>
#include <vector>

#include "ckpt/manifest.hpp"
#include "zero/ckpt.hpp"
#include "zero/error.hpp"

namespace zero::ckpt {

using namespace detail;

std::string reshard(const std::string& path, int world_size, const std::string& out) {
  ZERO_CHECK(world_size >= 1, kInvalidArgument, "reshard: --world-size ", world_size,
             " (must be >= 1)");
  const std::string dir = resolve(path);
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
    const LoadResult r = load(e, dir);
    Saver saver(e, {.dir = out});
    const SaveInfo info = saver.save(r.trainer_state);
    std::lock_guard<std::mutex> lock(mu);
    written = info.path;
  });
  return written;
}

}  // namespace zero::ckpt
