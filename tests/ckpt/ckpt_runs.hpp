// The checkpoint tests' runs: the MLP of the engine tests trained on one global batch split
// over however many ranks train (so that a run resumed at another world size sees the same
// samples), one rank's engine of it (MlpEngine), the full training state gathered from every
// rank's shards, the run a checkpoint comes from, and the save-then-resume run against the
// uninterrupted one. Shared by the in-process and MPI tests.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "common/compare.hpp"
#include "common/mlp_model.hpp"
#include "common/mlp_training.hpp"
#include "common/temp_dir.hpp"
#include "zero/ckpt/ckpt.hpp"
#include "zero/comm/comm.hpp"
#include "zero/engine/engine.hpp"

namespace zero::testing {

// Every rank's value of a per-rank computation, by rank; on_ranks: rank 0's.
template <typename T, typename F>
std::vector<T> on_every_rank(int n, F&& f) {
  std::vector<T> out(static_cast<std::size_t>(n));
  ThreadGroup::run(n, [&](Communicator& c) { out[static_cast<std::size_t>(c.rank())] = f(c); });
  return out;
}
template <typename T, typename F>
T on_ranks(int n, F&& f) {
  return std::move(on_every_rank<T>(n, std::forward<F>(f))[0]);
}

constexpr int kGlobalRows = 12;  // divisible by 1, 2, 3 and 4 ranks

// Rank r's rows of the global batch of (step, micro).
inline Batch global_slice(const Mlp& mlp, int step, int micro, int rank, int ranks) {
  const Batch g = make_batch(mlp.in(), mlp.out(), kGlobalRows, static_cast<std::uint64_t>(step),
                             static_cast<std::uint64_t>(micro), 0);
  const int rows = kGlobalRows / ranks, r0 = rank * rows;
  Batch b;
  b.rows = rows;
  b.x.assign(g.x.begin() + r0 * mlp.in(), g.x.begin() + (r0 + rows) * mlp.in());
  b.t.assign(g.t.begin() + r0 * mlp.out(), g.t.begin() + (r0 + rows) * mlp.out());
  return b;
}

// Trains steps [from, to) (accumulation micro-steps each); returns rank-0-equal losses.
inline std::vector<float> train_steps(Engine& e, const Mlp& mlp, int from, int to,
                                      int accumulation) {
  std::vector<float> losses;
  for (int s = from; s < to; ++s) {
    for (int m = 0; m < accumulation; ++m) {
      losses.push_back(
          mlp.micro_step(e, global_slice(mlp, s, m, e.comm().rank(), e.comm().size())));
      e.step();
    }
  }
  return losses;
}

// One rank's engine of the MLP (`dims`, default kDims): declared, and initialised from `seed` — 42,
// the runs' (what a checkpoint saves); another, a fresh engine whose values a load or an import
// must replace; nullopt, declared only. It is the Engine, so everything that takes one takes it.
struct MlpEngine : Engine {
  const Mlp mlp;
  MlpEngine(Communicator& comm, const Config& config, std::optional<std::uint64_t> seed,
            const std::vector<int>& dims = kDims)
      : Engine(comm, config), mlp(dims) {
    mlp.declare(*this);
    if (seed) mlp.init(*this, *seed);
  }
  // Trains steps [from, to) as train_steps.
  std::vector<float> train(int from, int to, int accumulation = 1) {
    return train_steps(*this, mlp, from, to, accumulation);
  }
};

// The whole training state, per parameter (unpadded): the master and each optimizer state
// (f32 moments; with int8 moments the master alone: see global_moments), assembled from every
// rank's shards. Collective; every rank returns it.
struct FullState {
  Tensors master;
  std::vector<Tensors> states;
  std::int64_t steps = 0;
};

// int8 moments as the engine holds them, per unit and state: the records (each block's absmax
// and codes) of the whole padded unit, every rank's stepped range in rank order. Collective.
using GlobalMoments = std::vector<std::vector<std::vector<std::uint8_t>>>;  // [unit][k]
inline GlobalMoments global_moments(Engine& e) {
  const int ns = e.optimizer_params().num_states();
  const MomentDType t = e.optimizer_params().state_dtype();
  GlobalMoments out(static_cast<std::size_t>(e.num_units()));
  for (UnitId u = 0; u < e.num_units(); ++u) {
    const std::size_t bytes = state_bytes(t, e.unit_step_numel(u));
    for (int k = 0; k < ns; ++k) {
      std::vector<std::uint8_t> mine(bytes);
      e.copy_state_shard(u, k, mine.data());
      if (e.stage() == 0) {
        out[static_cast<std::size_t>(u)].push_back(std::move(mine));
        continue;
      }
      // Whole blocks of 260 bytes: the records gather as f32 words.
      std::vector<std::uint8_t> all(bytes * static_cast<std::size_t>(e.comm().size()));
      e.comm().all_gather(mine.data(), all.data(), bytes / 4, DType::kF32);
      out[static_cast<std::size_t>(u)].push_back(std::move(all));
    }
  }
  return out;
}

inline FullState full_state(Engine& e) {
  const int ns = e.optimizer_params().state_dtype() == MomentDType::kInt8
                     ? 0
                     : e.optimizer_params().num_states();
  const std::vector<ParamShard> shards = e.param_shards();
  // Flat offsets of each (unit, param) in one array of all parameters.
  std::vector<std::vector<std::size_t>> at(static_cast<std::size_t>(e.num_units()));
  std::size_t total = 0;
  for (UnitId u = 0; u < e.num_units(); ++u) {
    for (const ParamSpec& p : e.unit(u).params) {
      at[static_cast<std::size_t>(u)].push_back(total);
      total += p.numel();
    }
  }
  // This rank's pieces in a full-size array per quantity (+ which elements it holds), gathered.
  const std::size_t n = static_cast<std::size_t>(e.comm().size());
  std::vector<std::vector<float>> mine(static_cast<std::size_t>(1 + ns),
                                       std::vector<float>(total, 0.0f));
  std::vector<float> held(total, 0.0f);
  UnitId cached = -1;
  std::vector<std::vector<float>> unit(static_cast<std::size_t>(1 + ns));
  for (const ParamShard& s : shards) {
    if (s.unit != cached) {
      const std::size_t c = e.unit_step_numel(s.unit);
      for (auto& v : unit) v.resize(c);
      e.copy_master_shard(s.unit, unit[0].data());
      for (int k = 0; k < ns; ++k) e.copy_state_shard(s.unit, k, unit[1 + k].data());
      cached = s.unit;
    }
    const std::size_t base =
        at[static_cast<std::size_t>(s.unit)][static_cast<std::size_t>(s.param)];
    for (std::size_t q = 0; q < mine.size(); ++q) {
      std::memcpy(mine[q].data() + base + s.begin, unit[q].data() + s.shard_offset,
                  (s.end - s.begin) * 4);
    }
    for (std::size_t i = s.begin; i < s.end; ++i) held[base + i] = 1.0f;
  }
  std::vector<float> all_held(total * n);
  e.comm().all_gather(held.data(), all_held.data(), total, DType::kF32);
  std::vector<std::vector<float>> merged(mine.size(), std::vector<float>(total, 0.0f));
  std::vector<float> all(total * n);
  for (std::size_t q = 0; q < mine.size(); ++q) {
    e.comm().all_gather(mine[q].data(), all.data(), total, DType::kF32);
    for (std::size_t i = 0; i < total; ++i) {
      for (std::size_t r = 0; r < n; ++r) {
        if (all_held[r * total + i] != 0.0f) {
          merged[q][i] = all[r * total + i];
          break;
        }
      }
    }
  }
  FullState fs;
  fs.states.resize(static_cast<std::size_t>(ns));
  for (UnitId u = 0; u < e.num_units(); ++u) {
    for (std::size_t p = 0; p < e.unit(u).params.size(); ++p) {
      const std::size_t b = at[static_cast<std::size_t>(u)][p], c = e.unit(u).params[p].numel();
      fs.master.emplace_back(merged[0].begin() + static_cast<long>(b),
                             merged[0].begin() + static_cast<long>(b + c));
      for (int k = 0; k < ns; ++k) {
        fs.states[static_cast<std::size_t>(k)].emplace_back(
            merged[1 + k].begin() + static_cast<long>(b),
            merged[1 + k].begin() + static_cast<long>(b + c));
      }
    }
  }
  fs.steps = e.training_state().steps;
  return fs;
}

inline bool bitwise_equal(const FullState& a, const FullState& b) {
  if (!bitwise_equal(a.master, b.master) || a.states.size() != b.states.size()) return false;
  for (std::size_t k = 0; k < a.states.size(); ++k) {
    if (!bitwise_equal(a.states[k], b.states[k])) return false;
  }
  return a.steps == b.steps;
}

struct RankRun {
  Tensors params;  // working values as f32
  FullState state;
  std::vector<float> losses;
};

// One rank of the uninterrupted run: init, `steps` steps.
inline RankRun run_straight(Communicator& comm, const RunSpec& s, int steps) {
  MlpEngine e(comm, make_config(s), 42, s.dims);
  RankRun r;
  r.losses = e.train(0, steps, s.accumulation);
  r.params = read_params(e);
  r.state = full_state(e);
  return r;
}

// The run a checkpoint comes from, in s.ranks in-process ranks: init, `steps` steps, saved
// (synchronously, the Saver's defaults) into `dir` with `trainer` bytes; returns rank 0's losses
// and its full state and parameters at the save.
inline RankRun train_and_save(const RunSpec& s, int steps, const std::string& dir,
                              const std::string& trainer = {}) {
  return on_ranks<RankRun>(s.ranks, [&](Communicator& comm) {
    MlpEngine e(comm, make_config(s), 42, s.dims);
    RankRun r;
    r.losses = e.train(0, steps, s.accumulation);
    ckpt::Saver(e, {.dir = dir}).save(trainer);
    r.state = full_state(e);
    r.params = read_params(e);
    return r;
  });
}

// One rank of the first half: init, k steps, save (sync or async) with `trainer` bytes; returns
// the full state at the save.
inline FullState run_and_save(Communicator& comm, const RunSpec& s, int k, const std::string& dir,
                              bool async, const std::string& trainer = "data@k") {
  MlpEngine e(comm, make_config(s), 42, s.dims);
  e.train(0, k, s.accumulation);
  FullState at_save = full_state(e);
  ckpt::Saver saver(e, {.dir = dir, .keep = 2, .async = async});
  saver.save(trainer);
  // Training goes on while an asynchronous save writes: what it writes is the snapshot.
  e.train(k, k + 2, s.accumulation);
  saver.wait();
  return at_save;
}

// One rank of the second half: a fresh engine (initialised differently: the load must replace
// everything), load, check, train to `to`.
struct Resumed {
  FullState loaded;
  RankRun run;
  ckpt::LoadResult info;
};
inline Resumed run_resumed(Communicator& comm, const RunSpec& s, int to, const std::string& dir) {
  MlpEngine e(comm, make_config(s), 7, s.dims);
  Resumed r;
  r.info = ckpt::load(e, dir);
  r.loaded = full_state(e);
  r.run.losses = e.train(static_cast<int>(r.info.steps), to, s.accumulation);
  r.run.params = read_params(e);
  r.run.state = full_state(e);
  return r;
}

}  // namespace zero::testing
