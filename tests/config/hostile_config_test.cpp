// Hostile configs: every input the reader cannot represent is a zero::Error (kConfig or kIO)
// naming the key path or the source and byte offset — never another exception, an abort, a hang
// or an unbounded message. In-process through ConfigBuilder, end to end through zero-train (exit
// status, no signal, one line on stderr, bounded size and time), and 5,000 seeded mutations of
// a DeepSpeed config. Prints the tally the issue's table takes.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/load_slack.hpp"
#include "common/scoped_env.hpp"
#include "common/temp_dir.hpp"
#include "zero/config/config.hpp"
#include "zero/core/error.hpp"

#ifndef ZERO_TEST_FIXTURES
#error "ZERO_TEST_FIXTURES must name tests/config/fixtures"
#endif

namespace zero {
namespace {

using Clock = std::chrono::steady_clock;
// A case slower than this counts as a hang: 10 s, plus what a loaded machine adds
// (tests/common/load_slack.hpp).
double hang_s() { return 10.0 + testing::load_slack_s(); }

// The running test's directory (the HostileConfig fixture makes one per test).
const testing::TempDir* current_dir = nullptr;
std::string temp_dir() { return current_dir->path(); }

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = temp_dir() + "/" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

std::string nested(const std::string& open, const std::string& close, int n,
                   const std::string& inner = "1") {
  std::string s;
  s.reserve((open.size() + close.size()) * n + inner.size());
  for (int i = 0; i < n; ++i) s += open;
  s += inner;
  for (int i = 0; i < n; ++i) s += close;
  return s;
}

using testing::ScopedEnv;

// ---- the tally

struct Tally {
  int tried = 0, errors = 0, accepted = 0, crashes = 0, hangs = 0;
  std::vector<std::string> accepted_cases;

  void note_time(const std::string& name, Clock::time_point t0) {
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (s > hang_s()) {
      ++hangs;
      ADD_FAILURE() << name << ": took " << s << " s";
    }
  }
  // f must throw zero::Error with `code` and a message holding every needle, at most 1 KB.
  void refuse(const std::string& name, ErrorCode code, std::vector<std::string> needles,
              const std::function<void()>& f) {
    ++tried;
    const auto t0 = Clock::now();
    try {
      f();
      ADD_FAILURE() << name << ": accepted";
    } catch (const Error& e) {
      ++errors;
      EXPECT_EQ(e.code(), code) << name << ": " << e.what();
      for (const std::string& n : needles) {
        EXPECT_NE(e.message().find(n), std::string::npos)
            << name << ": no '" << n << "' in " << e.what();
      }
      EXPECT_LT(e.message().size(), 1024u) << name;
    } catch (const std::exception& e) {
      ++crashes;
      ADD_FAILURE() << name << ": not a zero::Error: " << e.what();
    }
    note_time(name, t0);
  }
  // f must return true (the accepted value checked); `why` is the argument for accepting.
  void accept(const std::string& name, const std::string& why, const std::function<bool()>& f) {
    ++tried;
    const auto t0 = Clock::now();
    try {
      EXPECT_TRUE(f()) << name;
      ++accepted;
      accepted_cases.push_back(name + ": " + why);
    } catch (const std::exception& e) {
      ADD_FAILURE() << name << ": refused: " << e.what();
    }
    note_time(name, t0);
  }
};

Tally& tally() {
  static Tally t;
  return t;
}

Config json_cfg(const std::string& text) {
  return ConfigBuilder().merge_json(text, "t.json").build();
}
Config set_cfg(const std::string& a) {
  ConfigBuilder b;
  b.set(a);
  return b.build();
}
Config file_cfg(const std::string& name, const std::string& text) {
  return load_config(write_file(name, text));
}
Config env_cfg(const char* var, const std::string& value) {
  ScopedEnv env(var, value);
  return ConfigBuilder().apply_env().build();
}

constexpr ErrorCode kC = ErrorCode::kConfig;

// Each test's files (configs, FIFOs, zero-train's stderr) in a directory of its own, removed after.
class HostileConfig : public ::testing::Test {
 protected:
  void SetUp() override { current_dir = &dir_; }
  void TearDown() override { current_dir = nullptr; }

 private:
  testing::TempDir dir_;
};

// ---- numbers

TEST_F(HostileConfig, Numbers) {
  Tally& t = tally();
  t.refuse("1e400", kC, {"t.json", "byte", "zero_optimization.stage", "does not fit a double"},
           [] { json_cfg(R"({"zero_optimization": {"stage": 1e400}})"); });
  t.refuse("-1e400", kC, {"optimizer.params.lr", "does not fit"},
           [] { json_cfg(R"({"optimizer": {"params": {"lr": -1e400}}})"); });
  t.refuse("--set 1e400", kC, {"--set", "does not fit"},
           [] { set_cfg("optimizer.params.lr=1e400"); });
  t.refuse("--set -1e400 int", kC, {"--set", "does not fit"},
           [] { set_cfg("zero_optimization.stage=-1e400"); });
  t.refuse("1e400 in array", kC, {"optimizer.params.betas[1]", "does not fit"},
           [] { json_cfg(R"({"optimizer": {"params": {"betas": [0.9, 1e400]}}})"); });
  t.accept(
      "1e-400 lr", "rounds to 0 as strtod and Python's json do; lr's range [0, inf) has 0",
      [] { return json_cfg(R"({"optimizer": {"params": {"lr": 1e-400}}})").optimizer.lr == 0; });
  t.refuse("2^64 int", kC,
           {"zero_optimization.stage3_max_live_parameters", "must be an integer in"}, [] {
             json_cfg(R"({"zero_optimization": {"stage": 3,
                          "stage3_max_live_parameters": 18446744073709551616}})");
           });
  t.refuse("2^64-1 int", kC, {"zero_optimization.sub_group_size", "must be an integer in"},
           [] { json_cfg(R"({"zero_optimization": {"sub_group_size": 18446744073709551615}})"); });
  t.refuse("1e19 int", kC, {"gradient_accumulation_steps", "must be an integer in"},
           [] { json_cfg(R"({"gradient_accumulation_steps": 1e19})"); });
  t.refuse("-2^63-1 int", kC, {"zero_optimization.reduce_bucket_size"}, [] {
    json_cfg(R"({"zero_optimization": {"reduce_bucket_size": -9223372036854775809}})");
  });
  t.refuse("\"nan\" number", kC, {"optimizer.params.lr", "must be a number"},
           [] { json_cfg(R"({"optimizer": {"params": {"lr": "nan"}}})"); });
  t.refuse("\"inf\" number", kC, {"gradient_clipping", "must be a number"},
           [] { json_cfg(R"({"gradient_clipping": "inf"})"); });
  t.refuse("--set inf", kC, {"gradient_clipping", "must be a number"},
           [] { set_cfg("gradient_clipping=inf"); });
  t.refuse("NaN literal", kC, {"not valid JSON", "byte"},
           [] { json_cfg(R"({"gradient_clipping": NaN})"); });
  t.refuse("Infinity literal", kC, {"not valid JSON"},
           [] { json_cfg(R"({"gradient_clipping": Infinity})"); });
  t.accept("-0.0 lr", "negative zero is zero; read as +0", [] {
    const double lr = json_cfg(R"({"optimizer": {"params": {"lr": -0.0}}})").optimizer.lr;
    return lr == 0 && !std::signbit(lr);
  });
  t.accept("-0 stage", "the integer -0 is 0", [] {
    return json_cfg(R"({"zero_optimization": {"stage": -0}})").zero_optimization.stage == 0;
  });
  t.refuse("\"auto\"", kC, {"train_batch_size", "auto"},
           [] { json_cfg(R"({"train_batch_size": "auto"})"); });
  t.refuse("comm_timeout_s 1e-9", kC, {"comm_timeout_s", "[0.1, "},
           [] { json_cfg(R"({"comm_timeout_s": 1e-9})"); });
  t.refuse("ZERO_COMM_TIMEOUT_S 1e-9", kC, {"comm_timeout_s"},
           [] { env_cfg("ZERO_COMM_TIMEOUT_S", "1e-9"); });
  t.refuse("comm_timeout_s 1e8", kC, {"comm_timeout_s"},
           [] { json_cfg(R"({"comm_timeout_s": 1e8})"); });
  t.accept(
      "lr 1e308", "finite and in range; a warning here, zero-train exits 2 once every step skips",
      [] { return json_cfg(R"({"optimizer": {"params": {"lr": 1e308}}})").optimizer.lr == 1e308; });
  t.refuse("stage 4", kC, {"zero_optimization.stage", "[0, 3]"},
           [] { json_cfg(R"({"zero_optimization": {"stage": 4}})"); });
  t.refuse("eps 2", kC, {"optimizer.params.eps"},
           [] { json_cfg(R"({"optimizer": {"params": {"eps": 2}}})"); });
  t.refuse("block_size 2^40", kC, {"aio.block_size"},
           [] { json_cfg(R"({"aio": {"block_size": 1099511627776}})"); });
  t.refuse("initial_scale_power 1e3", kC, {"fp16.initial_scale_power"},
           [] { json_cfg(R"({"fp16": {"initial_scale_power": 1e3}})"); });
}

// ---- nesting

TEST_F(HostileConfig, Nesting) {
  Tally& t = tally();
  for (int n : {100, 100'000, 1'000'000}) {
    t.refuse("arrays " + std::to_string(n) + " under a known key", kC,
             {"zero_optimization.stage", "nested deeper than 64"},
             [n] { json_cfg(R"({"zero_optimization": {"stage": )" + nested("[", "]", n) + "}}"); });
  }
  t.refuse("objects 100000 under an unknown key", kC, {"no_such_key.a.a", "nested deeper than 64"},
           [] { json_cfg(R"({"no_such_key": )" + nested(R"({"a": )", "}", 100'000) + "}"); });
  t.refuse("arrays 1000000 under an unknown key (file)", kC, {"deep.json", "nested deeper"},
           [] { file_cfg("deep.json", R"({"x": )" + nested("[", "]", 1'000'000) + "}"); });
  t.refuse("unterminated 100000 arrays", kC, {"nested deeper"},
           [] { json_cfg(R"({"x": )" + std::string(100'000, '[')); });
  t.refuse("--set 100000 arrays", kC, {"--set", "zero_optimization.stage", "nested deeper"},
           [] { set_cfg("zero_optimization.stage=" + nested("[", "]", 100'000)); });
  t.refuse("--set key path of 100 components", kC, {"--set", "nested deeper than 64"}, [] {
    std::string path = "a";
    for (int i = 0; i < 99; ++i) path += ".a";
    set_cfg(path + "=1");
  });
  t.refuse("--set 40 components + 40 arrays", kC, {"nested deeper than 64"}, [] {
    std::string path = "a";
    for (int i = 0; i < 39; ++i) path += ".a";
    set_cfg(path + "=" + nested("[", "]", 40));
  });
  t.refuse("ZERO_SET deep value", kC, {"ZERO_SET", "nested deeper"},
           [] { env_cfg("ZERO_SET", "gradient_clipping=" + nested("[", "]", 1000)); });
  // At the bound (the top-level object and 63 arrays): parsed, then refused by the reader.
  t.refuse("depth exactly 64", kC, {"config key 'x' is not known"},
           [] { json_cfg(R"({"x": )" + nested("[", "]", 63) + "}"); });
}

// ---- long keys and strings

TEST_F(HostileConfig, LongKeysAndStrings) {
  Tally& t = tally();
  const auto t0 = Clock::now();
  t.refuse("50 MB key", kC, {"more than the 16 MiB"},
           [] { json_cfg("{\"" + std::string(50'000'000, 'k') + "\": 1}"); });
  t.refuse("10 MB key (file)", kC, {"key.json", "a key of 10000000 bytes"},
           [] { file_cfg("key.json", "{\"" + std::string(10'000'000, 'k') + "\": 1}"); });
  std::printf("50 MB + 10 MB keys refused in %.3f s\n",
              std::chrono::duration<double>(Clock::now() - t0).count());
  t.refuse("300-byte key", kC, {"a key of 300 bytes"},
           [] { json_cfg("{\"" + std::string(300, 'z') + "\": 1}"); });
  t.refuse("256-byte unknown key", kC, {"zero_optimization.sss", "bytes)' is not known"},
           [] { json_cfg("{\"zero_optimization\": {\"" + std::string(256, 's') + "\": 1}}"); });
  t.refuse("5000-byte string", kC,
           {"zero_optimization.offload_optimizer.nvme_path", "a string of 5000 bytes"}, [] {
             json_cfg(R"({"zero_optimization": {"offload_optimizer": {"nvme_path": ")" +
                      std::string(5000, 'p') + "\"}}}");
           });
  t.accept("4096-byte nvme_path", "PATH_MAX, the bound itself", [] {
    return json_cfg(
               R"({"zero_optimization": {"stage": 1, "offload_optimizer": {"device": "nvme", "nvme_path": ")" +
               std::string(4096, 'p') + "\"}}}")
               .zero_optimization.offload_optimizer.nvme_path.size() == 4096;
  });
  t.refuse("--set 5000-byte bare value", kC, {"--set", "a value of 5000 bytes"}, [] {
    set_cfg("zero_optimization.offload_optimizer.nvme_path=" + std::string(5000, 'p'));
  });
  t.refuse("--set 300-byte key component", kC, {"--set", "a key of 300 bytes"},
           [] { set_cfg(std::string(300, 'q') + "=1"); });
  t.refuse("16 MiB + 1 text", kC, {"more than the 16 MiB"},
           [] { json_cfg("{}" + std::string((16u << 20) - 1, ' ')); });
}

// ---- UTF-8

TEST_F(HostileConfig, Utf8) {
  Tally& t = tally();
  t.refuse("\\xff in a file's string", kC, {"bad.json", "not valid JSON at byte", "nvme_path"}, [] {
    file_cfg("bad.json",
             "{\"zero_optimization\": {\"offload_optimizer\": {\"nvme_path\": \"/a\xff\"}}}");
  });
  t.refuse("\\xff outside a string", kC, {"not valid JSON at byte"}, [] { json_cfg("{\xff}"); });
  t.refuse("--set key \\xff", kC, {"--set", "not valid UTF-8 at byte 4"},
           [] { set_cfg("zero\xff=1"); });
  t.refuse("--set value \\xff", kC, {"--set", "not valid UTF-8 at byte 24"},
           [] { set_cfg("zero_optimization.stage=\xff"); });
  t.refuse("ZERO_SET \\xff", kC, {"ZERO_SET", "not valid UTF-8"},
           [] { env_cfg("ZERO_SET", "zero_optimization.stage=\xff"); });
  t.refuse("ZERO_STAGE \\xff", kC, {"ZERO_STAGE", "not valid UTF-8"},
           [] { env_cfg("ZERO_STAGE", "\xff"); });
  t.refuse("ZERO_NVME_PATH overlong /", kC, {"ZERO_NVME_PATH", "not valid UTF-8"},
           [] { env_cfg("ZERO_NVME_PATH", "/a\xc0\xaf"); });
  t.refuse("overlong in a file", kC, {"not valid JSON"},
           [] { json_cfg("{\"comm_backend\": \"\xc0\xaf\"}"); });
  t.refuse("surrogate bytes (CESU-8)", kC, {"not valid JSON"},
           [] { json_cfg("{\"comm_backend\": \"\xed\xa0\x80\"}"); });
  t.refuse("--set surrogate bytes", kC, {"not valid UTF-8"},
           [] { set_cfg("comm_backend=\xed\xa0\x80"); });
  t.refuse("--set F5 lead byte", kC, {"not valid UTF-8"},
           [] { set_cfg("comm_backend=\xf5\x80\x80\x80"); });
  t.refuse("lone \\ud800", kC, {"not valid JSON", "comm_backend"},
           [] { json_cfg(R"({"comm_backend": "\ud800"})"); });
  t.refuse("lone \\udc00", kC, {"not valid JSON"},
           [] { json_cfg(R"({"comm_backend": "\udc00x"})"); });
  t.refuse("--set quoted \\ud800", kC, {"--set", "not valid JSON"},
           [] { set_cfg(R"(comm_backend="\ud800")"); });
  t.refuse("NUL byte", kC, {"not valid JSON at byte"},
           [] { json_cfg(std::string("{\"a\": 1\0}", 9)); });
}

// ---- duplicates, files, shapes

TEST_F(HostileConfig, DuplicatesFilesAndShapes) {
  Tally& t = tally();
  t.refuse("duplicate top-level key", kC, {"t.json", "'gradient_clipping'", "twice"},
           [] { json_cfg(R"({"gradient_clipping": 1, "gradient_clipping": 2})"); });
  t.refuse("duplicate nested key (stage 7 then 1)", kC, {"zero_optimization.stage", "twice"},
           [] { json_cfg(R"({"zero_optimization": {"stage": 7, "stage": 1}})"); });
  t.refuse("duplicate key in a file", kC, {"dup.json", "optimizer.params.lr", "twice"},
           [] { file_cfg("dup.json", R"({"optimizer": {"params": {"lr": 0.1, "lr": 0.2}}})"); });
  t.accept(
      "later source overrides", "the documented layering (file < env < flags), not a duplicate",
      [] {
        ConfigBuilder b;
        b.merge_json(R"({"zero_optimization": {"stage": 1}})").set("zero_optimization.stage=2");
        return b.build().zero_optimization.stage == 2;
      });
  constexpr ErrorCode kIO = ErrorCode::kIO;
  t.refuse("--config DIR", kIO, {temp_dir(), "is a directory"}, [] { load_config(temp_dir()); });
  t.refuse("/dev/zero", kIO, {"/dev/zero", "character device"}, [] { load_config("/dev/zero"); });
  t.refuse("FIFO", kIO, {"fifo", "a FIFO"}, [] {
    const std::string p = temp_dir() + "/fifo";
    mkfifo(p.c_str(), 0600);
    load_config(p);
  });
  t.refuse("file over 16 MiB", kC, {"big.json", "more than the 16 MiB"},
           [] { file_cfg("big.json", "{}" + std::string(16u << 20, ' ')); });
  t.refuse("missing file", kIO, {"/nonexistent/c.json"},
           [] { load_config("/nonexistent/c.json"); });
  t.refuse("empty file", kC, {"empty.json", "is empty"}, [] { file_cfg("empty.json", ""); });
  t.refuse("blank file", kC, {"is empty"}, [] { file_cfg("blank.json", " \n\t "); });
  t.refuse("NUL byte in a file", kC, {"nul.json", "not valid JSON at byte"},
           [] { file_cfg("nul.json", std::string("{\0}", 3)); });
  t.refuse("top-level array", kC, {"it is an array"}, [] { json_cfg("[1, 2]"); });
  t.refuse("top-level number", kC, {"it is a number"}, [] { json_cfg("3"); });
  t.refuse("top-level string", kC, {"it is a string"}, [] { json_cfg(R"("x")"); });
  t.refuse("trailing garbage", kC, {"not valid JSON"}, [] { json_cfg("{} x"); });
  t.refuse("truncated", kC, {"not valid JSON"}, [] { json_cfg(R"({"a": )"); });
  t.accept("comments", "the reader ignores // and /* */ comments (ignore_comments), as before", [] {
    return json_cfg("// c\n{\"zero_optimization\": {/* x */ \"stage\": 1}}")
               .zero_optimization.stage == 1;
  });
  t.accept("null value", "null is DeepSpeed's \"not set\": the default", [] {
    return json_cfg(R"({"zero_optimization": {"stage": null}})").zero_optimization.stage == 0;
  });
}

// ---- types, unknown keys, batch sizes

TEST_F(HostileConfig, TypesUnknownKeysAndBatch) {
  Tally& t = tally();
  const std::pair<const char*, const char*> wrong[] = {
      {R"({"zero_optimization": {"overlap_comm": "true"}})",
       "zero_optimization.overlap_comm"},                                               // bool
      {R"({"optimizer": {"type": 5}})", "optimizer.type"},                              // string
      {R"({"zero_optimization": {"stage": true}})", "zero_optimization.stage"},         // int
      {R"({"optimizer": {"params": {"lr": "0.1"}}})", "optimizer.params.lr"},           // number
      {R"({"optimizer": "AdamW"})", "optimizer"},                                       // object
      {R"({"optimizer": {"params": {"betas": {"a": 1}}}})", "optimizer.params.betas"},  // array
  };
  for (auto [text, key] : wrong) {
    t.refuse(std::string("wrong type: ") + key, kC, {std::string("'") + key + "'"},
             [text = text] { json_cfg(text); });
  }
  const std::pair<const char*, const char*> unknown[] = {
      {R"({"stagee": 1})", "stagee"},
      {R"({"zero_optimization": {"stag": 1}})", "zero_optimization.stag"},
      {R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"devise": "cpu"}}})",
       "zero_optimization.offload_optimizer.devise"},
      {R"({"optimizer": {"params": {"lrr": 1}}})", "optimizer.params.lrr"},
      {R"({"scheduler": {"type": "WarmupLR", "params": {"x": 1}}})", "scheduler.params.x"},
      {R"({"fp16": {"enable": true}})", "fp16.enable"},
      {R"({"aio": {"queue": 1}})", "aio.queue"},
  };
  for (auto [text, key] : unknown) {
    t.refuse(std::string("unknown key: ") + key, kC, {std::string("'") + key + "' is not known"},
             [text = text] { json_cfg(text); });
  }
  t.refuse("train_batch_size inconsistent", kC,
           {"'train_batch_size' = 16", "train_micro_batch_size_per_gpu (4)",
            "gradient_accumulation_steps (1)", "world size (2)", "= 8"},
           [] {
             load_config(std::string(ZERO_TEST_FIXTURES) + "/ds_zero3_cpu_offload.json")
                 .resolve_batch(2);
           });
  t.refuse("train_batch_size not a multiple", kC,
           {"'train_batch_size' = 10", "gradient_accumulation_steps (derived)", "world size (1)"},
           [] {
             json_cfg(R"({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4})")
                 .resolve_batch(1);
           });
  t.refuse("batch product overflows", kC, {"train_batch_size", "overflows"}, [] {
    json_cfg(R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4611686018427387904,
                 "gradient_accumulation_steps": 4})")
        .resolve_batch(2);
  });
  t.accept("accumulation derived", "DeepSpeed: train 16 / (micro 2 x 4 ranks) = accumulation 2",
           [] {
             const Config c =
                 json_cfg(R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2})")
                     .resolve_batch(4);
             return c.gradient_accumulation_steps == 2 && c.train_micro_batch_size_per_gpu == 2;
           });
  t.accept("micro derived", "DeepSpeed: train 16 alone at 4 ranks = micro 4, accumulation 1", [] {
    const Config c = json_cfg(R"({"train_batch_size": 16})").resolve_batch(4);
    return c.train_micro_batch_size_per_gpu == 4 && c.gradient_accumulation_steps == 1;
  });
}

// ---- random mutations of a DeepSpeed config

TEST_F(HostileConfig, FiveThousandMutations) {
  const std::string base =
      testing::read_file(std::string(ZERO_TEST_FIXTURES) + "/ds_zero3_cpu_offload.json");
  ASSERT_FALSE(base.empty());
  const char* inserts[] = {
      "1e400",    "-1e400", "[[[[[[[[", "\xff", "\"\\ud800\"", "\"stage\": 1, ",      "null",
      "\"auto\"", "{",      "}",        ",",    "\"",          "18446744073709551616"};
  std::mt19937_64 rng(20261204);
  int configs = 0, errors = 0, others = 0;
  double slowest = 0;  // one mutation's parse: none may hang
  const auto t0 = Clock::now();
  for (int i = 0; i < 5000; ++i) {
    const auto ti = Clock::now();
    std::string s = base;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < edits; ++k) {
      const std::size_t at = rng() % (s.size() + 1);
      switch (rng() % 5) {
        case 0:
          if (at < s.size()) s[at] = static_cast<char>(rng());
          break;
        case 1: s.insert(at, 1, static_cast<char>(rng())); break;
        case 2:
          if (at < s.size()) s.erase(at, 1 + rng() % 8);
          break;
        case 3: s.insert(at, inserts[rng() % std::size(inserts)]); break;
        default:
          if (at < s.size()) s.insert(at, s.substr(at, rng() % 64));
          break;
      }
    }
    try {
      (void)ConfigBuilder().merge_json(s, "mutation").build();
      ++configs;
    } catch (const Error&) {
      ++errors;
    } catch (const std::exception& e) {
      ++others;
      ADD_FAILURE() << "mutation " << i << ": not a zero::Error: " << e.what();
    }
    slowest = std::max(slowest, std::chrono::duration<double>(Clock::now() - ti).count());
  }
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf(
      "mutations: 5000 tried, %d configs, %d zero::Error, %d other exceptions, %.2f s, the "
      "slowest %.4f s\n",
      configs, errors, others, secs, slowest);
  EXPECT_EQ(others, 0);
  EXPECT_EQ(configs + errors, 5000);
  EXPECT_LT(slowest, hang_s());
}

// ---- end to end: zero-train as a subprocess

#ifdef ZERO_TRAIN_BIN
struct RunResult {
  bool exited = false;
  int status = -1;
  int signal = 0;
  bool timed_out = false;
  double secs = 0;
  std::string err;
};

RunResult run_train(const std::vector<std::string>& args, const char* env_key = nullptr,
                    const std::string& env_value = "") {
  const std::string err_path = temp_dir() + "/stderr.txt";
  const auto t0 = Clock::now();
  const pid_t pid = fork();
  if (pid == 0) {
    const int out = open("/dev/null", O_WRONLY);
    const int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(out, 1);
    dup2(err, 2);
    if (env_key != nullptr) setenv(env_key, env_value.c_str(), 1);
    std::vector<char*> argv{const_cast<char*>(ZERO_TRAIN_BIN)};
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(ZERO_TRAIN_BIN, argv.data());
    _exit(127);
  }
  RunResult r;
  int st = 0;
  while (waitpid(pid, &st, WNOHANG) == 0) {
    if (std::chrono::duration<double>(Clock::now() - t0).count() > hang_s()) {
      r.timed_out = true;
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  r.secs = std::chrono::duration<double>(Clock::now() - t0).count();
  r.exited = WIFEXITED(st);
  r.status = r.exited ? WEXITSTATUS(st) : -1;
  r.signal = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
  r.err = testing::read_file(err_path);
  return r;
}

void expect_train_error(const std::string& name, const std::vector<std::string>& args,
                        const std::string& needle, const char* env_key = nullptr,
                        const std::string& env_value = "") {
  Tally& t = tally();
  ++t.tried;
  const RunResult r = run_train(args, env_key, env_value);
  if (r.timed_out) ++t.hangs;
  if (r.signal != 0) ++t.crashes;
  EXPECT_FALSE(r.timed_out) << name;
  EXPECT_EQ(r.signal, 0) << name << ": killed by signal " << r.signal;
  EXPECT_TRUE(r.exited && r.status != 0) << name << ": status " << r.status;
  // One line that names the problem (log lines "[zero W] ..." may precede it).
  int lines = 0;
  std::string line;
  std::istringstream es(r.err);
  for (std::string l; std::getline(es, l);) {
    if (l.rfind("zero-train: ", 0) == 0 && l.find("warning") == std::string::npos) {
      ++lines;
      line = l;
    }
  }
  EXPECT_EQ(lines, 1) << name << ": " << r.err.substr(0, 2000);
  EXPECT_NE(line.find(needle), std::string::npos) << name << ": " << line.substr(0, 500);
  EXPECT_LT(r.err.size(), 8192u) << name;
  if (r.exited && r.status != 0 && r.signal == 0 && !r.timed_out) ++t.errors;
  std::printf("zero-train %-28s exit %d in %.2f s, stderr %zu B\n", name.c_str(), r.status, r.secs,
              r.err.size());
}

TEST_F(HostileConfig, ZeroTrainEndToEnd) {
  const std::vector<std::string> tiny = {"--steps",      "12", "--layers", "1", "--dim",   "16",
                                         "--heads",      "2",  "--seq",    "8", "--batch", "2",
                                         "--eval-every", "0"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = tiny;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  expect_train_error(
      "--config 1e400",
      with({"--config", write_file("e1.json", R"({"zero_optimization": {"stage": 1e400}})")}),
      "does not fit a double");
  expect_train_error("--set stage=\\xff", with({"--set", "zero_optimization.stage=\xff"}),
                     "not valid UTF-8");
  expect_train_error("ZERO_SET stage=\\xff", tiny, "ZERO_SET", "ZERO_SET",
                     "zero_optimization.stage=\xff");
  expect_train_error("ZERO_STAGE=\\xff", tiny, "ZERO_STAGE", "ZERO_STAGE", "\xff");
  expect_train_error("--config DIR", with({"--config", temp_dir()}), "is a directory");
  expect_train_error("--config /dev/zero", with({"--config", "/dev/zero"}), "character device");
  {
    const std::string fifo = temp_dir() + "/fifo2";
    mkfifo(fifo.c_str(), 0600);
    expect_train_error("--config FIFO", with({"--config", fifo}), "a FIFO");
  }
  expect_train_error(
      "--config 1M-deep",
      with({"--config", write_file("d.json", R"({"x": )" + nested("[", "]", 1'000'000) + "}")}),
      "nested deeper than 64");
  expect_train_error("--set 30000 arrays",
                     with({"--set", "zero_optimization.stage=" + nested("[", "]", 30'000)}),
                     "nested deeper than 64");
  expect_train_error(
      "--config 10 MB key",
      with({"--config", write_file("k.json", "{\"" + std::string(10'000'000, 'k') + "\": 1}")}),
      "a key of 10000000 bytes");
  expect_train_error(
      "--config duplicate stage",
      with({"--config",
            write_file("dup2.json", R"({"zero_optimization": {"stage": 7, "stage": 1}})")}),
      "zero_optimization.stage");
  expect_train_error(
      "train_batch_size 7",
      with({"--set", "train_batch_size=7", "--set", "train_micro_batch_size_per_gpu=2"}),
      "train_micro_batch_size_per_gpu (2) x gradient_accumulation_steps (derived) x world size "
      "(2)");
  expect_train_error("--batch vs micro", with({"--set", "train_micro_batch_size_per_gpu=3"}),
                     "disagree");
  expect_train_error("comm_timeout_s 1e-9", with({"--set", "comm_timeout_s=1e-9"}),
                     "comm_timeout_s");
  expect_train_error("--lr 1e308", with({"--lr", "1e308"}), "every step was skipped");
}
#endif

// Runs last (gtest keeps the file's order): the issue's table.
TEST_F(HostileConfig, ZTally) {
  const Tally& t = tally();
  std::printf(
      "hostile config cases: tried %d, clear errors %d, crashes %d, hangs %d, accepted %d\n",
      t.tried, t.errors, t.crashes, t.hangs, t.accepted);
  for (const std::string& a : t.accepted_cases) std::printf("  accepted: %s\n", a.c_str());
  EXPECT_GE(t.tried, 60);
  EXPECT_EQ(t.crashes, 0);
  EXPECT_EQ(t.hangs, 0);
  EXPECT_EQ(t.tried, t.errors + t.accepted);
}

}  // namespace
}  // namespace zero
