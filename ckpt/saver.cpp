// The save: every rank writes its data file and fragment into the temporary directory (inline,
// or on a background thread from a host snapshot); rank 0 then commits (zero/ckpt/ckpt.hpp).
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <system_error>
#include <thread>
#include <utility>

#include "ckpt/agree.hpp"
#include "ckpt/manifest.hpp"
#include "ckpt/rank_file.hpp"
#include "zero/ckpt/ckpt.hpp"
#include "zero/core/error.hpp"
#include "zero/core/log.hpp"

namespace zero::ckpt {

namespace fs = std::filesystem;
using namespace detail;

namespace {

std::string step_name(std::int64_t steps) { return "step-" + std::to_string(steps); }
std::string fragment_name(int rank) { return "rank-" + std::to_string(rank) + ".json"; }
std::string error_name(int rank) { return "rank-" + std::to_string(rank) + ".error"; }

// Host copies of one unit's stepped master and optimizer states.
struct UnitData {
  std::vector<float> master;
  std::vector<std::vector<char>> states;
};

void copy_unit(Engine& e, UnitId u, UnitData& d) {
  const std::size_t n = e.unit_step_numel(u);
  const OptimizerParams& op = e.optimizer_params();
  d.master.resize(n);
  e.copy_master_shard(u, d.master.data());
  d.states.resize(static_cast<std::size_t>(op.num_states()));
  for (int k = 0; k < op.num_states(); ++k) {
    d.states[static_cast<std::size_t>(k)].resize(state_bytes(op.state_dtype(), n));
    e.copy_state_shard(u, k, d.states[static_cast<std::size_t>(k)].data());
  }
}

// Everything the write and the commit need, without the engine: they may run on a thread of
// their own.
struct Job {
  int rank = 0, world = 1, keep = 0;
  double timeout_s = 0.0;
  std::string root, tmp, name;
  RankLayout layout;
  std::size_t state_bytes = 0;  // per element
  std::function<const UnitData&(UnitId)> source;
  std::vector<UnitData> snapshot;  // async: the units' copies
  Manifest manifest;               // rank 0: the model, optimizer, counters, config
  std::string trainer;             // rank 0: the trainer's bytes

  void write_data() {
    if (layout.file.empty()) return;
    FileWriter w(tmp + "/" + layout.file);
    for (std::size_t i = 0; i < layout.shards.size(); ++i) {
      const ParamShard& s = layout.shards[i];
      const UnitData& d = source(s.unit);
      const std::size_t n = s.end - s.begin;
      w.write(d.master.data() + s.shard_offset, n * 4);
      if (!layout.unit_states.empty()) continue;  // int8: the states follow, by unit
      for (const auto& st : d.states)
        w.write(st.data() + s.shard_offset * state_bytes, n * state_bytes);
    }
    for (std::size_t u = 0; u < layout.unit_states.size(); ++u) {
      if (layout.unit_states[u].empty()) continue;
      for (const auto& st : source(static_cast<UnitId>(u)).states) w.write(st.data(), st.size());
    }
    data_digest = FileEntry{layout.file, w.finish()};
  }

  void write_fragment() {
    Fragment f;
    f.rank = rank;
    if (!layout.file.empty()) f.file = data_digest;
    f.pieces.resize(manifest_units);
    std::size_t i = 0;
    for (const ParamShard& s : layout.shards) {
      auto& unit = f.pieces[static_cast<std::size_t>(s.unit)];
      if (unit.size() <= static_cast<std::size_t>(s.param)) unit.resize(s.param + 1);
      unit[static_cast<std::size_t>(s.param)].push_back(layout.pieces[i++]);
    }
    f.unit_states = layout.unit_states;
    write_file_atomic(tmp, fragment_name(rank), f.to_json());
  }

  std::vector<Fragment> wait_for_fragments() {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    std::vector<Fragment> out(static_cast<std::size_t>(world));
    std::vector<bool> have(static_cast<std::size_t>(world), false);
    int missing = world;
    while (missing > 0) {
      for (int r = 0; r < world; ++r) {
        const auto rs = static_cast<std::size_t>(r);
        if (have[rs]) continue;
        const std::string err = tmp + "/" + error_name(r);
        if (fs::exists(err)) {
          ZERO_THROW(kIO, "checkpoint save '", name, "': rank ", r,
                     " failed writing its part: ", read_file(err, 1 << 16));
        }
        const std::string frag = tmp + "/" + fragment_name(r);
        if (fs::exists(frag)) {
          out[rs] = Fragment::parse(read_file(frag), frag);
          have[rs] = true;
          --missing;
        }
      }
      if (missing == 0) break;
      if (std::chrono::steady_clock::now() > deadline) {
        std::string who;
        for (int r = 0; r < world; ++r) {
          if (!have[static_cast<std::size_t>(r)])
            who += (who.empty() ? "" : ", ") + std::to_string(r);
        }
        ZERO_THROW(kTimeout, "checkpoint save '", name, "': rank(s) ", who,
                   " did not finish writing into '", tmp, "' within ", timeout_s, " s");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return out;
  }

  void commit() {
    const std::vector<Fragment> frags = wait_for_fragments();
    Manifest m = manifest;
    for (const Fragment& f : frags) {
      if (f.file.has_value()) m.files.push_back(*f.file);
      for (std::size_t u = 0; u < f.pieces.size() && u < m.units.size(); ++u) {
        for (std::size_t p = 0; p < f.pieces[u].size() && p < m.units[u].params.size(); ++p) {
          auto& dst = m.units[u].params[p].pieces;
          dst.insert(dst.end(), f.pieces[u][p].begin(), f.pieces[u][p].end());
        }
      }
      for (std::size_t u = 0; u < f.unit_states.size() && u < m.units.size(); ++u) {
        auto& dst = m.units[u].states;
        dst.insert(dst.end(), f.unit_states[u].begin(), f.unit_states[u].end());
      }
    }
    const auto by_begin = [](const Piece& a, const Piece& b) { return a.begin < b.begin; };
    for (UnitEntry& u : m.units) {
      for (ParamEntry& p : u.params) std::sort(p.pieces.begin(), p.pieces.end(), by_begin);
      std::sort(u.states.begin(), u.states.end(), by_begin);
    }
    {
      FileWriter w(tmp + "/" + kTrainerFile);
      w.write(trainer.data(), trainer.size());
      m.files.push_back({kTrainerFile, w.finish()});
    }
    const std::string text = m.to_json();
    {
      FileWriter w(tmp + "/" + kManifest);
      w.write(text.data(), text.size());
      w.finish();
    }
    {
      const std::string sum = to_hex(xxh3(text.data(), text.size())) + "\n";
      FileWriter w(tmp + "/" + kManifestSum);
      w.write(sum.data(), sum.size());
      w.finish();
    }
    for (int r = 0; r < world; ++r) fs::remove(tmp + "/" + fragment_name(r));
    fsync_dir(tmp);
    // Replace a checkpoint of the same step (saved again after a resume) only once the new one
    // is complete.
    const std::string final_dir = root + "/" + name, old = root + "/.old-" + name;
    std::error_code ec;
    fs::remove_all(old, ec);
    if (fs::exists(final_dir)) fs::rename(final_dir, old);
    fs::rename(tmp, final_dir);
    fsync_dir(root);
    write_file_atomic(root, kLatest, name + "\n");
    fs::remove_all(old, ec);
    prune();
  }

  // Removes committed checkpoints beyond the newest `keep` (never the one `latest` names).
  void prune() {
    if (keep <= 0) return;
    std::vector<std::pair<std::int64_t, fs::path>> found;
    for (const auto& entry : fs::directory_iterator(root)) {
      const std::string n = entry.path().filename().string();
      if (!entry.is_directory() || n.rfind("step-", 0) != 0) continue;
      try {
        std::size_t used = 0;
        const std::int64_t s = std::stoll(n.substr(5), &used);
        if (used == n.size() - 5) found.emplace_back(s, entry.path());
      } catch (const std::exception&) {
      }
    }
    std::sort(found.begin(), found.end());
    const std::size_t k = static_cast<std::size_t>(keep);
    for (std::size_t i = 0; i + k < found.size(); ++i) {
      if (found[i].second.filename() == name) continue;
      std::error_code ec;
      fs::remove_all(found[i].second, ec);
      if (ec)
        ZERO_LOG(kWarn, "checkpoint: could not remove ", found[i].second.string(), ": ",
                 ec.message());
    }
  }

  // This rank's whole part: data, fragment, and on rank 0 the commit. On failure a non-zero rank
  // leaves an error file so that rank 0 stops waiting.
  void run() {
    try {
      write_data();
      write_fragment();
    } catch (const std::exception& e) {
      if (rank != 0) {
        try {
          write_file_atomic(tmp, error_name(rank), e.what());
        } catch (const std::exception&) {
        }
      }
      throw;
    }
    if (rank == 0) commit();
  }

  FileEntry data_digest;
  std::size_t manifest_units = 0;
};

// The job of this rank's part of the checkpoint of the engine's current step.
std::unique_ptr<Job> new_job(Engine& e, const SaveOptions& o) {
  Communicator& comm = e.comm();
  auto job = std::make_unique<Job>();
  job->rank = comm.rank();
  job->world = comm.size();
  job->keep = o.keep;
  job->timeout_s = o.commit_timeout_s > 0 ? o.commit_timeout_s : comm.timeout_s();
  job->root = o.dir;
  job->name = step_name(e.training_state().steps);
  job->tmp = job->root + "/.tmp-" + job->name;
  return job;
}

// Local: what the job writes and, on rank 0, the manifest and the temporary directory (clearing
// what a killed save left). Returns the failure to agree on (null: none).
std::exception_ptr prepare(Job& job, Engine& e, std::string_view trainer_state,
                           const std::string& dir) {
  try {
    job.layout = rank_layout(e);
    job.state_bytes = state_bytes(e.optimizer_params().state_dtype(), 1);
    job.manifest_units = static_cast<std::size_t>(e.num_units());
    if (job.rank == 0) {
      job.manifest = manifest_of(e);
      job.trainer.assign(trainer_state.data(), trainer_state.size());
      fs::create_directories(job.root);
      for (const auto& entry : fs::directory_iterator(job.root)) {
        const std::string n = entry.path().filename().string();
        if (n.rfind(".tmp-step-", 0) == 0) fs::remove_all(entry.path());
      }
      fs::create_directory(job.tmp);
    }
  } catch (const fs::filesystem_error& fe) {
    return std::make_exception_ptr(
        Error(ErrorCode::kIO, std::string("checkpoint save into '") + dir + "': " + fe.what()));
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

// Synchronous: the job run unit by unit through one host buffer, from whichever tier holds the
// state. Returns the failure to agree on (null: none).
std::exception_ptr write_now(Job& job, Engine& e) {
  UnitData buffer;
  UnitId cached = -1;
  job.source = [&](UnitId u) -> const UnitData& {
    if (u != cached) {
      copy_unit(e, u, buffer);
      cached = u;
    }
    return buffer;
  };
  try {
    job.run();
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

}  // namespace

struct Saver::Impl {
  Engine& engine;
  SaveOptions options;
  std::thread worker;
  std::exception_ptr error;
  std::unique_ptr<Job> job;

  Impl(Engine& e, SaveOptions o) : engine(e), options(std::move(o)) {}

  void join() {
    if (worker.joinable()) worker.join();
    job.reset();
  }

  // Asynchronous: every unit this rank writes copied to host memory now (the snapshot), then
  // written from it on the worker thread; its failure is kept for the next wait.
  void start(std::unique_ptr<Job> next) {
    next->snapshot.resize(static_cast<std::size_t>(engine.num_units()));
    if (!next->layout.file.empty()) {
      for (UnitId u = 0; u < engine.num_units(); ++u)
        copy_unit(engine, u, next->snapshot[static_cast<std::size_t>(u)]);
    }
    Job* j = next.get();
    j->source = [j](UnitId u) -> const UnitData& {
      return j->snapshot[static_cast<std::size_t>(u)];
    };
    job = std::move(next);
    try {
      worker = std::thread([this, j] {
        try {
          j->run();
        } catch (...) {
          error = std::current_exception();
        }
      });
    } catch (const std::system_error& err) {  // the kernel refused a thread
      job.reset();
      ZERO_THROW(kOutOfMemory, "checkpoint save to '", options.dir,
                 "': cannot start the asynchronous writer thread (", err.what(), ")");
    }
  }
};

Saver::Saver(Engine& engine, SaveOptions options)
    : impl_(std::make_unique<Impl>(engine, std::move(options))) {
  ZERO_CHECK(!impl_->options.dir.empty(), kInvalidArgument, "checkpoint save: no directory");
  ZERO_CHECK(impl_->options.keep >= 0, kInvalidArgument,
             "checkpoint save: keep = ", impl_->options.keep, " (must be >= 0; 0 keeps all)");
}

// Local: a destructor may run on one rank only (unwinding an error), so it must not wait for
// the others.
Saver::~Saver() {
  impl_->join();
  if (impl_->error) {
    try {
      std::rethrow_exception(impl_->error);
    } catch (const std::exception& e) {
      ZERO_LOG(kError, "checkpoint save in flight failed: ", e.what());
    }
  }
}

void Saver::wait() {
  impl_->join();
  agree(impl_->engine.world(), std::exchange(impl_->error, nullptr));
}

SaveInfo Saver::save(std::string_view trainer_state) {
  Impl& s = *impl_;
  Engine& e = s.engine;
  const auto t0 = std::chrono::steady_clock::now();
  ZERO_CHECK(e.micro_step() == 0, kInvalidArgument, "checkpoint save: the engine is ",
             e.micro_step(),
             " micro-step(s) into an accumulation window; save after the step() "
             "that ends it (StepResult::boundary)");
  wait();  // the previous asynchronous save, committed on every rank
  SaveInfo info;
  info.path = s.options.dir + "/" + step_name(e.training_state().steps);
  info.steps = e.training_state().steps;
  // Hybrid sharding: every group holds the same shards under the same group ranks; the first
  // group writes them (a checkpoint of a world of its size), the others take part in each
  // agreement over the world, so a failed write fails every rank.
  if (e.replicas() != nullptr && e.replicas()->rank() != 0) {
    agree(e.world(), nullptr);                        // the directory made
    if (!s.options.async) agree(e.world(), nullptr);  // the files written and committed
    return info;
  }
  std::unique_ptr<Job> job = new_job(e, s.options);
  // Rank 0 makes the temporary directory; all wait for it.
  agree(e.world(), prepare(*job, e, trainer_state, s.options.dir));
  info.bytes = job->layout.bytes;
  if (s.options.async) {
    s.start(std::move(job));
    info.snapshot_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return info;
  }
  agree(e.world(), write_now(*job, e));
  return info;
}

}  // namespace zero::ckpt
