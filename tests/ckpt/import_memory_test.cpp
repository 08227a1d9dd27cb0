// The import's memory, measured: a file 12x its largest tensor imported into in-process ranks in
// a fresh process (this executable re-run with ZERO_IMPORT_RSS set, so no earlier test's peak
// counts), its resident set read from /proc/self/status (VmRSS, and VmHWM: the peak):
//   the bound  VmHWM after the import - VmRSS at the process's start
//                      < the shards + 2 x the largest tensor, the shards being what the engines
//                      hold: their tracked bytes, or the resident growth while they were built
//                      where that is more (it adds the ranks' threads and communicator, ~2 MiB
//                      for 4 ranks);
//   the import's own   VmHWM after it - VmRSS right before it (the engines are resident by then:
//                      their state is zeroed at construction) < 2 x the largest tensor.
// Large blocks are mmap'ed (M_MMAP_THRESHOLD 64 KiB) so that a temporary freed before the read
// still counts: the kernel records the peak when a mapping goes. "The largest tensor" is
// counted in f32 bytes (4 MiB here), the precision of the master the import fills. Reading a
// whole file would add 48 MiB (F32) or 24 MiB (BF16).
#include <gtest/gtest.h>

#include <malloc.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "ckpt/ckpt_runs.hpp"
#include "ckpt/import_files.hpp"
#include "common/run_command.hpp"

namespace zero {
namespace {

constexpr int kTensors = 12;
constexpr std::int64_t kRows = 1024, kCols = 1024;
constexpr std::size_t kLargestF32 = kRows * kCols * 4;

std::size_t status_kb(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) return std::stoul(line.substr(std::strlen(key) + 1)) * 1024;
  }
  return 0;
}

double mib(std::size_t b) { return static_cast<double>(b) / (1 << 20); }

std::vector<UnitSpec> big_model() {
  std::vector<UnitSpec> units;
  for (int k = 0; k < kTensors; ++k)
    units.push_back({"t" + std::to_string(k), {{"w", {kRows, kCols}}}});
  return units;
}

// The child: ZERO_IMPORT_RSS = "<file> <stage> <ranks> <working dtype>".
TEST(ImportMemory, Child) {
  const char* env = std::getenv("ZERO_IMPORT_RSS");
  if (env == nullptr) GTEST_SKIP() << "run by ImportMemory.PeakRss in a fresh process";
  std::istringstream args(env);
  std::string file, wname;
  int stage = 0, n = 1;
  args >> file >> stage >> n >> wname;
  const Config cfg = testing::import_config(stage, parse_dtype(wname));
  ::mallopt(M_MMAP_THRESHOLD, 64 << 10);
  const std::size_t base = status_kb("VmRSS:");
  std::vector<std::size_t> engine_bytes(static_cast<std::size_t>(n));
  std::size_t before = 0, peak = 0;
  ThreadGroup::run(n, [&](Communicator& c) {
    Engine e(c, cfg);
    testing::add_units(e, big_model());
    (void)e.unit_step_numel(0);  // laid out
    engine_bytes[static_cast<std::size_t>(c.rank())] = e.memory_report().memory.current;
    c.barrier();
    if (c.rank() == 0) before = status_kb("VmRSS:");
    c.barrier();
    ckpt::import_safetensors(e, file);
    c.barrier();
    if (c.rank() == 0) peak = status_kb("VmHWM:");
  });
  std::size_t shards = 0;
  for (std::size_t b : engine_bytes) shards += b;
  std::printf(
      "[import RSS] stage %d, N = %d, %s run, %s: largest tensor %.1f MiB (f32), the engines (the "
      "shards) %.1f MiB tracked, %.1f MiB resident; peak - process start %.1f MiB (bound %.1f); "
      "peak - resident before the "
      "import %.1f MiB (bound %.1f)\n",
      stage, n, wname.c_str(), file.c_str(), mib(kLargestF32), mib(shards), mib(before - base),
      mib(peak - base), mib(std::max(shards, before - base) + 2 * kLargestF32), mib(peak - before),
      mib(2 * kLargestF32));
  EXPECT_LT(peak - base, std::max(shards, before - base) + 2 * kLargestF32);
  EXPECT_LT(peak - before, 2 * kLargestF32);
}

TEST(ImportMemory, PeakRssBelowTwiceTheLargestTensorPlusTheShards) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "resident memory is not the program's under AddressSanitizer";
#endif
  if (std::getenv("ZERO_IMPORT_RSS") != nullptr) GTEST_SKIP() << "the child";
  testing::TempDir dir("import-rss");
  for (DType dt : {DType::kF32, DType::kBF16}) {
    std::vector<std::pair<std::string, testing::RawTensor>> ts;
    for (int k = 0; k < kTensors; ++k) {
      std::vector<float> v(static_cast<std::size_t>(kRows * kCols));
      for (std::size_t i = 0; i < v.size(); ++i)
        v[i] = static_cast<float>((i * 7 + k) % 1000) * 1e-3f;
      ts.push_back({"t" + std::to_string(k) + ".w", testing::encode(v, {kRows, kCols}, dt)});
    }
    testing::write_st(dir.path() + "/" + std::string(to_string(dt)) + ".safetensors", ts);
  }
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  // (file, stage, ranks, working dtype): every rank reading whole units; 4 ranks of shards.
  for (const char* run : {"f32 0 1 f32", "bf16 3 4 bf16", "f32 2 2 bf16"}) {
    std::istringstream a(run);
    std::string f, rest;
    a >> f;
    std::getline(a, rest);
    const std::string arg = dir.path() + "/" + f + ".safetensors" + rest;
    const testing::CmdResult r = testing::run_command("ZERO_IMPORT_RSS='" + arg + "' " + self +
                                                      " --gtest_filter=ImportMemory.Child");
    EXPECT_EQ(r.status, 0) << r.out;
    const std::size_t at = r.out.find("[import RSS]");
    ASSERT_NE(at, std::string::npos) << r.out;
    std::printf("%s", r.out.substr(at, r.out.find('\n', at) - at + 1).c_str());
  }
}

}  // namespace
}  // namespace zero
