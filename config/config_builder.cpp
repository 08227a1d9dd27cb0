// Config sources: JSON text and files, --set assignments, the environment and the command line,
// merged as one JSON document (later sources win, objects merge key by key) and read once by
// detail::read_config (config/config.cpp).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "config/config_reader.hpp"
#include "zero/config/config.hpp"
#include "zero/core/error.hpp"
#include "zero/core/log.hpp"

namespace zero {

using json = nlohmann::json;

namespace {

using detail::kMaxConfigBytes;
using detail::kMaxConfigDepth;
using detail::kMaxKeyBytes;
using detail::kMaxStringBytes;
using detail::printable;

// ---- the bounded parser: nlohmann's DOM builder behind a SAX filter that refuses, as the
// events arrive, what the document may not hold (depth, long keys and strings, duplicate keys)
// and turns every parse failure (syntax, invalid UTF-8, a number past a double) into one
// zero::Error naming the source, the byte offset and the key path.

// Why a parse stopped; kSyntax is the only one a --set bare word recovers from.
enum class Refusal : std::uint8_t { kSyntax, kBound };

struct ParseFailure {
  Refusal kind;
  std::string message;  // complete, ready for ZERO_THROW
};

class BoundedSax {
 public:
  using Dom = nlohmann::detail::json_sax_dom_parser<json>;

  // `prefix`: the key path the text sits at (a --set value), `outer_depth` the objects already
  // open above it.
  BoundedSax(json& root, std::string_view source, std::string prefix, int outer_depth)
      : dom_(root, true), source_(source), prefix_(std::move(prefix)), outer_(outer_depth) {}

  bool null() { return element() && dom_.null(); }
  bool boolean(bool b) { return element() && dom_.boolean(b); }
  bool number_integer(json::number_integer_t v) { return element() && dom_.number_integer(v); }
  bool number_unsigned(json::number_unsigned_t v) { return element() && dom_.number_unsigned(v); }
  bool number_float(json::number_float_t v, const std::string& text) {
    if (!std::isfinite(v)) refuse("number " + printable(text) + " does not fit a double");
    return element() && dom_.number_float(v, text);
  }
  bool string(std::string& s) {
    if (s.size() > kMaxStringBytes) {
      element();
      refuse("a string of " + std::to_string(s.size()) + " bytes (at most " +
             std::to_string(kMaxStringBytes) + "): \"" + printable(s) + "\"");
    }
    return element() && dom_.string(s);
  }
  bool binary(json::binary_t& b) { return element() && dom_.binary(b); }
  bool start_object(std::size_t n) { return open(true) && dom_.start_object(n); }
  bool key(std::string& k) {
    Frame& f = frames_.back();
    f.key = k;
    f.has_key = true;
    if (k.size() > kMaxKeyBytes) {
      refuse("a key of " + std::to_string(k.size()) + " bytes (at most " +
             std::to_string(kMaxKeyBytes) + ")");
    }
    if (!f.keys.insert(k).second) {
      refuse("the key appears twice in one object (the first value would be silently lost)");
    }
    return dom_.key(k);
  }
  bool end_object() {
    frames_.pop_back();
    return dom_.end_object();
  }
  bool start_array(std::size_t n) { return open(false) && dom_.start_array(n); }
  bool end_array() {
    frames_.pop_back();
    return dom_.end_array();
  }
  // Every failure of the lexer and parser arrives here, with the byte offset.
  bool parse_error(std::size_t position, const std::string& last_token,
                   const nlohmann::detail::exception& ex) {
    std::string what = ex.what();
    // "[json.exception.parse_error.101] parse error at line 1, column 9: syntax error ...":
    // the part after the bracket, without nlohmann's "last read: '<token>'" echo (unbounded).
    if (const std::size_t close = what.find("] "); close != std::string::npos) {
      what.erase(0, close + 2);
    }
    if (const std::size_t last = what.find("; last read"); last != std::string::npos) {
      what.erase(last);
    }
    const bool overflow = ex.id == 406;  // out_of_range: valid JSON, but a number past a double
    if (overflow) element();             // the number is the value at the key path
    const std::string at = " at byte " + std::to_string(position) + where() + ": ";
    if (overflow) {
      fail(Refusal::kBound, "config from " + printable(source_, 200) + at + "the number " +
                                printable(last_token, 40) + " does not fit a double");
    }
    fail(Refusal::kSyntax, "config from " + printable(source_, 200) + " is not valid JSON" + at +
                               printable(what, 200));
  }

 private:
  struct Frame {
    bool object = false;
    bool has_key = false;        // object: a key was read
    std::string key;             // object: the key being read
    std::size_t next = 0;        // array: the index of the next element
    std::set<std::string> keys;  // object: the keys seen
  };

  // A value starts: counts it as an array's element (for the key path).
  bool element() {
    if (!frames_.empty() && !frames_.back().object) ++frames_.back().next;
    return true;
  }
  bool open(bool object) {
    element();
    if (outer_ + static_cast<int>(frames_.size()) + 1 > kMaxConfigDepth) {
      refuse("objects and arrays nested deeper than " + std::to_string(kMaxConfigDepth) +
             " levels");
    }
    frames_.push_back(Frame{object, false, {}, 0, {}});
    return true;
  }
  // " (key 'a.b[3].c')" for the value being read, or "".
  std::string where() const {
    std::string path = prefix_;
    for (const Frame& f : frames_) {
      if (f.object) {
        if (!f.has_key) break;
        if (!path.empty()) path += '.';
        path += f.key;
      } else if (f.next > 0) {
        path += "[" + std::to_string(f.next - 1) + "]";
      }
    }
    return path.empty() ? std::string() : " (key '" + printable(path, 160) + "')";
  }
  [[noreturn]] void refuse(const std::string& why) {
    fail(Refusal::kBound, "config from " + printable(source_, 200) + where() + ": " + why);
  }
  [[noreturn]] void fail(Refusal kind, std::string message) {
    throw ParseFailure{kind, std::move(message)};
  }

  Dom dom_;
  std::string_view source_;
  std::string prefix_;
  int outer_;
  std::vector<Frame> frames_;
};

// Parses `text` within the bounds; throws ParseFailure.
json parse_bounded(std::string_view text, std::string_view source, const std::string& prefix,
                   int outer_depth) {
  if (text.size() > kMaxConfigBytes) {
    throw ParseFailure{Refusal::kBound, "config from " + printable(source, 200) + " is " +
                                            std::to_string(text.size()) +
                                            " bytes, more than the 16 MiB a config may be"};
  }
  json j;
  BoundedSax sax(j, source, prefix, outer_depth);
  try {
    json::sax_parse(text.begin(), text.end(), &sax, json::input_format_t::json,
                    /*strict=*/true, /*ignore_comments=*/true);
  } catch (const ParseFailure&) {
    throw;
  } catch (const json::exception& e) {  // not expected: the SAX filter sees every failure
    throw ParseFailure{Refusal::kBound, "config from " + printable(source, 200) +
                                            " cannot be read: " + printable(e.what(), 200)};
  }
  return j;
}

const char* kind_of(const json& j) {
  switch (j.type()) {
    case json::value_t::array: return "an array";
    case json::value_t::string: return "a string";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::null: return "null";
    case json::value_t::object: return "an object";
    default: return "a number";
  }
}

json parse_json(std::string_view text, std::string_view source) {
  const std::size_t blank = text.find_first_not_of(" \t\r\n");
  ZERO_CHECK(blank != std::string_view::npos, kConfig, "config from ", printable(source, 200),
             " is empty (a config is a JSON object, at least {})");
  json j;
  try {
    j = parse_bounded(text, source, "", 0);
  } catch (const ParseFailure& f) {
    ZERO_THROW(kConfig, f.message);
  }
  ZERO_CHECK(j.is_object(), kConfig, "config from ", printable(source, 200),
             " is not a JSON object (it is ", kind_of(j), ")");
  return j;
}

// Depth-bounded documents only (parse_bounded's), so the recursion is at most 64 deep.
void deep_merge(json& into, const json& from) {
  for (auto it = from.begin(); it != from.end(); ++it) {
    if (it->is_object() && into.contains(it.key()) && into[it.key()].is_object()) {
      deep_merge(into[it.key()], *it);
    } else {
      into[it.key()] = *it;
    }
  }
}

std::string file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// At most kMaxConfigBytes + 1 bytes of a regular file: /dev/zero, a FIFO or a file that grows
// while read cannot make it read without end.
std::string read_file(const std::string& path) {
  const std::string shown = printable(path, 200);
  // O_NONBLOCK: opening a FIFO without a writer would wait for one.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    ZERO_THROW(kIO, "cannot open config file '", shown,
               "': ", std::error_code(errno, std::generic_category()).message());
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  ZERO_CHECK(::fstat(fd, &st) == 0, kIO, "cannot stat config file '", shown, "'");
  ZERO_CHECK(S_ISREG(st.st_mode), kIO, "config file '", shown, "' is ", file_kind(st.st_mode),
             ", not a regular file");
  auto too_large = [&](std::uint64_t bytes, const char* more) {
    ZERO_THROW(kConfig, "config file '", shown, "' is ", more, bytes,
               " bytes, more than the 16 MiB (", kMaxConfigBytes, " bytes) a config may be");
  };
  if (static_cast<std::uint64_t>(st.st_size) > kMaxConfigBytes) {
    too_large(static_cast<std::uint64_t>(st.st_size), "");
  }
  std::string text(kMaxConfigBytes + 1, '\0');
  std::size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ZERO_THROW(kIO, "cannot read config file '", shown,
                 "': ", std::error_code(errno, std::generic_category()).message());
    }
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  if (got > kMaxConfigBytes) too_large(got, "at least ");
  text.resize(got);
  return text;
}

}  // namespace

// ---- ConfigBuilder

struct ConfigBuilder::Impl {
  json doc = json::object();
};

ConfigBuilder::ConfigBuilder() : impl_(new Impl) {}
ConfigBuilder::~ConfigBuilder() { delete impl_; }
ConfigBuilder::ConfigBuilder(ConfigBuilder&& o) noexcept : impl_(o.impl_) { o.impl_ = nullptr; }
ConfigBuilder& ConfigBuilder::operator=(ConfigBuilder&& o) noexcept {
  std::swap(impl_, o.impl_);
  return *this;
}

ConfigBuilder& ConfigBuilder::merge_json(std::string_view text, std::string_view source) {
  deep_merge(impl_->doc, parse_json(text, source));
  return *this;
}

ConfigBuilder& ConfigBuilder::merge_file(const std::string& path) {
  return merge_json(read_file(path), path);
}

ConfigBuilder& ConfigBuilder::set(std::string_view assignment, std::string_view source) {
  const std::string src = printable(source, 200);
  const std::string shown = printable(assignment, 120);
  if (const std::optional<std::size_t> bad = detail::utf8_error(assignment)) {
    ZERO_THROW(kConfig, src, " '", shown, "': not valid UTF-8 at byte ", *bad);
  }
  const std::size_t eq = assignment.find('=');
  ZERO_CHECK(eq != std::string_view::npos && eq > 0, kConfig, src, " '", shown,
             "': expected key.path=value");
  const std::string path(assignment.substr(0, eq));
  const std::string_view text = assignment.substr(eq + 1);
  // The key path: components of at most kMaxKeyBytes, one object level each.
  std::vector<std::string> parts;
  for (std::size_t start = 0;;) {
    const std::size_t dot = path.find('.', start);
    std::string part =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    ZERO_CHECK(!part.empty(), kConfig, src, " '", shown, "': empty key component in '",
               printable(path, 160), "'");
    ZERO_CHECK(part.size() <= kMaxKeyBytes, kConfig, src, " '", shown, "': a key of ", part.size(),
               " bytes (at most ", kMaxKeyBytes, ")");
    parts.push_back(std::move(part));
    ZERO_CHECK(static_cast<int>(parts.size()) < kMaxConfigDepth, kConfig, src, " '", shown,
               "': a key path nested deeper than ", kMaxConfigDepth, " levels");
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  // JSON when it parses (numbers, true/false, null, arrays, objects, quoted strings), else a
  // bare word. Text that looks like JSON must be JSON; a bound broken is never a bare word.
  json value;
  const std::size_t first = text.find_first_not_of(" \t\r\n");
  const bool json_like = first != std::string_view::npos &&
                         (text[first] == '"' || text[first] == '[' || text[first] == '{');
  try {
    value = parse_bounded(text, source, path, static_cast<int>(parts.size()));
  } catch (const ParseFailure& f) {
    if (f.kind != Refusal::kSyntax || json_like) {
      ZERO_THROW(kConfig, src, " '", shown, "': ", f.message);
    }
    ZERO_CHECK(text.size() <= kMaxStringBytes, kConfig, src, " '", shown, "': a value of ",
               text.size(), " bytes (at most ", kMaxStringBytes, ")");
    value = std::string(text);  // a bare word: a string
  }
  json* node = &impl_->doc;
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    json& next = (*node)[parts[i]];
    if (!next.is_object()) {
      std::string prefix = parts[0];
      for (std::size_t k = 1; k <= i; ++k) prefix += "." + parts[k];
      ZERO_CHECK(next.is_null(), kConfig, src, " '", shown, "': config key '",
                 printable(prefix, 160), "' is not an object");
      next = json::object();
    }
    node = &next;
  }
  (*node)[parts.back()] = std::move(value);
  return *this;
}

ConfigBuilder& ConfigBuilder::apply_env() {
  if (const char* f = std::getenv("ZERO_CONFIG"); f != nullptr && *f != '\0') merge_file(f);
  struct Var {
    const char* env;
    const char* key;
  };
  for (Var v :
       {Var{"ZERO_STAGE", "zero_optimization.stage"}, Var{"ZERO_COMM_TIMEOUT_S", "comm_timeout_s"},
        Var{"ZERO_COMM_BACKEND", "comm_backend"}, Var{"ZERO_COMM_DEBUG", "comm_debug"},
        Var{"ZERO_COMM_FLIGHT_DIR", "comm_flight_dir"},
        Var{"ZERO_OFFLOAD_OPTIMIZER", "zero_optimization.offload_optimizer.device"},
        Var{"ZERO_NVME_PATH", "zero_optimization.offload_optimizer.nvme_path"}}) {
    if (const char* val = std::getenv(v.env); val != nullptr && *val != '\0') {
      set(std::string(v.key) + "=" + val, v.env);
    }
  }
  if (const char* s = std::getenv("ZERO_SET"); s != nullptr && *s != '\0') {
    std::string all(s);
    std::size_t start = 0;
    while (start <= all.size()) {
      const std::size_t semi = all.find(';', start);
      const std::string one =
          all.substr(start, semi == std::string::npos ? std::string::npos : semi - start);
      if (!one.empty()) set(one, "ZERO_SET");
      if (semi == std::string::npos) break;
      start = semi + 1;
    }
  }
  return *this;
}

std::vector<std::string> ConfigBuilder::apply_args(const std::vector<std::string>& args) {
  std::vector<std::string> rest;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value_of = [&](const std::string& flag) -> std::string {
      if (a.size() > flag.size() && a.compare(0, flag.size() + 1, flag + "=") == 0) {
        return a.substr(flag.size() + 1);
      }
      ZERO_CHECK(i + 1 < args.size(), kConfig, "command-line flag ", flag, " needs a value");
      return args[++i];
    };
    auto is = [&](const std::string& flag) {
      return a == flag || a.compare(0, flag.size() + 1, flag + "=") == 0;
    };
    if (is("--config")) {
      merge_file(value_of("--config"));
    } else if (is("--zero-stage")) {
      set("zero_optimization.stage=" + value_of("--zero-stage"), "--zero-stage");
    } else if (is("--set")) {
      set(value_of("--set"), "--set");
    } else {
      rest.push_back(a);
    }
  }
  return rest;
}

Config ConfigBuilder::build() const { return detail::read_config(impl_->doc); }

Config parse_config(std::string_view json_text) {
  ConfigBuilder b;
  b.merge_json(json_text);
  return b.build();
}

Config load_config(const std::string& path) {
  ConfigBuilder b;
  b.merge_file(path);
  return b.build();
}

Config config_from_command_line(int argc, const char* const* argv, std::vector<std::string>* rest) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  ConfigBuilder b;
  // The file named by --config is the base; the environment overrides it; the other flags
  // override both.
  std::vector<std::string> others;
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--config" && i + 1 < args.size()) {
      b.merge_file(args[++i]);
    } else if (args[i].rfind("--config=", 0) == 0) {
      b.merge_file(args[i].substr(9));
    } else {
      others.push_back(args[i]);
    }
  }
  b.apply_env();
  std::vector<std::string> left = b.apply_args(others);
  if (rest != nullptr) *rest = std::move(left);
  return b.build();
}

}  // namespace zero
