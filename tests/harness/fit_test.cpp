// Budgets at start (zero/engine/fit.hpp, apps/gpt/gpt_fit.hpp): zero-train and zero-bench refuse a
// run that cannot fit before any rank allocates, naming the tier, the shortfall and a
// configuration that fits — and that configuration runs within the same budget; inside a 1 GiB
// memory cgroup with no --memory-budget, a run larger than the machine is refused at start with
// exit status 2 and the cgroup named, instead of the kernel's OOM killer (exit 137, nothing on
// stderr).
#include <gtest/gtest.h>

#include <string>

#include "common/memory_cgroup.hpp"
#include "common/run_command.hpp"

#ifndef ZERO_TRAIN_BIN
#error "ZERO_TRAIN_BIN must name the zero-train binary"
#endif
#ifndef ZERO_BENCH_BIN
#error "ZERO_BENCH_BIN must name the zero-bench binary"
#endif

namespace {

using zero::testing::CmdResult;
using zero::testing::run_command;

// The flags after "Fits instead with: " up to " (needs".
std::string suggested_flags(const std::string& out) {
  const std::string key = "Fits instead with: ";
  const std::size_t a = out.find(key);
  if (a == std::string::npos) return {};
  const std::size_t b = out.find(" (needs", a);
  return b == std::string::npos ? std::string() : out.substr(a + key.size(), b - a - key.size());
}

TEST(Fit, ZeroTrainRefusesAtStartAndWhatItSuggestsRuns) {
  const std::string base =
      std::string(ZERO_TRAIN_BIN) + " --ranks 2 --steps 2 --memory-budget 33M --no-progress";
  const CmdResult r = run_command(base);
  EXPECT_EQ(r.status, 2) << r.out;
  for (const char* needle : {"zero-train: out of memory: the run does not fit: host memory: needs ",
                             "(--memory-budget 33.00 MiB per rank x 2 ranks): short by ",
                             "Per rank: params16 ", "activations ", "Fits instead with: "}) {
    EXPECT_NE(r.out.find(needle), std::string::npos) << needle << "\n" << r.out;
  }
  // Nothing ran: no step line.
  EXPECT_EQ(r.out.find("step 1"), std::string::npos) << r.out;
  const std::string flags = suggested_flags(r.out);
  ASSERT_FALSE(flags.empty()) << r.out;
  // The suggestion within the same budget: the tracker would stop any allocation past it.
  const CmdResult ok = run_command(base + " " + flags);
  EXPECT_EQ(ok.status, 0) << flags << "\n" << ok.out;
  EXPECT_NE(ok.out.find("memory (all tiers but nvme)"), std::string::npos) << ok.out;
}

TEST(Fit, ZeroBenchRefusesEveryConfigurationThatCannotFitAndWhatItSuggestsRuns) {
  const std::string base = std::string(ZERO_BENCH_BIN) +
                           " --ranks 2 --steps 2 --layers 2 --dim 64 --seq 32 --batch 2"
                           " --offload none --no-progress --memory-budget 3M";
  const CmdResult r = run_command(base + " --stages 0,3 --checkpoint none");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("configurations that cannot fit"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("stage 0"), std::string::npos) << r.out;
  const std::string flags = suggested_flags(r.out);
  ASSERT_FALSE(flags.empty()) << r.out;
  const CmdResult ok = run_command(base + " " + flags);
  EXPECT_EQ(ok.status, 0) << flags << "\n" << ok.out;
}

TEST(Fit, InsideAOneGiBMemoryCgroupALargerRunIsRefusedAtStart) {
  const zero::testing::MemoryCgroup cg(std::size_t{1} << 30);
  if (!cg.usable()) GTEST_SKIP() << "no memory cgroup to run in: " << cg.why();
  // 24 x 1024: ~300M parameters, 11 GiB for two ranks at stage 0; nothing fits 1 GiB.
  const CmdResult r = cg.run(std::string(ZERO_TRAIN_BIN) +
                             " --ranks 2 --layers 24 --dim 1024 --heads 8 --steps 2 --no-progress");
  EXPECT_EQ(r.status, 2) << "(137 / -1: killed by the kernel)\n" << r.out;
  EXPECT_NE(r.out.find("the run does not fit: host memory"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("memory cgroup " + cg.dir() + ": limit 1.00 GiB"), std::string::npos)
      << r.out;
}

}  // namespace
