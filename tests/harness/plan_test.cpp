// zero-env --calibrate -> zero-plan -> zero-train, as a user runs them: under host budgets that
// exclude configurations, zero-plan's choice fits and the excluded ones are named with their
// shortfall; the config it writes loads in zero-train, which runs at the same budget (the
// tracker's cap) with its peak per tier within the plan's bytes per rank.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "common/run_command.hpp"
#include "common/temp_dir.hpp"

#ifndef ZERO_TRAIN_BIN
#error "ZERO_TRAIN_BIN must name the zero-train binary"
#endif
#ifndef ZERO_PLAN_BIN
#error "ZERO_PLAN_BIN must name the zero-plan binary"
#endif
#ifndef ZERO_ENV_BIN
#error "ZERO_ENV_BIN must name the zero-env binary"
#endif

namespace {

using json = nlohmann::json;
using zero::testing::CmdResult;
using zero::testing::run_command;

const std::string kModel = " --ranks 2 --layers 2 --dim 64 --seq 32";

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

class Plan : public ::testing::Test {
 protected:
  // One directory for the suite: the profile is measured once, the tests read it.
  static void SetUpTestSuite() {
    tmp_ = new zero::testing::TempDir();
    dir_ = tmp_->path();
    const CmdResult r = run_command(std::string(ZERO_ENV_BIN) +
                                    " --calibrate --gpt --layers 2 --dim 64 --seq 32 --batch 4 "
                                    "--nvme-path " +
                                    dir_ + " --out " + dir_ + "/machine.json");
    ASSERT_EQ(r.status, 0) << r.out;
  }
  static void TearDownTestSuite() {
    delete tmp_;
    tmp_ = nullptr;
  }
  static inline zero::testing::TempDir* tmp_ = nullptr;
  static inline std::string dir_;
};

TEST_F(Plan, TheProfileReadsBackWithEveryFigure) {
  const json p = read_json(dir_ + "/machine.json");
  EXPECT_GT(p["memory"]["copy_bytes_per_s"].get<double>(), 0);
  EXPECT_GT(p["nvme"]["read_bytes_per_s"].get<double>(), 0);
  EXPECT_GT(p["trainer"]["flops_per_s"].get<double>(), 0);
  EXPECT_GE(p["collectives"].size(), 9u);
}

TEST_F(Plan, TheChoiceFitsTheExcludedAreNamedAndTheWrittenConfigRunsWithinThePlan) {
  struct Budget {
    const char* flag;
    double mib;
  };
  for (const Budget b : {Budget{"8M", 8.0}, Budget{"6.5M", 6.5}}) {
    const std::string budget = b.flag;
    SCOPED_TRACE(budget);
    const std::string report = dir_ + "/report.json", config = dir_ + "/chosen.json";
    const CmdResult plan =
        run_command(std::string(ZERO_PLAN_BIN) + " --profile " + dir_ + "/machine.json" + kModel +
                    " --batch 4 --nvme-path " + dir_ + " --host-memory " + budget + " --report " +
                    report + " --write-config " + config);
    ASSERT_EQ(plan.status, 0) << plan.out;
    for (const char* needle :
         {"chosen: ", "predicted step: ", "runner-ups:", "does not fit by ", "fits, slower by "}) {
      EXPECT_NE(plan.out.find(needle), std::string::npos) << needle << "\n" << plan.out;
    }
    const json r = read_json(report);
    const int chosen = r["chosen"].get<int>();
    ASSERT_GE(chosen, 0);
    const json& c = r["candidates"][chosen];
    EXPECT_TRUE(c["fits"].get<bool>());
    const std::size_t host_budget = r["budget"]["host"].get<std::size_t>();
    EXPECT_LE(c["need"]["host"].get<std::size_t>(), host_budget);
    std::size_t excluded = 0;
    for (const json& k : r["candidates"]) {
      if (k["fits"].get<bool>()) {
        EXPECT_LE(k["need"]["host"].get<std::size_t>(), host_budget) << k["label"];
        EXPECT_GE(k["time"]["total"].get<double>(), c["time"]["total"].get<double>());
        continue;
      }
      ++excluded;
      EXPECT_GT(k["need"]["host"].get<std::size_t>(), host_budget) << k["label"];
      EXPECT_EQ(k["why"].get<std::string>().rfind("does not fit by ", 0), 0u) << k["why"];
    }
    EXPECT_GT(excluded, 0u);

    // The written config in zero-train at the same budget (per rank; the tracker's cap).
    const std::string metrics = dir_ + "/metrics.jsonl";
    const CmdResult train = run_command(
        std::string(ZERO_TRAIN_BIN) + kModel + " --config " + config +
        " --steps 3 --no-progress --memory-budget " +
        std::to_string(static_cast<std::size_t>(b.mib * 1048576 / 2)) + " --metrics " + metrics);
    ASSERT_EQ(train.status, 0) << train.out;
    std::ifstream in(metrics);
    int lines = 0;
    for (std::string line; std::getline(in, line);) {
      const json m = json::parse(line);
      const json& peak = m["peak_bytes"];
      ++lines;
      // The CPU device's tier is host memory: the plan's device bytes (with the trainer's).
      EXPECT_LE(peak["device"].get<std::size_t>() + peak["host"].get<std::size_t>(),
                c["per_rank"]["device"].get<std::size_t>())
          << line;
      EXPECT_LE(peak["pinned"].get<std::size_t>(), c["per_rank"]["pinned"].get<std::size_t>());
      EXPECT_LE(peak["nvme"].get<std::size_t>(), c["per_rank"]["nvme"].get<std::size_t>());
    }
    EXPECT_EQ(lines, 6);  // 3 steps x 2 ranks
  }
}

TEST_F(Plan, AUnitsFileIsPlannedAndABadOneNamesTheKey) {
  const std::string units = dir_ + "/units.json";
  {
    std::ofstream out(units);
    out << R"({"units": [{"name": "embed", "params": [{"name": "w", "shape": [1000, 64]}]},
                         {"name": "block0", "params": [{"name": "w", "shape": [64, 256]},
                                                       {"name": "b", "shape": [256]}]}],
               "activation_bytes": 1048576, "tokens_per_micro_step": 512})";
  }
  const std::string plan = std::string(ZERO_PLAN_BIN) + " --profile " + dir_ + "/machine.json" +
                           " --ranks 2 --stages 0,2 --units ";
  const CmdResult ok = run_command(plan + units);
  ASSERT_EQ(ok.status, 0) << ok.out;
  EXPECT_NE(ok.out.find("chosen: stage "), std::string::npos) << ok.out;
  EXPECT_NE(ok.out.find("predicted step: "), std::string::npos) << ok.out;
  {
    std::ofstream out(units, std::ios::trunc);
    out << R"({"units": [{"name": "embed", "params": [{"name": "w", "shape": [1000, 0]}]}]})";
  }
  const CmdResult bad = run_command(plan + units);
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.out.find("units[0].params[0].shape"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find(units), std::string::npos) << bad.out;
}

}  // namespace
