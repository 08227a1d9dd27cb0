// The manifest's fields checked one by one, in range and against each other (Manifest::check),
// before a load, an export or a rewrite reads anything by them: a manifest whose checksum was
// recomputed after an edit (or that a bug wrote) is refused naming the key, not trusted.
//
// What each field may hold is what the writer (manifest_of, the save's commit) can write:
//   world_size       1 .. kMaxWorldSize (ranks of the saving group)
//   stage            0 .. 3, the config's zero_optimization.stage
//   alignment        a power of two (the layout's rule, engine/flat_layout.hpp), <= kMaxAlignment
//   param_dtype      a working dtype by its exact name (f32, f16, bf16), the config's
//   optimizer        type and state_dtype by their exact names, the config's; num_states the
//                    rule's; params as OptimizerParams::validate() takes them
//   config           a config the reader accepts (read_config, as parse_config reads it)
//   training         steps >= 0; 0 <= skipped <= steps; fp16 iff param_dtype is f16; the loss
//                    scaler as LossScaler::load_state() takes it, its iterations ordered
//   units            parameters with extents >= 1 and numel their product (<= kMaxNumel),
//                    dtype f32 (the master), pieces in listed files and within their sizes;
//                    int8 state pieces within the unit's padded range
//   files            not empty, unique names, trainer.bin among them, every file a piece names
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "ckpt/manifest.hpp"
#include "ckpt/rank_file.hpp"
#include "config/config_reader.hpp"
#include "engine/flat_layout.hpp"
#include "zero/config/config.hpp"
#include "zero/core/error.hpp"

namespace zero::ckpt::detail {

namespace {

// Bounds no run reaches, that keep every product below (N x alignment, offsets) in 64 bits.
constexpr int kMaxWorldSize = 1 << 20;
constexpr std::size_t kMaxAlignment = std::size_t{1} << 20;
constexpr std::size_t kMaxNumel = std::size_t{1} << 48;

class Checker {
 public:
  Checker(const Manifest& m, const std::string& where) : m_(m), where_(where) {}

  void run() const {
    top_level();
    optimizer();
    config();
    training();
    files();
    units();
  }

 private:
  template <typename... Args>
  [[noreturn]] void fail(const std::string& key, const Args&... why) const {
    ZERO_THROW(kCorruption, "checkpoint manifest '", where_, "': key '", key, "' ", why...);
  }

  // A rule of the library that throws zero::Error (the config reader, OptimizerParams), named
  // by the manifest's key.
  template <typename Fn>
  void as_key(const std::string& key, Fn&& fn) const {
    try {
      fn();
    } catch (const Error& e) {
      fail(key, "is refused: ", e.message());
    }
  }

  void top_level() const {
    if (m_.world_size < 1 || m_.world_size > kMaxWorldSize) {
      fail("world_size", "is ", m_.world_size, ", not in [1, ", kMaxWorldSize, "]");
    }
    if (m_.stage < 0 || m_.stage > 3) fail("stage", "is ", m_.stage, ", not a ZeRO stage (0-3)");
    if (m_.alignment < 1 || m_.alignment > kMaxAlignment ||
        (m_.alignment & (m_.alignment - 1)) != 0) {
      fail("alignment", "is ", m_.alignment, ", not a power of two in [1, ", kMaxAlignment, "]");
    }
    as_key("param_dtype", [&] { exact_name(m_.param_dtype, parse_dtype); });
  }

  // `name` as the library writes it: parse(name) accepts it, and writes it back the same.
  template <typename Parse>
  static void exact_name(const std::string& name, Parse&& parse) {
    const auto value = parse(name);
    ZERO_CHECK(to_string(value) == name, kInvalidArgument, "'", name, "' is written '",
               to_string(value), "'");
  }

  void optimizer() const {
    OptimizerParams p = m_.hyper;
    as_key("optimizer.type", [&] {
      exact_name(m_.optimizer, parse_optimizer_type);
      p.type = parse_optimizer_type(m_.optimizer);
    });
    as_key("optimizer.state_dtype", [&] {
      exact_name(m_.state_dtype, parse_moment_dtype);
      p.moment_dtype = parse_moment_dtype(m_.state_dtype);
    });
    if (p.state_dtype() != p.moment_dtype) {
      fail("optimizer.state_dtype", "is ", m_.state_dtype, ", but ", m_.optimizer,
           " keeps f32 state");
    }
    as_key("optimizer.params", [&] { p.validate(); });
    // momentum and dampening are SGD's, but written for every rule: their range is SGD's.
    OptimizerParams sgd = p;
    sgd.type = OptimizerType::kSgd;
    sgd.moment_dtype = MomentDType::kF32;
    sgd.nesterov = false;
    as_key("optimizer.params", [&] { sgd.validate(); });
    if (m_.num_states != p.num_states()) {
      fail("optimizer.num_states", "is ", m_.num_states, ", but ", m_.optimizer, " keeps ",
           p.num_states(), " state arrays");
    }
  }

  void training() const {
    if (m_.steps < 0) fail("training.steps", "is ", m_.steps, ", not >= 0");
    if (m_.skipped < 0 || m_.skipped > m_.steps) {
      fail("training.skipped", "is ", m_.skipped, ", not in [0, steps = ", m_.steps, "]");
    }
    if (m_.fp16 != (m_.param_dtype == to_string(DType::kF16))) {
      fail("training.fp16", "is ", m_.fp16 ? "true" : "false", ", but param_dtype is ",
           m_.param_dtype);
    }
    const LossScaler::State& s = m_.loss_scaler;
    as_key("training.loss_scaler", [&] { LossScaler::fixed(1.0).load_state(s); });
    if (s.iter < 0) fail("training.loss_scaler.iter", "is ", s.iter, ", not >= 0");
    // -1: no overflow yet; else the iteration of the last one, before the current.
    if (s.last_overflow_iter < -1 ||
        (s.last_overflow_iter >= 0 && s.last_overflow_iter >= s.iter)) {
      fail("training.loss_scaler.last_overflow_iter", "is ", s.last_overflow_iter,
           ", not -1 or in [0, iter = ", s.iter, ")");
    }
  }

  void config() const {
    Config cfg;
    // Quiet: the run named the keys that have no effect when it read them.
    as_key("config", [&] {
      const auto doc = nlohmann::json::parse(m_.config_json, nullptr, /*allow_exceptions=*/false);
      ZERO_CHECK(!doc.is_discarded(), kConfig, "not JSON");
      cfg = zero::detail::read_config(doc, nullptr, /*quiet=*/true);
    });
    if (cfg.zero_optimization.stage != m_.stage) {
      fail("stage", "is ", m_.stage, ", but the config's zero_optimization.stage is ",
           cfg.zero_optimization.stage);
    }
    if (to_string(working_dtype(cfg)) != m_.param_dtype) {
      fail("param_dtype", "is ", m_.param_dtype, ", but the config trains in ",
           to_string(working_dtype(cfg)));
    }
    OptimizerParams op;
    as_key("config", [&] { op = OptimizerParams::from_config(cfg.optimizer); });
    if (to_string(op.type) != m_.optimizer) {
      fail("optimizer.type", "is ", m_.optimizer, ", but the config's optimizer is ",
           to_string(op.type));
    }
    if (to_string(op.state_dtype()) != m_.state_dtype) {
      fail("optimizer.state_dtype", "is ", m_.state_dtype, ", but the config's optimizer keeps ",
           to_string(op.state_dtype()));
    }
  }

  void files() const {
    if (m_.files.empty()) {
      fail("files", "is empty: a checkpoint lists every file it holds (", kTrainerFile,
           " at least) with its size and checksum");
    }
    std::set<std::string> seen;
    for (const FileEntry& f : m_.files) {
      if (!seen.insert(f.name).second) fail("files", "lists '", f.name, "' twice");
    }
    if (m_.file(kTrainerFile) == nullptr) fail("files", "does not list ", kTrainerFile);
  }

  // The piece `pc` at `key` ("units[0].params[1].pieces[2]"): in a listed file of a saving rank,
  // the master (when `master`) and each state within the file's size.
  void piece_bytes(const Piece& pc, const std::string& key, bool master,
                   MomentDType state_dtype) const {
    const FileEntry* f = m_.file(pc.file);
    if (f == nullptr) fail(key + ".file", "is '", pc.file, "', which 'files' does not list");
    if (!rank_file_below(pc.file, m_.world_size)) {
      fail("world_size", "is ", m_.world_size, ", but ", key, " is in '", pc.file,
           "', not the file of a rank below it");
    }
    const std::size_t n = pc.end - pc.begin;
    const auto within = [&](std::size_t offset, std::size_t bytes, const std::string& k) {
      std::size_t end = 0;
      if (__builtin_add_overflow(offset, bytes, &end) || end > f->digest.size) {
        fail(k, "is ", offset, ": its ", bytes, " bytes end past '", pc.file, "' (", f->digest.size,
             " bytes)");
      }
    };
    if (master) within(pc.master_offset, n * 4, key + ".master_offset");
    for (std::size_t k = 0; k < pc.state_offsets.size(); ++k) {
      within(pc.state_offsets[k], state_bytes(state_dtype, n),
             key + ".state_offsets[" + std::to_string(k) + "]");
    }
  }

  // `name` is rank_file(r) ("rank-%05d.bin") of a rank r < world_size: a file a saving rank wrote.
  static bool rank_file_below(const std::string& name, int world_size) {
    const std::size_t digits_end = name.find_first_not_of("0123456789", 5);
    if (name.rfind("rank-", 0) != 0 || digits_end == 5 || digits_end > 12) return false;
    const long long r = std::stoll(name.substr(5, digits_end - 5));
    return r < world_size && rank_file(static_cast<int>(r)) == name;
  }

  // Every unit: its parameters (shape, numel, dtype, pieces), then its int8 state pieces within
  // the padded range the saving engine laid out.
  void units() const {
    const MomentDType sd = parse_moment_dtype(m_.state_dtype);  // checked above
    std::vector<UnitSpec> specs;
    for (std::size_t u = 0; u < m_.units.size(); ++u) specs.push_back(unit_params(u, sd));
    // The unit's padded range, as the saving engine laid it out (int8 state pieces lie in it).
    const zero::detail::Layout layout =
        zero::detail::make_layout(specs, m_.world_size, m_.alignment, state_block(sd));
    for (std::size_t u = 0; u < m_.units.size(); ++u) {
      unit_states(u, layout.units[u].padded, sd);
    }
  }

  // Unit u's parameters; returns the unit as the engine declared it.
  UnitSpec unit_params(std::size_t u, MomentDType sd) const {
    const UnitEntry& ue = m_.units[u];
    const std::string uk = "units[" + std::to_string(u) + "]";
    if (ue.params.empty()) fail(uk + ".params", "is empty (unit '", ue.name, "')");
    UnitSpec spec{ue.name, {}};
    for (std::size_t i = 0; i < ue.params.size(); ++i) {
      const ParamEntry& p = ue.params[i];
      const std::string pk = uk + ".params[" + std::to_string(i) + "]";
      const std::string name = "'" + ue.name + "." + p.name + "'";
      param_shape(p, pk, name);
      param_pieces(p, pk, name, sd);
      spec.params.push_back({p.name, p.shape});
    }
    return spec;
  }

  // The parameter's shape, numel (their product) and dtype (the f32 master).
  void param_shape(const ParamEntry& p, const std::string& pk, const std::string& name) const {
    if (p.shape.empty()) fail(pk + ".shape", "is empty (parameter ", name, ")");
    std::size_t numel = 1;
    for (std::int64_t e : p.shape) {
      if (e < 1 || __builtin_mul_overflow(numel, static_cast<std::size_t>(e), &numel) ||
          numel > kMaxNumel) {
        fail(pk + ".shape", "has the extent ", e, " (parameter ", name,
             "): extents are >= 1, their product <= ", kMaxNumel);
      }
    }
    if (p.numel != numel) {
      fail(pk + ".numel", "is ", p.numel, ", not the product of its shape, ", numel, " (parameter ",
           name, ")");
    }
    if (p.dtype != to_string(DType::kF32)) {
      fail(pk + ".dtype", "is '", p.dtype, "' (parameter ", name,
           "): the checkpoint holds the f32 master of every parameter");
    }
  }

  // The pieces tile [0, numel) (what a load relies on), each with the master and, but for int8
  // moments (saved by unit range, UnitEntry::states), every state.
  void param_pieces(const ParamEntry& p, const std::string& pk, const std::string& name,
                    MomentDType sd) const {
    const bool by_unit = sd == MomentDType::kInt8;
    const auto ns = static_cast<std::size_t>(m_.num_states);
    std::size_t at = 0;
    for (std::size_t k = 0; k < p.pieces.size(); ++k) {
      const Piece& pc = p.pieces[k];
      const std::string key = pk + ".pieces[" + std::to_string(k) + "]";
      if (pc.begin != at)
        fail(key + ".begin", "is ", pc.begin, ", not ", at, " (parameter ", name,
             "'s pieces tile it in order)");
      if (pc.end > p.numel)
        fail(key + ".end", "is ", pc.end, ", past numel ", p.numel, " (parameter ", name, ")");
      if (pc.state_offsets.size() != (by_unit ? 0 : ns)) {
        fail(key + ".state_offsets", "has ", pc.state_offsets.size(), " offsets, not ",
             by_unit ? 0 : ns, " (", m_.num_states, " states of ", m_.state_dtype, ")");
      }
      piece_bytes(pc, key, true, sd);
      at = pc.end;
    }
    if (at != p.numel) {
      fail(pk + ".pieces", "cover ", at, " of its ", p.numel, " elements (parameter ", name, ")");
    }
  }

  // Unit u's state pieces (int8 moments only): sorted, disjoint, on quantization blocks, within
  // its `padded` elements, holding every state and no master.
  void unit_states(std::size_t u, std::size_t padded, MomentDType sd) const {
    const bool by_unit = sd == MomentDType::kInt8;
    const auto ns = static_cast<std::size_t>(m_.num_states);
    const std::vector<Piece>& states = m_.units[u].states;
    std::size_t at = 0;
    for (std::size_t k = 0; k < states.size(); ++k) {
      const Piece& pc = states[k];
      const std::string key = "units[" + std::to_string(u) + "].states[" + std::to_string(k) + "]";
      if (!by_unit) {
        fail(key, "is a state piece, but ", m_.state_dtype,
             " moments are saved with each parameter");
      }
      if (pc.begin < at || pc.begin % kInt8MomentBlock != 0) {
        fail(key + ".begin", "is ", pc.begin,
             ": state pieces are sorted, disjoint and start on a quantization block (",
             kInt8MomentBlock, " elements)");
      }
      if (pc.end > padded) {
        fail(key + ".end", "is ", pc.end, ", past the unit's padded range (", padded,
             " elements at ", m_.world_size, " ranks)");
      }
      if (pc.master_offset != 0)
        fail(key + ".master_offset", "is ", pc.master_offset,
             ", not 0 (a state piece holds no master)");
      if (pc.state_offsets.size() != ns) {
        fail(key + ".state_offsets", "has ", pc.state_offsets.size(), " offsets, not ", ns);
      }
      piece_bytes(pc, key, false, sd);
      at = pc.end;
    }
  }

  const Manifest& m_;
  const std::string& where_;
};

}  // namespace

void Manifest::check(const std::string& where) const { Checker(*this, where).run(); }

}  // namespace zero::ckpt::detail
