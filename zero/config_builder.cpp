// Config sources: JSON text and files, --set assignments, the environment and the command line,
// merged as one JSON document (later sources win, objects merge key by key) and read once by
// detail::read_config (zero/config.cpp).
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "zero/config.hpp"
#include "zero/config_reader.hpp"
#include "zero/error.hpp"
#include "zero/log.hpp"

namespace zero {

using json = nlohmann::json;

namespace {

json parse_json(std::string_view text, std::string_view source) {
  try {
    json j = json::parse(text.begin(), text.end(), nullptr, true, /*ignore_comments=*/true);
    if (!j.is_object()) {
      ZERO_THROW(kConfig, "config from ", std::string(source), " is not a JSON object");
    }
    return j;
  } catch (const json::parse_error& e) {
    ZERO_THROW(kConfig, "config from ", std::string(source), " is not valid JSON: ", e.what());
  }
}

void deep_merge(json& into, const json& from) {
  for (auto it = from.begin(); it != from.end(); ++it) {
    if (it->is_object() && into.contains(it.key()) && into[it.key()].is_object()) {
      deep_merge(into[it.key()], *it);
    } else {
      into[it.key()] = *it;
    }
  }
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  ZERO_CHECK(in.good(), kIO, "cannot open config file '", path, "'");
  std::ostringstream os;
  os << in.rdbuf();
  ZERO_CHECK(!in.bad(), kIO, "cannot read config file '", path, "'");
  return os.str();
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
  const std::size_t eq = assignment.find('=');
  ZERO_CHECK(eq != std::string_view::npos && eq > 0, kConfig, std::string(source), " '",
             std::string(assignment), "': expected key.path=value");
  const std::string path(assignment.substr(0, eq));
  const std::string text(assignment.substr(eq + 1));
  json value;
  try {
    value = json::parse(text);
  } catch (const json::parse_error&) {
    value = text;  // a bare word: a string
  }
  json* node = &impl_->doc;
  std::size_t start = 0;
  while (true) {
    const std::size_t dot = path.find('.', start);
    const std::string part =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    ZERO_CHECK(!part.empty(), kConfig, std::string(source), " '", std::string(assignment),
               "': empty key component in '", path, "'");
    if (dot == std::string::npos) {
      (*node)[part] = value;
      break;
    }
    json& next = (*node)[part];
    if (!next.is_object()) {
      ZERO_CHECK(next.is_null(), kConfig, std::string(source), " '", std::string(assignment),
                 "': config key '", path.substr(0, dot), "' is not an object");
      next = json::object();
    }
    node = &next;
    start = dot + 1;
  }
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
        Var{"ZERO_COMM_BACKEND", "comm_backend"},
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
