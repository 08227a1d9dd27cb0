// config/config_reader.hpp — the one place a merged config document becomes a Config: every
// key read with its type and range, unknown keys refused with a suggestion, contradictions named
// (config/config.cpp, through the Reader below; config/config_reader.cpp). The sources
// that build the document (file, environment, --set, arguments) are
// config/config_builder.cpp's; the bounds below are what both sides enforce.
//
// Thread safety: pure functions; a Reader and its ReadContext belong to one read_config call.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zero/config/config.hpp"

namespace zero::detail {

// ---- bounds on what a config source may hold (documented in include/zero/config/config.hpp)

inline constexpr std::size_t kMaxConfigBytes = std::size_t{16} << 20;  // one file or JSON text
// Objects and arrays open at once, the document's top-level object included. Enforced while
// parsing, so nothing recursive (merge, copy, dump, destruction) ever sees a deeper document.
inline constexpr int kMaxConfigDepth = 64;
inline constexpr std::size_t kMaxKeyBytes = 256;
inline constexpr std::size_t kMaxStringBytes = 4096;  // PATH_MAX: nvme_path is the longest
inline constexpr std::size_t kMaxEchoBytes = 80;      // of a key or value quoted in a message

// `s` as it may appear in a message: bytes outside printable ASCII as \xNN, at most `max` bytes
// of it, then "... (N bytes)". Every echo of input goes through it.
std::string printable(std::string_view s, std::size_t max = kMaxEchoBytes);

// The offset of the first byte of `s` that is not well-formed UTF-8 (RFC 3629: no overlong
// forms, no surrogates, nothing above U+10FFFF), or nullopt.
std::optional<std::size_t> utf8_error(std::string_view s);

// The values of optimizer.type and scheduler.type the reader accepts.
inline constexpr std::array<std::string_view, 5> kOptimizerTypes = {"Adam", "AdamW", "SGD", "Lion",
                                                                    "Adagrad"};
inline constexpr std::array<std::string_view, 4> kSchedulerTypes = {"WarmupLR", "WarmupDecayLR",
                                                                    "WarmupCosineLR", "OneCycle"};

// Throws zero::Error(kConfig) naming the full key path and the value. A key given with a value
// that has no effect here is named once, at warn level (detail::config_keys()). `asked`, when
// given, receives the full path of every key this read asked for, given or not (the keys test
// derives the accepted keys from it). `quiet`: no key is named (a config read again, as a
// checkpoint's saved one: its keys were named when the run read it).
Config read_config(const nlohmann::json& doc, std::set<std::string>* asked = nullptr,
                   bool quiet = false);

// ---- the reader: typed access to one JSON object of the document, tracking the keys it read

// What one read_config shares among its readers: the keys asked for (detail::accepted_keys) and
// the keys already named, so each is named once per read.
struct ReadContext {
  std::set<std::string>* asked = nullptr;
  std::set<std::string> noted;
  bool quiet = false;
  // Logs `message` at warn level, the first time only for `path` (never when quiet).
  void note(const std::string& path, const std::string& message);
};

// Every error is zero::Error(kConfig) naming the key's full path ("optimizer.params.lr",
// "optimizer.param_groups[0].match.max_dims") and the value.
class Reader {
 public:
  // `obj` null: the block is absent (every key reads as not given); otherwise it must be an
  // object. `path` is the block's key path ("" for the document).
  Reader(const nlohmann::json* obj, std::string path, ReadContext* ctx);

  std::string key_path(std::string_view key) const;

  // Returns the value for key, or nullptr when absent (null counts as absent: DeepSpeed's
  // "not set").
  // A key given with a value that does nothing here is named once, at warn level, with what
  // DeepSpeed would do (its row in detail::config_keys()).
  // `leaf`: a key with a value (recorded in `asked`), not a block read through sub().
  const nlohmann::json* find(std::string_view key, bool leaf = true);
  bool has(std::string_view key) { return find(key) != nullptr; }
  // Whether the key is set, without taking it as read (finish() still reports it if unread).
  bool present(std::string_view key) const;
  // Names `key` once (warn level) with `message` when it is given.
  void note(std::string_view key, const std::string& message);
  // A key accepted for DeepSpeed compatibility that has no effect here: find() names it.
  void ignore(std::string_view key) { (void)find(key); }

  void get(std::string_view key, bool& out) {
    if (const std::optional<bool> b = read_bool(key)) out = *b;
  }
  void get(std::string_view key, std::optional<bool>& out) {
    if (const std::optional<bool> b = read_bool(key)) out = b;
  }
  void get(std::string_view key, std::string& out, std::span<const std::string_view> allowed = {});
  void get(std::string_view key, std::string& out,
           std::initializer_list<std::string_view> allowed) {
    get(key, out, std::span<const std::string_view>(allowed.begin(), allowed.size()));
  }
  // An array of non-empty strings.
  void get(std::string_view key, std::vector<std::string>& out);
  // Integers: JSON integers or integral floats (DeepSpeed files write 5e8), within [lo, hi].
  template <typename Int>
  void get_int(std::string_view key, Int& out, std::int64_t lo, std::int64_t hi) {
    if (const std::optional<std::int64_t> x = read_int(key, lo, hi)) out = static_cast<Int>(*x);
  }
  // Finite numbers within [lo, hi] ((lo, hi] with `lo_open`); -0 reads as 0.
  void get_num(std::string_view key, double& out, double lo, double hi, bool lo_open = false) {
    if (const std::optional<double> x = read_num(key, lo, hi, lo_open)) out = *x;
  }
  void get_num(std::string_view key, std::optional<double>& out, double lo, double hi,
               bool lo_open = false) {
    if (const std::optional<double> x = read_num(key, lo, hi, lo_open)) out = x;
  }

  Reader sub(std::string_view key) {
    return Reader(find(key, false), key_path(key), ctx_, record_);
  }
  bool has_block(std::string_view key) { return find(key, false) != nullptr; }

  // The length of the array at `key` (0 when absent); `why` is the error when it is not an array.
  std::size_t array_size(std::string_view key, const std::string& why);
  // Element i of the array at `key` (REQUIRES: i < array_size(key)), path "<key>[i]"; `why` is
  // the error when it is not an object. Its keys, and those of its blocks, are not recorded in
  // `asked`: the key table has a row for the array, not for "<key>[0].name".
  Reader element(std::string_view key, std::size_t i, const std::string& why);

  [[noreturn]] void fail(std::string_view key, const nlohmann::json& v,
                         const std::string& why) const;
  [[noreturn]] void fail_msg(std::string_view key, const std::string& why) const;

  // Every key present must have been asked for: an unknown key is an error with a suggestion.
  void finish() const;

 private:
  Reader(const nlohmann::json* obj, std::string path, ReadContext* ctx, bool record);
  std::optional<bool> read_bool(std::string_view key);
  std::optional<std::int64_t> read_int(std::string_view key, std::int64_t lo, std::int64_t hi);
  std::optional<double> read_num(std::string_view key, double lo, double hi, bool lo_open);

  const nlohmann::json* obj_;
  std::string path_;
  ReadContext* ctx_;
  bool record_ = true;  // record the keys read in ctx_->asked
  std::set<std::string> known_;
};

// optimizer.param_groups (config/param_group_rules.cpp): the rules of the optimizer block
// `optimizer` reads, validated (kConfig naming "optimizer.param_groups[i].<key>"), and their
// JSON as the reader takes it.
std::vector<ParamGroupRule> read_param_group_rules(Reader& optimizer);
nlohmann::json param_group_rules_json(const std::vector<ParamGroupRule>& rules);

}  // namespace zero::detail
