// NVMe faults end in errors and leave nothing behind. A child process (nvme_train_child) trains
// with its optimizer state in swap files; the test signals it (SIGTERM, SIGINT, SIGKILL), fills
// its disk, takes its directory away before the start and its data away mid-run, and plants the
// names a killed run of an older version leaves: each is an error naming the operation (or a
// death by the signal), with the time to exit measured and no file left in the directory. Where
// the test may mount a tmpfs, the directory is one, and its used blocks are checked to be back
// at zero: the kernel, not a name in a listing, says the data is gone. Also: an aio thread that
// the kernel refuses (RLIMIT_NPROC) is an error naming the pool and the thread, not an abort.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <regex>
#include <string>
#include <vector>

#include "common/load_slack.hpp"
#include "common/temp_dir.hpp"
#include "offload/aio.hpp"
#include "offload/nvme_swapper.hpp"
#include "zero/core/error.hpp"

extern char** environ;

namespace zero {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// ---- a scratch directory: a tmpfs of `size` where mount is permitted (root here), else a plain
// directory on the work disk; the test's own directory (tests/common/temp_dir.hpp) either way.
// Unmounted and removed in every path out of the test.
class ScratchDir {
 public:
  explicit ScratchDir(const char* size) : path_(dir_.path()) {
    if (size != nullptr) {
      const std::string opts = std::string("size=") + size + ",mode=0700";
      mounted_ = ::mount("tmpfs", path_.c_str(), "tmpfs", 0, opts.c_str()) == 0;
      why_ = mounted_ ? "tmpfs " + opts : std::string("mount refused: ") + std::strerror(errno);
    }
  }
  // Unmounted here; dir_ then removes the directory.
  ~ScratchDir() {
    if (mounted_ && ::umount2(path_.c_str(), 0) != 0) ::umount2(path_.c_str(), MNT_DETACH);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::string& path() const { return path_; }
  bool mounted() const { return mounted_; }
  const std::string& why() const { return why_; }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(path_)) out.push_back(e.path().filename());
    std::sort(out.begin(), out.end());
    return out;
  }
  // Bytes in use on the tmpfs (unlinked files still open included).
  std::size_t used_bytes() const {
    struct statvfs v {};
    EXPECT_EQ(::statvfs(path_.c_str(), &v), 0);
    return static_cast<std::size_t>(v.f_blocks - v.f_bfree) * v.f_frsize;
  }

 private:
  testing::TempDir dir_;
  std::string path_;
  bool mounted_ = false;
  std::string why_ = "plain directory";
};

// ---- the child: nvme_train_child with pipes on stdin, stdout and stderr

class Child {
 public:
  explicit Child(std::vector<std::string> args) {
    int in[2], out[2], err[2];
    EXPECT_EQ(::pipe(in), 0);
    EXPECT_EQ(::pipe(out), 0);
    EXPECT_EQ(::pipe(err), 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_adddup2(&fa, err[1], 2);
    for (int fd : {in[0], in[1], out[0], out[1], err[0], err[1]}) {
      posix_spawn_file_actions_addclose(&fa, fd);
    }
    // A trainer started from a shell has SIGINT and SIGTERM at their defaults; a test run in the
    // background may have inherited SIGINT ignored.
    posix_spawnattr_t at;
    posix_spawnattr_init(&at);
    sigset_t dflt, none;
    sigemptyset(&dflt);
    sigaddset(&dflt, SIGINT);
    sigaddset(&dflt, SIGTERM);
    sigemptyset(&none);
    posix_spawnattr_setsigdefault(&at, &dflt);
    posix_spawnattr_setsigmask(&at, &none);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
    args.insert(args.begin(), NVME_TRAIN_CHILD);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    start_ = Clock::now();
    const int rc = ::posix_spawn(&pid_, NVME_TRAIN_CHILD, &fa, &at, argv.data(), environ);
    EXPECT_EQ(rc, 0) << NVME_TRAIN_CHILD << ": " << std::strerror(rc);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    ::close(in[0]);
    ::close(out[1]);
    ::close(err[1]);
    in_ = in[1];
    out_ = out[0];
    err_ = err[0];
  }
  ~Child() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    for (int fd : {in_, out_, err_}) ::close(fd);
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& out() const { return out_text_; }
  const std::string& err() const { return err_text_; }

  // Reads the child's output until a stdout line starts with `prefix` (returned) or the child
  // closes stdout or `timeout_s` passes ("" then).
  std::string wait_line(const std::string& prefix, double timeout_s = 120) {
    const auto t0 = Clock::now();
    for (;;) {
      for (std::size_t at = 0; (at = out_text_.find('\n', scanned_)) != std::string::npos;) {
        const std::string line = out_text_.substr(scanned_, at - scanned_);
        scanned_ = at + 1;
        if (line.rfind(prefix, 0) == 0) return line;
      }
      if (ms_since(t0) > timeout_s * 1000 || !pump(100)) return "";
    }
  }
  void say(const std::string& line) {
    const std::string l = line + "\n";
    EXPECT_EQ(::write(in_, l.data(), l.size()), static_cast<ssize_t>(l.size()));
  }
  // Waits for the exit (SIGKILL after timeout_s); the wait status.
  int wait_exit(double timeout_s = 120) {
    const auto t0 = Clock::now();
    int status = 0;
    for (;;) {
      pump(20);
      const pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) break;
      if (ms_since(t0) > timeout_s * 1000) {
        ADD_FAILURE() << "child " << pid_ << " still running after " << timeout_s << " s";
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        break;
      }
    }
    reaped_ = true;
    while (pump(0)) {
    }
    return status;
  }
  double ms_since_start() const { return ms_since(start_); }

  // The child's swap files as /proc/<pid>/fd shows them: "<dir>/<name> (deleted)" -> fd path.
  std::vector<std::pair<std::string, std::string>> open_swap_files(const std::string& dir) const {
    std::vector<std::pair<std::string, std::string>> found;
    const std::string fds = "/proc/" + std::to_string(pid_) + "/fd";
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(fds, ec)) {
      const std::string t = fs::read_symlink(e.path(), ec).string();
      if (!ec && t.rfind(dir + "/zero-", 0) == 0) found.emplace_back(t, e.path().string());
    }
    return found;
  }

 private:
  // Moves what the child wrote into out_text_ / err_text_; false once both pipes are closed.
  bool pump(int timeout_ms) {
    pollfd p[2] = {{out_open_ ? out_ : -1, POLLIN, 0}, {err_open_ ? err_ : -1, POLLIN, 0}};
    if (!out_open_ && !err_open_) return false;
    if (::poll(p, 2, timeout_ms) <= 0) return true;
    char buf[4096];
    for (int k = 0; k < 2; ++k) {
      if ((p[k].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      const ssize_t n = ::read(k == 0 ? out_ : err_, buf, sizeof buf);
      if (n > 0) {
        (k == 0 ? out_text_ : err_text_).append(buf, static_cast<std::size_t>(n));
      } else {
        (k == 0 ? out_open_ : err_open_) = false;
      }
    }
    return true;
  }

  pid_t pid_ = -1;
  int in_ = -1, out_ = -1, err_ = -1;
  bool out_open_ = true, err_open_ = true, reaped_ = false;
  std::string out_text_, err_text_;
  std::size_t scanned_ = 0;
  Clock::time_point start_;
};

std::string status_text(int status) {
  if (WIFEXITED(status)) return "exit " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("killed by ") + strsignal(WTERMSIG(status));
  return "status " + std::to_string(status);
}

// ---- signals during a run

class NvmeSignal : public ::testing::TestWithParam<int> {};

// Stage 3 at 2 ranks: four swap files (optimizer and parameter shards of each rank), open and
// already nameless while the run goes; the signal ends the process at once (the library has no
// handler), and the kernel frees the files with it: no name, and on the tmpfs 0 bytes in use.
TEST_P(NvmeSignal, EndsTheRunAtOnceAndLeavesNoFile) {
  const int sig = GetParam();
  ScratchDir dir("64m");
  std::printf("[ mode ] %s: %s\n", dir.path().c_str(), dir.why().c_str());
  Child child({"--dir", dir.path(), "--stage", "3", "--ranks", "2", "--chunk", "32"});
  EXPECT_EQ(child.wait_line("handlers"), "handlers SIGINT=default SIGTERM=default") << child.err();
  ASSERT_EQ(child.wait_line("step 3"), "step 3") << child.err();
  const auto files = child.open_swap_files(dir.path());
  std::size_t bytes = 0;
  for (const auto& [target, fd] : files) {
    EXPECT_NE(target.find(" (deleted)"), std::string::npos) << target;
    EXPECT_NE(target.find("-" + std::to_string(child.pid()) + "-"), std::string::npos) << target;
    bytes += fs::file_size(fd);
  }
  EXPECT_EQ(files.size(), 4u) << "optim-r0, optim-r1, param-r0, param-r1";
  EXPECT_GT(bytes, 0u);
  EXPECT_TRUE(dir.names().empty()) << "names in the directory while the run goes";
  if (dir.mounted()) {
    EXPECT_GE(dir.used_bytes(), bytes);
  }
  const auto t0 = Clock::now();
  ASSERT_EQ(::kill(child.pid(), sig), 0);
  const int status = child.wait_exit(30);
  const double exit_ms = ms_since(t0);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == sig) << status_text(status);
  EXPECT_LT(exit_ms, 1000 * testing::load_slack_s());  // the run goes on until killed
  EXPECT_TRUE(dir.names().empty());
  // The last reference may be dropped just after the exit: io_uring tears its ring down (and
  // with it the files of requests in flight) in a kernel worker. Waited for, up to the slack.
  double freed_ms = -1;
  if (dir.mounted()) {
    const double wait_ms = 1000 * testing::load_slack_s();
    while (dir.used_bytes() != 0 && ms_since(t0) < exit_ms + wait_ms) ::usleep(1000);
    EXPECT_EQ(dir.used_bytes(), 0u)
        << "the unlinked files' blocks not freed " << wait_ms / 1000 << " s after the exit";
    freed_ms = ms_since(t0);
  }
  std::printf("[ %s ] %zu swap files (%zu bytes) open; time to exit %.1f ms; %s; left: %zu names",
              strsignal(sig), files.size(), bytes, exit_ms, status_text(status).c_str(),
              dir.names().size());
  if (dir.mounted())
    std::printf(", %zu bytes in use %.1f ms after the signal", dir.used_bytes(), freed_ms);
  std::printf("\n");
}

INSTANTIATE_TEST_SUITE_P(Fault, NvmeSignal, ::testing::Values(SIGTERM, SIGINT, SIGKILL),
                         [](const auto& info) {
                           return std::string(info.param == SIGTERM  ? "SIGTERM"
                                              : info.param == SIGINT ? "SIGINT"
                                                                     : "SIGKILL");
                         });

// ---- names a killed run left behind

// A pid no process has: a child that has exited and been reaped.
pid_t dead_pid() {
  const pid_t p = ::fork();
  if (p == 0) ::_exit(0);
  ::waitpid(p, nullptr, 0);
  return p;
}

void touch(const std::string& path, std::size_t bytes = 0) {
  std::ofstream(path) << std::string(bytes, 'x');
}

// What an older version killed mid-run, or this one killed between create and unlink, leaves:
// a swap-file name. The next run in the directory removes those of dead owners and of reused
// pids, and names each in a warning; the file of a live process and names not ours stay.
TEST(NvmeFault, StaleSwapFilesAreNamedAndThoseOfDeadOwnersRemoved) {
  ScratchDir dir(nullptr);
  const std::string d = dir.path();
  const pid_t dead = dead_pid();
  const std::string of_dead = d + "/zero-optim-r0-" + std::to_string(dead) + "-0.swap";
  touch(of_dead, 8192);
  // pid 1 runs, but started long after this file was written: a reused pid.
  const std::string of_reused = d + "/zero-param-r1-1-3.swap";
  touch(of_reused, 4096);
  const timespec old[2] = {{1000000000, 0}, {1000000000, 0}};  // 2001-09-09
  ASSERT_EQ(::utimensat(AT_FDCWD, of_reused.c_str(), old, 0), 0);
  const std::string of_live = d + "/zero-optim-r0-" + std::to_string(::getpid()) + "-0.swap";
  touch(of_live, 4096);
  for (const char* other :
       {"zero-notes.txt", "other.swap", "zero-optim-r0-x-0.swap", "zero--1-0.swap"}) {
    touch(d + "/" + other);
  }
  Child child({"--dir", d, "--steps", "2"});
  const int status = child.wait_exit();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status_text(status) << child.err();
  const std::string& err = child.err();
  const std::string key = "' in config key 'zero_optimization.offload_optimizer.nvme_path': ";
  EXPECT_NE(err.find("removed stale swap file '" + of_dead + key + "its owner, process " +
                     std::to_string(dead) + ", is not running"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("removed stale swap file '" + of_reused + key +
                     "it is older than the process 1 now running (the pid was reused)"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("swap file '" + of_live + key + "it belongs to the running process " +
                     std::to_string(::getpid()) + "; left in place"),
            std::string::npos)
      << err;
  for (const char* other : {"zero-notes.txt", "other.swap", "zero-optim-r0-x-0.swap"}) {
    EXPECT_EQ(err.find(other), std::string::npos) << other << " named: " << err;
  }
  const std::vector<std::string> expect = {
      "other.swap", "zero--1-0.swap", "zero-notes.txt",
      "zero-optim-r0-" + std::to_string(::getpid()) + "-0.swap", "zero-optim-r0-x-0.swap"};
  EXPECT_EQ(dir.names(), expect);
  std::printf("[ stale ] the run named:\n%s", err.c_str());
  // The scan alone, in this process: its own names (between create and unlink) are skipped.
  const std::string of_mine = d + "/zero-optim-r7-" + std::to_string(::getpid()) + "-0.swap";
  fs::remove(of_live);
  touch(of_mine);
  touch(of_dead);
  const auto found = offload::clean_stale_swap_files(d);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].path, of_dead);
  EXPECT_EQ(found[0].owner, dead);
  EXPECT_TRUE(found[0].removed);
  EXPECT_TRUE(fs::exists(of_mine));
}

// ---- the directory or the data taken away

TEST(NvmeFault, DirectoryRemovedBeforeTheStartIsAnErrorNamingThePath) {
  ScratchDir dir(nullptr);
  const std::string gone = dir.path() + "/swap";
  fs::create_directory(gone);
  fs::remove(gone);
  Child child({"--dir", gone, "--steps", "2"});
  const int status = child.wait_exit();
  const double exit_ms = child.ms_since_start();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << status_text(status);
  EXPECT_NE(
      child.err().find("I/O: config key 'zero_optimization.offload_optimizer.nvme_path' = \"" +
                       gone + "\": No such file or directory"),
      std::string::npos)
      << child.err();
  EXPECT_FALSE(fs::exists(gone));
  EXPECT_TRUE(dir.names().empty());
  std::printf("[ dir removed ] %s in %.1f ms: %s", status_text(status).c_str(), exit_ms,
              child.err().c_str());
}

// With unlinked files "the file removed" cannot happen to a name; what a user (or a failing
// disk) can still do is take the data: the swap file truncated through /proc/<pid>/fd/<n>
// between two steps. The next step's read stops at the end of the file: an error naming the
// read, the file, the offset and the bytes (corruption), never zeros trained on. Truncated and
// then written past the end again (the size back, a hole where the data was): the read finds
// the hole before it reads zeros from it.
TEST(NvmeFault, DataLostMidRunIsAReadErrorNotZeros) {
  for (const bool written_past : {false, true}) {
    for (const char* engine : {"io_uring", "threads"}) {
      ScratchDir dir(nullptr);
      Child child({"--dir", dir.path(), "--steps", "6", "--pause-after", "2", "--aio", engine});
      ASSERT_EQ(child.wait_line("paused"), "paused") << child.err();
      const auto files = child.open_swap_files(dir.path());
      ASSERT_EQ(files.size(), 1u);
      const std::size_t size = fs::file_size(files[0].second);
      ASSERT_GT(size, 8192u);
      ASSERT_EQ(::truncate(files[0].second.c_str(), static_cast<off_t>(size / 2)), 0);
      if (written_past) {
        const int fd = ::open(files[0].second.c_str(), O_WRONLY);
        ASSERT_GE(fd, 0);
        const std::string page(4096, 'z');
        EXPECT_EQ(::pwrite(fd, page.data(), page.size(), static_cast<off_t>(size - page.size())),
                  static_cast<ssize_t>(page.size()));
        ::close(fd);
        EXPECT_EQ(fs::file_size(files[0].second), size);
      }
      const auto t0 = Clock::now();
      child.say("go");
      const int status = child.wait_exit();
      const double exit_ms = ms_since(t0);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << status_text(status);
      const std::string file =
          dir.path() + "/zero-optim-r0-" + std::to_string(child.pid()) + "-0\\.swap";
      const std::regex expect("corruption: NVMe swap: read of [0-9]+ bytes at offset [0-9]+ of '" +
                              file + " \\(unlinked; fd [0-9]+\\)'" +
                              (written_past
                                   ? ": the file has a hole at offset " + std::to_string(size / 2)
                                   : std::string(" stopped at offset [0-9]+: end of file")));
      EXPECT_TRUE(std::regex_search(child.err(), expect)) << child.err();
      EXPECT_EQ(child.out().find("step 3"), std::string::npos) << "a step trained on lost data";
      EXPECT_TRUE(dir.names().empty());
      std::printf("[ data lost%s, %s ] %zu -> %zu bytes; %s %.1f ms after the resume: %s",
                  written_past ? " and written past" : "", engine, size, size / 2,
                  status_text(status).c_str(), exit_ms, child.err().c_str());
    }
  }
}

// ---- disk full

// A tmpfs of 64 KiB where mount is permitted: the swap file of ~400 KiB runs out of space
// (ENOSPC). Otherwise RLIMIT_FSIZE at 20000 bytes (EFBIG): a real kernel failure either way.
TEST(NvmeFault, DiskFullIsAnErrorNamingTheWrite) {
  for (const char* engine : {"io_uring", "threads"}) {
    ScratchDir dir("64k");
    std::vector<std::string> args = {"--dir", dir.path(), "--stage", "1",     "--chunk",
                                     "16",    "--steps",  "3",       "--aio", engine};
    if (!dir.mounted()) args.insert(args.end(), {"--fsize", "20000"});
    std::printf("[ mode ] disk full by %s (%s)\n",
                dir.mounted() ? "a full tmpfs, ENOSPC" : "RLIMIT_FSIZE, EFBIG", dir.why().c_str());
    Child child(args);
    const int status = child.wait_exit();
    const double exit_ms = child.ms_since_start();
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << status_text(status);
    const std::regex expect("I/O: NVMe swap: write of [0-9]+ bytes at offset [0-9]+ of '" +
                            dir.path() + "/zero-optim-r0-" + std::to_string(child.pid()) +
                            "-0\\.swap \\(unlinked; fd [0-9]+\\)' failed at offset [0-9]+: " +
                            (dir.mounted() ? "No space left on device \\(errno 28\\)"
                                           : "File too large \\(errno 27\\)"));
    EXPECT_TRUE(std::regex_search(child.err(), expect)) << child.err();
    EXPECT_TRUE(dir.names().empty());
    if (dir.mounted()) {
      EXPECT_EQ(dir.used_bytes(), 0u);
    }
    std::printf("[ disk full, %s ] %s in %.1f ms: %s", engine, status_text(status).c_str(), exit_ms,
                child.err().c_str());
  }
}

// ---- a thread the kernel refuses

// Child (gtest's threadsafe death test) as nobody, so RLIMIT_NPROC applies (root is exempt):
// with the limit at the threads it has, the io_uring reaper cannot start; two more, and the
// pool of 8 fails at its third worker or before. Each: an error naming the engine and the thread,
// no thread left behind, and the queue works once the limit is lifted. Exit 3 when all held.
int thread_count() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator("/proc/self/task")) ++n;
  return n;
}

TEST(NvmeFaultDeathTest, AThreadThatCannotStartIsAnErrorNamingThePoolAndThread) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto run = [] {
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) std::_Exit(5);
    rlimit lim{};
    ::getrlimit(RLIMIT_NPROC, &lim);
    const rlim_t free_limit = lim.rlim_cur;
    const int before = thread_count();
    bool ok = true;
    const struct {
      const char* engine;
      int threads, spare;
      const char* regex;
    } cases[] = {
        {"io_uring", 1, 0, "cannot start thread 0 of 1 of the io_uring reaper \\("},
        {"threads", 8, 2, "cannot start thread [0-2] of 8 of the pread/pwrite pool \\("},
    };
    for (const auto& c : cases) {
      lim.rlim_cur = static_cast<rlim_t>(before + c.spare);
      ::setrlimit(RLIMIT_NPROC, &lim);
      offload::AioOptions o;
      o.engine = c.engine;
      o.thread_count = c.threads;
      try {
        offload::AioQueue q(o);
        std::cerr << c.engine << ": no error" << std::endl;
        ok = false;
      } catch (const Error& e) {
        std::cerr << c.engine << ": zero::Error: " << e.what() << std::endl;
        ok = ok && e.code() == ErrorCode::kOutOfMemory &&
             std::regex_search(e.what(), std::regex(c.regex)) &&
             std::string(e.what()).find("Resource temporarily unavailable; errno 11") !=
                 std::string::npos;
      }
      const int after = thread_count();
      if (after != before) std::cerr << c.engine << ": threads " << before << " -> " << after;
      ok = ok && after == before;
      lim.rlim_cur = free_limit;
      ::setrlimit(RLIMIT_NPROC, &lim);
      offload::AioQueue q(o);  // the limit lifted: starts, and moves bytes
      alignas(4096) static char buf[4096];
      const int fd = ::open("/dev/null", O_WRONLY);
      q.write(fd, "/dev/null", buf, sizeof buf, 0);
      ::close(fd);
    }
    std::_Exit(ok ? 3 : 6);
  };
  EXPECT_EXIT(run(), ::testing::ExitedWithCode(3),
              "io_uring: zero::Error: out of memory: aio: cannot start thread 0 of 1 of the "
              "io_uring reaper");
}

}  // namespace
}  // namespace zero
