// Every config key the reader accepts, walked: the keys come from the reader itself (what
// read_config asks for over documents that open every branch: each optimizer and scheduler
// type, stage 3, the bfloat16 block), and each must have its row in detail::config_keys():
// - implemented: its sample value reaches the Config (to_json differs), nothing is logged, and
//   the test file the row names exists and names the key;
// - no effect: its sample value is named once at the default level (warn), with the row's
//   message, even when two sources give it; its quiet value (if any) is not named;
// - refused: its sample value is an error naming the key.
// A key the reader reads without a row, or a row the reader never reads, fails here; so does a
// key missing from README.md's table. zero-train and zero-bench take activation_checkpointing
// from the config.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

#include "common/run_command.hpp"
#include "common/temp_dir.hpp"
#include "config/config_keys.hpp"
#include "config/config_reader.hpp"
#include "zero/config/config.hpp"
#include "zero/core/error.hpp"
#include "zero/core/log.hpp"

namespace zero {
namespace {

using nlohmann::json;

// The parameters each scheduler requires (a probe must read cleanly).
json scheduler_probe(std::string_view type) {
  json p = json::object();
  if (type == "WarmupDecayLR" || type == "WarmupCosineLR") p["total_num_steps"] = 5000;
  if (type == "OneCycle") {
    p["cycle_min_lr"] = 0.001;
    p["cycle_max_lr"] = 0.01;
  }
  return {{"type", std::string(type)}, {"params", p}};
}

// Every key the reader asks for, with the first probe document that asked for it.
std::map<std::string, json> asked_keys() {
  std::vector<json> probes;
  for (std::string_view opt : detail::kOptimizerTypes) {
    json o = {{"type", std::string(opt)}, {"params", json::object()}};
    if (opt == "SGD") o["params"]["momentum"] = 0.9;  // so that nesterov's sample is valid
    probes.push_back({{"zero_optimization", {{"stage", 3}}}, {"optimizer", o}});
    for (std::string_view sch : detail::kSchedulerTypes) {
      probes.push_back({{"zero_optimization", {{"stage", 3}}},
                        {"optimizer", o},
                        {"scheduler", scheduler_probe(sch)}});
    }
  }
  probes.push_back({{"zero_optimization", {{"stage", 3}}}, {"bfloat16", {{"enabled", false}}}});
  // The param_groups rules are read through readers over the array's elements, which ask for
  // no rows of their own ("optimizer.param_groups[0].name"): the table's row is the array's.
  probes.push_back(
      {{"optimizer", {{"param_groups", json::parse(R"([{"name": "g", "match": {"max_dims": 1},
                                                       "params": {"lr": 0.1}}])")}}}});
  std::map<std::string, json> out;
  for (const json& doc : probes) {
    std::set<std::string> asked;
    (void)detail::read_config(doc, &asked);
    for (const std::string& k : asked) out.emplace(k, doc);
  }
  return out;
}

// `doc` with key path `path` set to `value`.
json with_key(json doc, const std::string& path, const json& value) {
  json* node = &doc;
  std::size_t start = 0;
  for (std::size_t dot; (dot = path.find('.', start)) != std::string::npos; start = dot + 1) {
    node = &(*node)[path.substr(start, dot - start)];
  }
  (*node)[path.substr(start)] = value;
  return doc;
}

struct Read {
  std::string log;
  std::string error;  // empty: read without error
  std::string json;   // the Config's to_json
};

Read read_logged(const json& doc) {
  Read r;
  ::testing::internal::CaptureStderr();
  try {
    r.json = detail::read_config(doc).to_json();
  } catch (const Error& e) {
    r.error = e.what();
  }
  r.log = ::testing::internal::GetCapturedStderr();
  return r;
}

std::size_t count(const std::string& hay, const std::string& needle) {
  std::size_t n = 0;
  for (std::size_t at = hay.find(needle); at != std::string::npos;
       at = hay.find(needle, at + needle.size())) {
    ++n;
  }
  return n;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class ConfigKeys : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_ = log_level();
    set_log_level(LogLevel::kWarn);  // the default level: what a user sees
  }
  void TearDown() override { set_log_level(saved_); }
  LogLevel saved_ = LogLevel::kWarn;
};

TEST_F(ConfigKeys, EveryKeyTheReaderReadsHasARowAndEveryRowIsRead) {
  const std::map<std::string, json> asked = asked_keys();
  ASSERT_GT(asked.size(), 100u);
  for (const auto& [path, doc] : asked) {
    EXPECT_NE(detail::find_config_key(path), nullptr)
        << "config key '" << path << "' is read by the reader but has no row in "
        << "config/config_keys.cpp (implemented with its test, or its message)";
  }
  std::set<std::string_view> rows;
  for (const detail::ConfigKey& k : detail::config_keys()) {
    EXPECT_TRUE(rows.insert(k.path).second) << "row twice: " << k.path;
    EXPECT_TRUE(asked.count(std::string(k.path)) != 0)
        << "row '" << k.path << "' is never read by the reader";
    EXPECT_FALSE(k.meaning.empty()) << k.path;
  }
}

TEST_F(ConfigKeys, EachKeyHasItsTestedEffectOrItsMessageOrIsRefused) {
  const std::map<std::string, json> asked = asked_keys();
  int implemented = 0, named = 0, refused = 0;
  for (const detail::ConfigKey& k : detail::config_keys()) {
    const std::string path(k.path);
    auto it = asked.find(path);
    if (it == asked.end()) continue;  // reported by the test above
    json context = it->second;
    if (!k.context.empty()) context.merge_patch(json::parse(k.context));
    const json sample = json::parse(k.sample);
    const Read base = read_logged(context);
    ASSERT_TRUE(base.error.empty()) << path << ": " << base.error;
    const Read got = read_logged(with_key(context, path, sample));
    const std::string named_line = "[zero W] config key '" + path + "'";
    switch (k.handling) {
      case detail::KeyHandling::kImplemented: {
        ++implemented;
        ASSERT_TRUE(got.error.empty()) << path << " = " << k.sample << ": " << got.error;
        EXPECT_NE(got.json, base.json) << path << " = " << k.sample << " does not reach the Config";
        EXPECT_EQ(count(got.log, named_line), 0u) << path << " is implemented but named:\n"
                                                  << got.log;
        const std::string test =
            slurp(std::string(ZERO_SOURCE_DIR) + "/" + std::string(k.effect_test));
        EXPECT_FALSE(test.empty()) << path << ": effect test '" << k.effect_test << "' not found";
        const std::string leaf = path.substr(path.rfind('.') + 1);
        EXPECT_NE(test.find(leaf), std::string::npos)
            << path << ": effect test '" << k.effect_test << "' does not name '" << leaf << "'";
        break;
      }
      case detail::KeyHandling::kNoEffect: {
        ++named;
        ASSERT_TRUE(got.error.empty()) << path << " = " << k.sample << ": " << got.error;
        EXPECT_EQ(count(got.log, named_line), 1u) << path << " = " << k.sample << ":\n" << got.log;
        EXPECT_NE(got.log.find(std::string(k.meaning)), std::string::npos)
            << path << ": the message is not the row's:\n"
            << got.log;
        EXPECT_NE(got.log.find("has no effect here"), std::string::npos) << got.log;
        if (!k.quiet.empty()) {
          const Read quiet = read_logged(with_key(context, path, json::parse(k.quiet)));
          EXPECT_EQ(count(quiet.log, named_line), 0u)
              << path << " = " << k.quiet << " behaves as in DeepSpeed but is named:\n"
              << quiet.log;
        }
        break;
      }
      case detail::KeyHandling::kRefused: {
        ++refused;
        EXPECT_NE(got.error.find(path), std::string::npos)
            << path << " = " << k.sample << " must be refused naming the key; got '" << got.error
            << "'";
        if (!k.quiet.empty()) {
          const Read ok = read_logged(with_key(context, path, json::parse(k.quiet)));
          EXPECT_TRUE(ok.error.empty()) << path << " = " << k.quiet << ": " << ok.error;
        }
        break;
      }
    }
  }
  EXPECT_GT(implemented, 0);
  EXPECT_GT(named, 0);
  EXPECT_GT(refused, 0);
}

TEST_F(ConfigKeys, ANoEffectKeyIsNamedOnceWhenSourcesRepeatIt) {
  ConfigBuilder b;
  b.merge_json(R"({"zero_optimization": {"contiguous_gradients": false}})", "file");
  b.set("zero_optimization.contiguous_gradients=false", "--set");
  ::testing::internal::CaptureStderr();
  (void)b.build();
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(count(log, "config key 'zero_optimization.contiguous_gradients'"), 1u) << log;
}

TEST_F(ConfigKeys, AStage3KeyBelowStage3IsNamedOnce) {
  ::testing::internal::CaptureStderr();
  (void)parse_config(R"({"zero_optimization": {"stage": 1, "stage3_max_reuse_distance": 10,
                         "stage3_max_live_parameters": 10}})");
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(count(log, "'zero_optimization.stage3_max_reuse_distance'"), 1u) << log;
  EXPECT_EQ(count(log, "'zero_optimization.stage3_max_live_parameters' applies only with stage 3"),
            1u)
      << log;
}

TEST_F(ConfigKeys, OneCycleMomentumIsDisabledForOptimizersWithoutBetas) {
  for (const char* type : {"SGD", "Adagrad"}) {
    ::testing::internal::CaptureStderr();
    const Config c = parse_config(std::string(R"({"optimizer": {"type": ")") + type +
                                  R"("}, "scheduler": {"type": "OneCycle", "params":
                                  {"cycle_min_lr": 0.001, "cycle_max_lr": 0.01}}})");
    const std::string log = ::testing::internal::GetCapturedStderr();
    EXPECT_FALSE(c.scheduler.cycle_momentum) << type;
    EXPECT_EQ(count(log, "'scheduler.params.cycle_momentum' is disabled for optimizer"), 1u) << log;
  }
  const Config adam = parse_config(
      R"({"optimizer": {"type": "AdamW"}, "scheduler": {"type": "OneCycle", "params":
          {"cycle_min_lr": 0.001, "cycle_max_lr": 0.01}}})");
  EXPECT_TRUE(adam.scheduler.cycle_momentum);
}

TEST_F(ConfigKeys, ReduceScatterFalseAtStage3IsNamed) {
  ::testing::internal::CaptureStderr();
  (void)parse_config(R"({"zero_optimization": {"stage": 3, "reduce_scatter": false}})");
  std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(count(log, "'zero_optimization.reduce_scatter' = false has no effect at stage 3"), 1u)
      << log;
  ::testing::internal::CaptureStderr();
  (void)parse_config(R"({"zero_optimization": {"stage": 2, "reduce_scatter": false}})");
  log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(log.find("reduce_scatter"), std::string::npos) << log;
}

TEST_F(ConfigKeys, ReadmeTableListsEveryKey) {
  const std::string readme = slurp(std::string(ZERO_SOURCE_DIR) + "/docs/config_keys.md");
  ASSERT_FALSE(readme.empty());
  for (const detail::ConfigKey& k : detail::config_keys()) {
    EXPECT_NE(readme.find("| `" + std::string(k.path) + "` |"), std::string::npos)
        << "docs/config_keys.md's key table has no row for '" << k.path << "'";
  }
}

#ifdef ZERO_TRAIN_BIN
// zero-train takes number_checkpoints and cpu_checkpointing from the config (no flag needed),
// and a policy flag keeps the config's cpu_checkpointing.
TEST(ConfigKeysTools, ZeroTrainTakesActivationCheckpointingFromTheConfig) {
  const std::string base = std::string(ZERO_TRAIN_BIN) +
                           " --ranks 1 --steps 1 --layers 4 --dim 32 --heads 2 --seq 16"
                           " --eval-every 0 --no-progress";
  auto r = zero::testing::run_command(base +
                                      " --set activation_checkpointing.number_checkpoints=2"
                                      " --set activation_checkpointing.cpu_checkpointing=true");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("checkpointing number_checkpoints:2 (cpu_checkpointing)"), std::string::npos)
      << r.out;
  r = zero::testing::run_command(base +
                                 " --checkpoint-activations every:2"
                                 " --set activation_checkpointing.cpu_checkpointing=true");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("checkpointing every:2 (cpu_checkpointing)"), std::string::npos) << r.out;
  r = zero::testing::run_command(base);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("checkpointing none;"), std::string::npos) << r.out;
}
#endif

#ifdef ZERO_BENCH_BIN
// zero-bench runs the config's number_checkpoints as policy "config" by default, and its
// measured activation bytes are those of that policy (fewer than without checkpointing).
TEST(ConfigKeysTools, ZeroBenchRunsTheConfigsCheckpointing) {
  const testing::TempDir tmp;  // the report zero-bench writes
  const std::string json_path = tmp.file("zero_keys_bench.json");
  const auto r = zero::testing::run_command(
      std::string(ZERO_BENCH_BIN) +
      " --ranks 1 --steps 2 --stages 0 --offload none --layers 4 --dim 32 --heads 2 --seq 16"
      " --batch 2 --dtype f32 --reduce-dtype f32 --no-progress --json " +
      json_path + " --set activation_checkpointing.number_checkpoints=2");
  ASSERT_EQ(r.status, 0) << r.out;
  const json j = json::parse(slurp(json_path));
  std::set<std::string> policies;
  for (const json& c : j) policies.insert(c["checkpoint"].get<std::string>());
  EXPECT_EQ(policies, (std::set<std::string>{"none", "config"})) << j.dump(1).substr(0, 2000);
}
#endif

}  // namespace
}  // namespace zero
