// zero/ckpt/ckpt.hpp — training-state checkpoints: sharded, atomic, checksummed, loadable at
// another world size (or weights only, into any optimizer), exported as safetensors; pretrained
// weights imported from safetensors.
//
// A checkpoint is a directory `step-<steps>` under a root directory:
//   manifest.json        every parameter's name, shape, dtype and global element ranges (which
//                        file, which byte offsets hold the master and each optimizer state),
//                        the world size, stage, alignment, optimizer and hyper-parameters, the
//                        training counters and loss scaler, the config, and the size and XXH3-64
//                        checksum of every other file
//   manifest.json.xxh3   the manifest's own checksum
//   rank-<r>.bin         what rank r steps: for each parameter range it owns, the fp32 master
//                        then each optimizer state (stage 0: rank 0 alone, every rank steps the
//                        same whole units)
//   trainer.bin          the trainer's opaque bytes (its data position), rank 0's
// and `latest` (a file holding the name of the newest committed checkpoint) in the root.
//
// Atomic: every rank writes and fsyncs its files in `.tmp-step-<steps>`, then a fragment
// (rank-<r>.json: its ranges, size and checksum); rank 0 waits for every fragment, writes the
// manifest, fsyncs, renames the directory to `step-<steps>`, fsyncs the root, replaces `latest`
// (write, fsync, rename, fsync) last and removes checkpoints beyond the last `keep`. A save
// killed at any instant leaves the previous checkpoint and `latest` as they were.
//
// Hybrid sharding: the ranks of the first group write (the checkpoint is one of a world of the
// group's size); every group loads it; each agreement on success spans Engine::world().
//
// The 16-bit working copy is not saved: it is the master rounded to the working dtype (every
// step and set_param leave it so), and load regenerates it; resuming is bitwise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zero/engine/engine.hpp"

namespace zero::ckpt {

struct SaveOptions {
  std::string dir;     // the root: checkpoints are step-<steps> under it (created if missing)
  int keep = 0;        // keep the newest `keep` checkpoints (0: all)
  bool async = false;  // save(): snapshot to host memory, write and commit on a background thread
  // Seconds rank 0 waits for the other ranks' files before giving the save up (0: the
  // communicator's timeout).
  double commit_timeout_s = 0.0;
};

// What a save wrote (a synchronous save: committed; asynchronous: being written).
struct SaveInfo {
  std::string path;  // <dir>/step-<steps>
  std::int64_t steps = 0;
  std::size_t bytes = 0;    // this rank's bytes (data files)
  double snapshot_s = 0.0;  // async: the time save() took (the step's stall)
};

// Saves one engine (one rank). Collective: every rank of the engine's communicator constructs
// one and calls save() at the same steps, at an accumulation boundary.
class Saver {
 public:
  Saver(Engine& engine, SaveOptions options);
  ~Saver();  // joins this rank's writer (its error is logged); local, unlike wait()
  Saver(const Saver&) = delete;
  Saver& operator=(const Saver&) = delete;

  // Saves the engine's training state and `trainer_state` (opaque bytes; rank 0's are kept).
  // Synchronous: returns when the checkpoint is committed on every rank (an error on any rank
  // throws on every rank). Asynchronous: waits for the previous save (as wait()), copies the
  // shards to host memory and returns; the next save() or wait() reports the background
  // write's error. REQUIRES: engine.micro_step() == 0 (kInvalidArgument otherwise).
  SaveInfo save(std::string_view trainer_state = {});
  // Collective: waits until the asynchronous save in flight is committed (rank 0 commits once
  // every rank has written); an error on any rank throws on every rank.
  void wait();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Resolves a checkpoint path: a checkpoint directory (holding manifest.json) or a root holding
// `latest`. Throws kIO naming the path when it is neither.
std::string resolve(const std::string& path);

struct LoadResult {
  std::string path;           // the checkpoint directory loaded
  std::int64_t steps = 0;     // the engine's step counter after the load
  std::string trainer_state;  // the bytes the trainer saved
  int saved_world_size = 0;
  int saved_stage = 0;
};

struct LoadOptions {
  // Weights only: the parameters and their fp32 masters from the checkpoint; the optimizer state
  // fresh (zero, as a new engine's), the step counters 0, the loss scaler as configured, no
  // trainer state returned. Any optimizer (a pretraining checkpoint starts a fine-tuning run
  // with another), any stage and world size; the model (names and shapes) must match.
  bool weights_only = false;
};

// Loads a checkpoint into a fresh engine (any world size and stage; same model and optimizer,
// or any optimizer with weights_only). Collective. Before any engine state is touched every
// rank checks the manifest against the engine (the first parameter whose name or shape
// differs, the optimizer: errors naming both) and the size and checksum of every file it reads;
// all ranks then agree, and only then write. Errors (kIO / kConfig / kInvalidArgument) name the
// file or key; the engine is then untouched.
LoadResult load(Engine& engine, const std::string& path, const LoadOptions& options = {});

// ---- pretrained weights in (safetensors)

// How engine parameters find their tensors. An engine parameter is named "<unit>.<param>" (the
// names consolidate writes); its tensor's name is, in this order of precedence:
//   rename(name)            when `rename` is set (an empty result: the parameter is not
//                           imported and keeps its value — e.g. new adapters);
//   the first prefix rule   {from, to} whose `from` starts the name, replaced by `to`
//                           (e.g. {"layer", "model.layers."});
//   the name itself         (identity) otherwise.
// Every tensor of the file(s) must be some parameter's, unless allow_unused.
struct ImportOptions {
  std::function<std::string(const std::string& name)> rename;
  std::vector<std::pair<std::string, std::string>> rename_prefixes;
  bool allow_unused = false;
};

struct ImportResult {
  std::size_t imported = 0;    // parameters set from the file(s)
  std::size_t unused = 0;      // tensors of the file(s) no parameter took (allow_unused)
  std::size_t bytes_read = 0;  // this rank's tensor bytes read
};

// Sets the engine's parameters from safetensors: `path` a .safetensors file, a Hugging Face
// sharded set's index (model.safetensors.index.json, whose "weight_map" names each tensor's file)
// or a directory holding either. F32, BF16 and F16 on disk. Collective; REQUIRES a fresh engine
// (no step, nothing gathered), any stage, world size and working dtype. Each rank reads only the
// byte ranges of the elements it steps (its shards; stage 0: the whole units) with positioned
// reads, one unit at a time: besides the engine, a rank holds one unit's stepped range in f32
// and a 256 KiB read buffer, never a whole file.
// Values: the file's value converted exactly to f32 becomes the master; the working copy is the
// master rounded to the working dtype (round to nearest, ties to even; overflow to +-Inf: e.g.
// an F32 or BF16 file into an f16 run). The optimizer state starts fresh (zero), steps at 0.
// Before any engine state is touched every rank checks every parameter against the file(s) and
// all agree; errors name the tensor: missing (kConfig), shape mismatch with both shapes
// (kConfig), a dtype other than F32 / BF16 / F16 (kConfig), a tensor no parameter uses
// (kConfig, unless allow_unused), a truncated file or header out of range (kCorruption), a bad
// index (kCorruption naming the index). An I/O error while reading leaves the engine partly
// loaded (every rank throws it).
ImportResult import_safetensors(Engine& engine, const std::string& path,
                                const ImportOptions& options = {});

// ---- offline (zero-ckpt)

// Verifies every file's size and checksum; returns the manifest's summary lines (also printed
// by `zero-ckpt inspect`). Throws kIO naming the first bad file.
std::vector<std::string> inspect(const std::string& path);

// Writes the full parameters (the fp32 masters, or rounded to bf16) as one safetensors file,
// parameter by parameter: peak memory near the largest parameter. `dtype`: kF32 or kBF16.
// Names are "<unit>.<param>". Returns the bytes written.
std::size_t consolidate(const std::string& path, const std::string& out, DType dtype);

// Rewrites a checkpoint for `world_size` ranks (same stage) into `out` (a root: out/step-<n>
// and out/latest), loading it into that many in-process engines and saving them.
std::string reshard(const std::string& path, int world_size, const std::string& out);

// Converts safetensors (as import_safetensors reads them) into a checkpoint at step 0 with fresh
// optimizer state, for the model and config of the checkpoint `like` (any checkpoint of the
// target model: its units, parameter names and shapes, alignment, stage, dtypes, optimizer), as
// `world_size` ranks (0: like's) would save it, into the root `out`. A run then starts from it
// with load() (same optimizer) or load(..., {.weights_only = true}) (any). Returns the
// checkpoint's directory.
std::string import_checkpoint(const std::string& safetensors, const std::string& like,
                              int world_size, const std::string& out,
                              const ImportOptions& options = {});

}  // namespace zero::ckpt
