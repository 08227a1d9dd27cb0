// A save killed at any instant leaves the previous checkpoint loadable: zero-train saving every
// step is killed with SIGKILL at random moments (most of its time is spent saving), then
// `latest` must name a checkpoint whose every file verifies, the step it names never goes
// back, and the next run resumes from it (a failed load would end that run early).
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/temp_dir.hpp"
#include "zero/ckpt/ckpt.hpp"

#ifndef ZERO_TRAIN_BIN
#error "ZERO_TRAIN_BIN must name the zero-train binary"
#endif

extern char** environ;

namespace zero {
namespace {

namespace fs = std::filesystem;

pid_t spawn(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  EXPECT_EQ(posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&fa);
  return pid;
}

std::int64_t latest_step(const std::string& root) {
  const std::string dir = ckpt::resolve(root);
  return std::stoll(fs::path(dir).filename().string().substr(5));
}

bool saving(const std::string& root) {
  for (const auto& e : fs::directory_iterator(root)) {
    if (e.path().filename().string().rfind(".tmp-", 0) == 0) return true;
  }
  return false;
}

TEST(CkptKill, SigkillDuringSavesAlwaysLeavesTheLatestCheckpointLoadable) {
  // Removed at the end whatever the kills left in it (.tmp- directories of interrupted saves).
  const testing::TempDir dir;
  const fs::path root = dir.path();
  std::vector<std::string> base = {ZERO_TRAIN_BIN,
                                   "--layers",
                                   "1",
                                   "--dim",
                                   "32",
                                   "--heads",
                                   "2",
                                   "--seq",
                                   "16",
                                   "--batch",
                                   "2",
                                   "--ranks",
                                   "2",
                                   "--zero-stage",
                                   "2",
                                   "--dtype",
                                   "bf16",
                                   "--eval-every",
                                   "0",
                                   "--steps",
                                   "1000000",
                                   "--save-dir",
                                   root.string(),
                                   "--save-every",
                                   "1",
                                   "--keep",
                                   "2"};
  // The first checkpoint.
  {
    const pid_t pid = spawn(base);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!fs::exists(root / "latest") && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    ASSERT_TRUE(fs::exists(root / "latest"));
  }
  std::vector<std::string> resume = base;
  resume.push_back("--resume");
  std::mt19937_64 rng(2024);
  std::int64_t last = latest_step(root.string());
  int mid_save = 0;
  constexpr int kKills = 24;
  for (int i = 0; i < kKills; ++i) {
    const pid_t pid = spawn(resume);
    // Start-up (corpus, engines, load) takes tens of ms; the kill lands anywhere after.
    const int ms = std::uniform_int_distribution<int>(40, 400)(rng);
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, WNOHANG), 0)
        << "kill " << i << ": zero-train --resume ended by itself (a failed load?)";
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFSIGNALED(status)) << "kill " << i;
    if (saving(root.string())) ++mid_save;
    // `latest` names a complete checkpoint, never an older one than before.
    const std::int64_t now = latest_step(root.string());
    EXPECT_GE(now, last) << "kill " << i;
    last = now;
    const std::vector<std::string> lines = ckpt::inspect(root.string());
    EXPECT_NE(lines.back().find("every checksum verified"), std::string::npos) << "kill " << i;
  }
  std::printf(
      "%d SIGKILLs, %d of them with a save in flight (a .tmp- directory left); latest "
      "step %lld\n",
      kKills, mid_save, static_cast<long long>(last));
  EXPECT_GE(mid_save, kKills / 4) << "the kills should land during saves";
  // And a run resumes from it and finishes.
  std::vector<std::string> finish = base;
  finish[20] = std::to_string(last + 2);  // --steps
  finish.push_back("--resume");
  const pid_t pid = spawn(finish);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(latest_step(root.string()), last + 2);
}

}  // namespace
}  // namespace zero
