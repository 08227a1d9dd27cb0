// ckpt/manifest.hpp — the checkpoint's manifest (manifest.json): what was saved, where each
// parameter's global element ranges live, and every file's size and checksum. Parsed with
// every field checked: a missing or mistyped field is kCorruption naming the manifest and key,
// and so is a field out of its range or inconsistent with the others (Manifest::check).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/file_io.hpp"
#include "zero/engine/engine.hpp"

namespace zero::ckpt::detail {

inline constexpr int kFormatVersion = 1;
inline constexpr const char* kManifest = "manifest.json";
inline constexpr const char* kManifestSum = "manifest.json.xxh3";
inline constexpr const char* kTrainerFile = "trainer.bin";
inline constexpr const char* kLatest = "latest";

// Elements [begin, end) of one parameter (flattened), stored in `file`: the fp32 master at
// byte master_offset, optimizer state k at state_offsets[k] (the optimizer's state dtype).
// int8 moments are saved by unit instead (UnitEntry::states): a quantization block spans
// parameters, so a parameter's piece then holds the master alone (no state offsets).
struct Piece {
  std::string file;
  std::size_t begin = 0, end = 0;
  std::size_t master_offset = 0;
  std::vector<std::size_t> state_offsets;
};

struct ParamEntry {
  std::string name;  // the parameter's name in its unit
  std::vector<std::int64_t> shape;
  std::size_t numel = 0;
  std::string dtype = "f32";  // of the saved master: always f32 (the pieces' 4 bytes per element)
  std::vector<Piece> pieces;  // sorted by begin; together they cover [0, numel)
};

struct UnitEntry {
  std::string name;
  std::vector<ParamEntry> params;
  // int8 moments: the optimizer state of elements [begin, end) of the unit's padded range (the
  // saving rank's stepped range: whole quantization blocks, each with its absmax), as the
  // engine holds it, state k at state_offsets[k] (master_offset unused). Sorted, disjoint; a
  // range no piece covers (padding past the saved layout) is zero, as the engine starts it.
  std::vector<Piece> states;
};

struct FileEntry {
  std::string name;
  Digest digest;
};

struct Manifest {
  int version = kFormatVersion;
  int world_size = 1;
  int stage = 0;
  std::size_t alignment = 32;
  std::string param_dtype;  // the working dtype of the run that saved
  std::string optimizer;    // OptimizerType name
  std::string state_dtype;
  int num_states = 0;
  OptimizerParams hyper;  // the optimizer's hyper-parameters (lr: the config's base lr)
  std::int64_t steps = 0, skipped = 0;
  bool fp16 = false;
  LossScaler::State loss_scaler;
  std::string config_json;  // the run's config (Config::to_json)
  std::vector<UnitEntry> units;
  std::vector<FileEntry> files;  // every file but the manifest and its checksum

  std::string to_json() const;
  // `where`: the manifest's path for error messages. parse_fields() and then check().
  static Manifest parse(const std::string& text, const std::string& where);
  // Every key present with its type (integers within their C++ type), the pieces tiling each
  // parameter; kCorruption naming the key otherwise.
  static Manifest parse_fields(const std::string& text, const std::string& where);
  // Every field in its range and consistent with the others, before anything is read by it
  // (ckpt/manifest_check.cpp lists them); kCorruption naming the key otherwise.
  void check(const std::string& where) const;
  const FileEntry* file(const std::string& name) const;
};

// The manifest half the saving rank knows: its pieces, per (unit, param), and its data file.
struct Fragment {
  int rank = 0;
  std::vector<std::vector<std::vector<Piece>>> pieces;  // [unit][param]
  std::vector<std::vector<Piece>> unit_states;          // [unit]: int8 moments (UnitEntry::states)
  std::optional<FileEntry> file;
  std::string to_json() const;
  static Fragment parse(const std::string& text, const std::string& where);
};

// Reads and checks dir's manifest against its checksum file.
Manifest read_manifest(const std::string& dir);
// The manifest of the engine's model (names, shapes, optimizer, counters), without pieces.
Manifest manifest_of(Engine& engine);
// The first difference between the manifest's model and optimizer (the optimizer only when
// `optimizer`) and the engine's, as an error message naming both sides; empty when they match.
std::string model_mismatch(const Manifest& saved, Engine& engine, bool optimizer = true);

}  // namespace zero::ckpt::detail
