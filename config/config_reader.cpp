// The Reader (config/config_reader.hpp): typed access to one object of the merged config
// document, each read checked for its type and range, every key it asked for recorded, and the
// keys it did not ask for refused with a suggestion — the error naming the full key path and the
// value. config/config.cpp reads the document through it.
#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "config/config_keys.hpp"
#include "config/config_reader.hpp"
#include "zero/core/error.hpp"
#include "zero/core/log.hpp"

namespace zero::detail {

using nlohmann::json;

namespace {

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// A value as a message quotes it: JSON, truncated (the document is depth-bounded, so dump()
// cannot recurse far; `replace` keeps it from throwing on a string that is not UTF-8).
std::string show(const json& v) {
  return printable(v.dump(-1, ' ', false, json::error_handler_t::replace));
}

std::string int_range(std::int64_t lo, std::int64_t hi) {
  std::ostringstream os;
  os << "must be an integer in [" << lo << ", ";
  if (hi == INT64_MAX) {
    os << "inf)";
  } else {
    os << hi << "]";
  }
  return os.str();
}

}  // namespace

void ReadContext::note(const std::string& path, const std::string& message) {
  if (noted.insert(path).second && !quiet) ZERO_LOG(kWarn, "config key '", path, "' ", message);
}

Reader::Reader(const json* obj, std::string path, ReadContext* ctx)
    : Reader(obj, std::move(path), ctx, true) {}

Reader::Reader(const json* obj, std::string path, ReadContext* ctx, bool record)
    : obj_(obj), path_(std::move(path)), ctx_(ctx), record_(record) {
  if (obj_ != nullptr && !obj_->is_object()) {
    ZERO_THROW(kConfig, "config key '", path_, "' = ", show(*obj_), ": must be an object");
  }
}

std::string Reader::key_path(std::string_view key) const {
  return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
}

const json* Reader::find(std::string_view key, bool leaf) {
  known_.insert(std::string(key));
  if (leaf && record_ && ctx_->asked != nullptr) ctx_->asked->insert(key_path(key));
  if (obj_ == nullptr) return nullptr;
  auto it = obj_->find(std::string(key));
  if (it == obj_->end() || it->is_null()) return nullptr;
  if (it->is_string() && it->get<std::string>() == "auto") {
    ZERO_THROW(kConfig, "config key '", key_path(key),
               "' = \"auto\": 'auto' is filled in by the HuggingFace integration; give a value");
  }
  const std::string path = key_path(key);
  if (const ConfigKey* row = find_config_key(path);
      row != nullptr && row->handling == KeyHandling::kNoEffect && !is_quiet(*row, *it)) {
    ctx_->note(path, "= " + show(*it) + " has no effect here: " + std::string(row->meaning));
  }
  return &*it;
}

bool Reader::present(std::string_view key) const {
  if (obj_ == nullptr) return false;
  auto it = obj_->find(std::string(key));
  return it != obj_->end() && !it->is_null();
}

void Reader::note(std::string_view key, const std::string& message) {
  if (find(key) != nullptr) ctx_->note(key_path(key), message);
}

std::optional<bool> Reader::read_bool(std::string_view key) {
  const json* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) fail(key, *v, "must be true or false");
  return v->get<bool>();
}

void Reader::get(std::string_view key, std::string& out,
                 std::span<const std::string_view> allowed) {
  if (const json* v = find(key)) {
    if (!v->is_string()) fail(key, *v, "must be a string");
    std::string s = v->get<std::string>();
    if (allowed.size() != 0) {
      bool ok = false;
      std::string list;
      for (std::string_view a : allowed) {
        ok = ok || s == a;
        if (!list.empty()) list += ", ";
        list += a;
      }
      if (!ok) fail(key, *v, "must be one of " + list);
    }
    out = std::move(s);
  }
}

void Reader::get(std::string_view key, std::vector<std::string>& out) {
  if (const json* v = find(key)) {
    if (!v->is_array()) fail(key, *v, "must be an array of strings");
    std::vector<std::string> strings;
    for (const json& s : *v) {
      if (!s.is_string() || s.get<std::string>().empty()) {
        fail(key, *v, "every entry must be a non-empty string");
      }
      strings.push_back(s.get<std::string>());
    }
    out = std::move(strings);
  }
}

std::optional<std::int64_t> Reader::read_int(std::string_view key, std::int64_t lo,
                                             std::int64_t hi) {
  const json* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) fail(key, *v, "must be an integer");
  std::int64_t x = 0;
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (!std::isfinite(d) || d != std::floor(d)) fail(key, *v, "must be an integer");
    // 2^63 is the first double past INT64_MAX; a JSON integer past 2^64 arrives as a double.
    if (std::fabs(d) >= 9.2233720368547758e18) fail(key, *v, int_range(lo, hi));
    x = static_cast<std::int64_t>(d);
  } else if (v->is_number_unsigned() &&
             v->get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX)) {
    fail(key, *v, int_range(lo, hi));
  } else {
    x = v->get<std::int64_t>();
  }
  if (x < lo || x > hi) fail(key, *v, int_range(lo, hi));
  return x;
}

std::optional<double> Reader::read_num(std::string_view key, double lo, double hi, bool lo_open) {
  const json* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) fail(key, *v, "must be a number");
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi || (lo_open && x == lo)) {
    std::ostringstream os;
    os << "must be in " << (lo_open ? "(" : "[") << lo << ", " << hi << "]";
    fail(key, *v, os.str());
  }
  return x == 0.0 ? 0.0 : x;  // -0 reads as 0
}

std::size_t Reader::array_size(std::string_view key, const std::string& why) {
  const json* v = find(key);
  if (v == nullptr) return 0;
  if (!v->is_array()) fail(key, *v, why);
  return v->size();
}

Reader Reader::element(std::string_view key, std::size_t i, const std::string& why) {
  const json& e = (*find(key, false))[i];
  const std::string path = key_path(key) + "[" + std::to_string(i) + "]";
  if (!e.is_object()) ZERO_THROW(kConfig, "config key '", path, "' = ", show(e), ": ", why);
  return Reader(&e, path, ctx_, false);
}

void Reader::fail(std::string_view key, const json& v, const std::string& why) const {
  ZERO_THROW(kConfig, "config key '", key_path(key), "' = ", show(v), ": ", why);
}

void Reader::fail_msg(std::string_view key, const std::string& why) const {
  ZERO_THROW(kConfig, "config key '", key_path(key), "': ", why);
}

void Reader::finish() const {
  if (obj_ == nullptr) return;
  for (auto it = obj_->begin(); it != obj_->end(); ++it) {
    if (known_.count(it.key()) != 0) continue;
    // The distance is at least the difference in length: only keys within 3 bytes of a known
    // one are compared, so a hostile key costs O(its length), not O(length x known keys).
    std::string best;
    std::size_t best_d = 4;
    const std::string& unknown = it.key();
    for (const std::string& k : known_) {
      const std::size_t gap =
          unknown.size() > k.size() ? unknown.size() - k.size() : k.size() - unknown.size();
      if (gap >= best_d) continue;
      const std::size_t d = edit_distance(unknown, k);
      if (d < best_d) {
        best_d = d;
        best = k;
      }
    }
    ZERO_THROW(kConfig, "config key '", printable(key_path(unknown), 160), "' is not known",
               best.empty() ? std::string() : " (did you mean '" + key_path(best) + "'?)");
  }
}

}  // namespace zero::detail
