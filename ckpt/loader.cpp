// The load (verify everything this rank reads, agree, then write the engine) and inspect.
#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <set>

#include "ckpt/agree.hpp"
#include "ckpt/fresh_state.hpp"
#include "ckpt/manifest.hpp"
#include "zero/ckpt/ckpt.hpp"
#include "zero/core/error.hpp"
#include "zero/core/log.hpp"

namespace zero::ckpt {

namespace fs = std::filesystem;
using namespace detail;

std::string resolve(const std::string& path) {
  if (fs::exists(path + "/" + kManifest)) return path;
  const std::string latest = path + "/" + kLatest;
  ZERO_CHECK(fs::exists(latest), kIO, "checkpoint '", path, "': neither a checkpoint (no ",
             kManifest, ") nor a checkpoint root (no '", kLatest, "' file)");
  std::string name = read_file(latest, 4096);
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  ZERO_CHECK(!name.empty() && name.find('/') == std::string::npos && name != "..", kCorruption,
             "checkpoint root '", path, "': '", latest, "' does not name a checkpoint");
  const std::string dir = path + "/" + name;
  ZERO_CHECK(fs::exists(dir + "/" + kManifest), kIO, "checkpoint root '", path, "': '", latest,
             "' names '", name, "', which has no ", kManifest);
  return dir;
}

namespace {

// The pieces overlapping [lo, hi) (one parameter's, or a unit's int8 state pieces).
template <typename Fn>
void for_overlap(const std::vector<Piece>& pieces, std::size_t lo, std::size_t hi, Fn&& fn) {
  for (const Piece& pc : pieces) {
    const std::size_t a = std::max(lo, pc.begin), b = std::min(hi, pc.end);
    if (a < b) fn(pc, a, b);
  }
}
template <typename Fn>
void for_overlap(const ParamEntry& p, std::size_t lo, std::size_t hi, Fn&& fn) {
  for_overlap(p.pieces, lo, hi, fn);
}

// What the load reads, opened and checked on this rank before any rank writes.
struct Source {
  std::string dir;
  Manifest m;
  std::vector<ParamShard> shards;  // this rank's parameter ranges, in unit order
};

// Every file this rank reads: its parameters' pieces and, with the optimizer, the trainer's file
// and the int8 state pieces of its stepped ranges.
std::set<std::string> files_needed(const Source& src, Engine& e, bool weights_only) {
  const Manifest& m = src.m;
  std::set<std::string> need;
  if (!weights_only) need.insert(kTrainerFile);
  for (const ParamShard& s : src.shards) {
    const ParamEntry& p =
        m.units[static_cast<std::size_t>(s.unit)].params[static_cast<std::size_t>(s.param)];
    for_overlap(p, s.begin, s.end,
                [&](const Piece& pc, std::size_t, std::size_t) { need.insert(pc.file); });
  }
  if (!weights_only) {
    for (UnitId u = 0; u < e.num_units(); ++u) {
      const std::size_t b = e.unit_step_begin(u);
      for_overlap(m.units[static_cast<std::size_t>(u)].states, b, b + e.unit_step_numel(u),
                  [&](const Piece& pc, std::size_t, std::size_t) { need.insert(pc.file); });
    }
  }
  return need;
}

// The checkpoint at `path` read into `src` and fitted to the engine, every file this rank reads
// checked whole. Throws what it finds (the caller agrees on it with the other ranks).
void open_source(Source& src, Engine& e, const std::string& path, bool weights_only) {
  src.dir = resolve(path);
  src.m = read_manifest(src.dir);
  const std::string diff = model_mismatch(src.m, e, /*optimizer=*/!weights_only);
  ZERO_CHECK(diff.empty(), kConfig, "checkpoint '", src.dir, "' does not fit this engine: ", diff);
  src.shards = e.param_shards();
  for (const std::string& f : files_needed(src, e, weights_only)) {
    const FileEntry* fe = src.m.file(f);
    ZERO_CHECK(fe != nullptr, kCorruption, "checkpoint '", src.dir, "': '", f,
               "' is used but the manifest has no size and checksum for it");
    verify_file(src.dir + "/" + f, fe->digest);
  }
}

// Rank 0 says what differs from the save: the stage or world size, and the optimizer's
// hyper-parameters (the state carries over; the hyper-parameters are the new config's, as a
// resumed DeepSpeed run's config decides its schedule).
void log_changes(const Source& src, Engine& e, bool weights_only) {
  Communicator& comm = e.comm();
  const Manifest& m = src.m;
  if (m.stage != e.stage() || m.world_size != comm.size()) {
    if (comm.rank() == 0) {
      ZERO_LOG(kInfo, "checkpoint '", src.dir, "': saved at stage ", m.stage, " on ", m.world_size,
               " ranks; loading at stage ", e.stage(), " on ", comm.size());
    }
  }
  const OptimizerParams& op = e.optimizer_params();
  if (comm.rank() == 0 && !weights_only &&
      (m.hyper.lr != op.lr || m.hyper.beta1 != op.beta1 || m.hyper.beta2 != op.beta2 ||
       m.hyper.eps != op.eps || m.hyper.weight_decay != op.weight_decay)) {
    ZERO_LOG(kWarn, "checkpoint '", src.dir, "': the optimizer's hyper-parameters changed (lr ",
             m.hyper.lr, " -> ", op.lr, ", betas (", m.hyper.beta1, ", ", m.hyper.beta2, ") -> (",
             op.beta1, ", ", op.beta2, "), eps ", m.hyper.eps, " -> ", op.eps, ", weight_decay ",
             m.hyper.weight_decay, " -> ", op.weight_decay, "): the config's apply from here");
  }
}

// Reads one unit's stepped range at a time out of the checkpoint's files, each file opened once.
// int8 moments are read by unit range (UnitEntry::states) as they were saved: the blocks are the
// same at any world size (units are padded to N x the block, so a shard starts on a block at
// every N), and any overlap of a saved range with this rank's is whole blocks.
class RangeReader {
 public:
  RangeReader(const Source& src, MomentDType st)
      : src_(src),
        st_(st),
        by_unit_(st == MomentDType::kInt8),
        sd_(by_unit_ ? 0 : state_bytes(st, 1)) {}

  // The master of unit u's parameter ranges src.shards[next..] into `master` and (unless int8)
  // the states into `states`, at the ranges' offsets in the stepped range; `next` moves past
  // unit u's ranges.
  void params(UnitId u, std::size_t& next, std::vector<float>& master,
              std::vector<std::vector<char>>& states) {
    const std::vector<ParamShard>& shards = src_.shards;
    for (; next < shards.size() && shards[next].unit == u; ++next) {
      const ParamShard& s = shards[next];
      const ParamEntry& p =
          src_.m.units[static_cast<std::size_t>(u)].params[static_cast<std::size_t>(s.param)];
      for_overlap(p, s.begin, s.end, [&](const Piece& pc, std::size_t a, std::size_t b) {
        const FileReader& r = reader(pc.file);
        const std::size_t at = s.shard_offset + (a - s.begin);
        r.read(pc.master_offset + (a - pc.begin) * 4, master.data() + at, (b - a) * 4);
        if (by_unit_) return;
        for (std::size_t k = 0; k < states.size(); ++k) {
          r.read(pc.state_offsets[k] + (a - pc.begin) * sd_, states[k].data() + at * sd_,
                 (b - a) * sd_);
        }
      });
    }
  }

  // int8 moments: the states of unit u's stepped range [begin, begin + n) into `states`.
  void unit_states(UnitId u, std::size_t begin, std::size_t n,
                   std::vector<std::vector<char>>& states) {
    if (!by_unit_ || states.empty()) return;
    const UnitEntry& unit = src_.m.units[static_cast<std::size_t>(u)];
    for_overlap(unit.states, begin, begin + n, [&](const Piece& pc, std::size_t a, std::size_t b) {
      ZERO_CHECK(
          a % kInt8MomentBlock == 0 && (b % kInt8MomentBlock == 0 || b == begin + n || b == pc.end),
          kCorruption, "checkpoint '", src_.dir, "': unit ", unit.name, ": a saved state range [",
          pc.begin, ", ", pc.end, ") meets this rank's [", begin, ", ", begin + n,
          ") inside a quantization block");
      const FileReader& r = reader(pc.file);
      for (std::size_t k = 0; k < states.size(); ++k) {
        r.read(pc.state_offsets[k] + state_bytes(st_, a - pc.begin),
               states[k].data() + state_bytes(st_, a - begin), state_bytes(st_, b - a));
      }
    });
  }

 private:
  const FileReader& reader(const std::string& f) {
    auto& r = readers_[f];
    if (!r) r = std::make_unique<FileReader>(src_.dir + "/" + f);
    return *r;
  }

  const Source& src_;
  const MomentDType st_;
  const bool by_unit_;
  const std::size_t sd_;  // state bytes per element (not int8)
  std::map<std::string, std::unique_ptr<FileReader>> readers_;
};

// Every unit's stepped range read and written into the engine (weights only: the masters into
// `fresh`, the state a new engine's).
void read_units(const Source& src, Engine& e, FreshStateLoader* fresh) {
  const OptimizerParams& op = e.optimizer_params();
  const MomentDType st = op.state_dtype();
  RangeReader ranges(src, st);
  std::vector<float> master;
  std::vector<std::vector<char>> states(
      fresh != nullptr ? 0 : static_cast<std::size_t>(op.num_states()));
  std::size_t next = 0;
  for (UnitId u = 0; u < e.num_units(); ++u) {
    const std::size_t n = e.unit_step_numel(u);
    master.assign(n, 0.0f);  // the padding is zero, as the engine keeps it
    for (auto& s : states) s.assign(state_bytes(st, n), 0);
    ranges.params(u, next, master, states);
    if (st == MomentDType::kInt8 && !states.empty()) {
      ranges.unit_states(u, e.unit_step_begin(u), n, states);
    }
    std::vector<const void*> sp;
    for (auto& s : states) sp.push_back(s.data());
    if (fresh != nullptr) {
      fresh->load(u, master.data());
    } else {
      e.load_shard(u, master.data(), sp.data());
    }
  }
}

}  // namespace

LoadResult load(Engine& e, const std::string& path, const LoadOptions& options) {
  const bool weights_only = options.weights_only;
  // Hybrid sharding: every group loads the same shards (resharded to its size) from the same
  // files; the agreements span the world, so one rank's failure fails every rank.
  Source src;
  std::exception_ptr local;
  try {
    open_source(src, e, path, weights_only);
  } catch (...) {
    local = std::current_exception();
  }
  agree(e.world(), local);
  log_changes(src, e, weights_only);
  // Weights only: the masters alone are read; the state is a new engine's (fresh_state.hpp).
  std::unique_ptr<FreshStateLoader> fresh;
  if (weights_only) fresh = std::make_unique<FreshStateLoader>(e);
  read_units(src, e, fresh.get());
  // The loss scaler carries over between fp16 runs; otherwise the new run's config decides.
  const Manifest& m = src.m;
  LoadResult res;
  if (fresh) {
    fresh->finish();
  } else {
    std::optional<LossScaler::State> scaler;
    if (m.fp16 && e.config().fp16.enabled) scaler = m.loss_scaler;
    e.finish_load(m.steps, m.skipped, scaler);
    res.steps = m.steps;
    res.trainer_state = read_file(src.dir + "/" + kTrainerFile);
  }
  res.path = src.dir;
  res.saved_world_size = m.world_size;
  res.saved_stage = m.stage;
  return res;
}

std::vector<std::string> inspect(const std::string& path) {
  const std::string dir = resolve(path);
  const Manifest m = read_manifest(dir);
  std::vector<std::string> out;
  std::size_t params = 0, tensors = 0;
  for (const UnitEntry& u : m.units) {
    for (const ParamEntry& p : u.params) {
      params += p.numel;
      ++tensors;
    }
  }
  out.push_back("checkpoint " + dir);
  out.push_back("  steps " + std::to_string(m.steps) + " (skipped " + std::to_string(m.skipped) +
                "), saved by " + std::to_string(m.world_size) + " ranks at stage " +
                std::to_string(m.stage) + ", " + m.param_dtype + " training");
  out.push_back("  model: " + std::to_string(m.units.size()) + " units, " +
                std::to_string(tensors) + " parameters, " + std::to_string(params) + " elements");
  out.push_back("  optimizer " + m.optimizer + ": " + std::to_string(m.num_states) + " states of " +
                m.state_dtype + ", lr " + std::to_string(m.hyper.lr));
  std::size_t total = 0;
  for (const FileEntry& f : m.files) {
    verify_file(dir + "/" + f.name, f.digest);
    total += f.digest.size;
    out.push_back("  " + f.name + "  " + std::to_string(f.digest.size) + " bytes  xxh3_64 " +
                  to_hex(f.digest.xxh3) + "  ok");
  }
  out.push_back("  " + std::to_string(m.files.size()) + " files, " + std::to_string(total) +
                " bytes, every checksum verified");
  return out;
}

}  // namespace zero::ckpt
