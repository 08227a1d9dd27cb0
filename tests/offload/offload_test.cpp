// Offload: optimizer state in pinned host memory and in NVMe files trains bitwise the same
// parameters as no offload (same kernels, same order); the aio engines and the chunk swapper
// against independent reads of the files; the NVMe files hold exactly the expected bytes; an
// unwritable nvme_path, a file-size limit hit mid-write and a truncated state file are errors
// naming the file.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/mlp_model.hpp"
#include "common/mlp_training.hpp"
#include "offload/aio.hpp"
#include "offload/io_fixtures.hpp"
#include "offload/nvme_swapper.hpp"
#include "zero/comm/comm.hpp"
#include "zero/config/config.hpp"
#include "zero/core/error.hpp"
#include "zero/engine/engine.hpp"
#include "zero/engine/plan.hpp"

namespace zero {
namespace {

namespace fs = std::filesystem;
using testing::Aligned;
using testing::bitwise_equal;
using testing::describe;
using testing::kDims;
using testing::kRows;
using testing::make_config;
using testing::Mlp;
using testing::RunResult;
using testing::RunSpec;
using testing::TempDir;
using testing::train;

// The swap files this process holds open under `dir`: their names (unlinked at open, so only
// /proc/self/fd still shows them, "(deleted)") and a path that opens them, /proc/self/fd/<n>.
std::vector<std::pair<std::string, std::string>> open_swap_files(const std::string& dir) {
  std::vector<std::pair<std::string, std::string>> out;
  const std::string deleted = " (deleted)";
  for (const auto& e : fs::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const std::string target = fs::read_symlink(e.path(), ec).string();
    if (ec || target.rfind(dir + "/", 0) != 0 || target.size() < deleted.size() ||
        target.compare(target.size() - deleted.size(), deleted.size(), deleted) != 0) {
      continue;
    }
    out.emplace_back(target.substr(0, target.size() - deleted.size()), e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The one open swap file under `dir` whose name starts with `stem`: /proc/self/fd/<n>.
std::string open_swap_file(const std::string& dir, const std::string& stem) {
  std::string found;
  for (const auto& [name, fd_path] : open_swap_files(dir)) {
    if (fs::path(name).filename().string().rfind(stem, 0) == 0) {
      EXPECT_TRUE(found.empty()) << "two open swap files " << stem << "* under " << dir;
      found = fd_path;
    }
  }
  return found;
}

std::vector<char> read_file(const std::string& path) {
  std::vector<char> out(fs::file_size(path));
  const int fd = ::open(path.c_str(), O_RDONLY);
  EXPECT_GE(fd, 0) << path;
  EXPECT_EQ(::pread(fd, out.data(), out.size(), 0), static_cast<ssize_t>(out.size()));
  ::close(fd);
  return out;
}

// ---- the aio engines

class AioEngines : public ::testing::TestWithParam<const char*> {};

TEST_P(AioEngines, WritesAndReadsBackRandomBytesInPiecesOfAnySize) {
  TempDir dir;
  const std::string path = dir.path() + "/data";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_DIRECT, 0600);
  ASSERT_GE(fd, 0);
  offload::AioOptions o;
  o.engine = GetParam();
  o.block_size = 3 * 4096;  // requests split into pieces that do not divide them
  o.queue_depth = 3;
  o.thread_count = 2;
  offload::AioQueue q(o);
  EXPECT_STREQ(q.engine(), GetParam());
  std::mt19937 rng(7);
  const std::size_t sizes[] = {4096, 5 * 4096, 17 * 4096, 64 * 4096};
  std::vector<Aligned> bufs;
  std::vector<std::uint64_t> offsets;
  std::uint64_t off = 0;
  std::vector<offload::AioQueue::Ticket> tickets;
  for (std::size_t s : sizes) {
    bufs.emplace_back(s);
    for (std::size_t i = 0; i < s; ++i) bufs.back().p[i] = static_cast<char>(rng());
    offsets.push_back(off);
    tickets.push_back(q.submit(offload::IoKind::kWrite, fd, path, bufs.back().p, s, off));
    off += s;
  }
  // Waited out of order.
  for (std::size_t i = tickets.size(); i-- > 0;) q.wait(tickets[i]);
  EXPECT_EQ(fs::file_size(path), off);
  // Read back independently, then through the queue into poisoned buffers.
  const std::vector<char> disk = read_file(path);
  for (std::size_t i = 0; i < bufs.size(); ++i) {
    EXPECT_EQ(std::memcmp(disk.data() + offsets[i], bufs[i].p, bufs[i].size), 0) << i;
    Aligned back(bufs[i].size);
    std::memset(back.p, 0xA5, back.size);
    q.read(fd, path, back.p, back.size, offsets[i]);
    EXPECT_EQ(std::memcmp(back.p, bufs[i].p, back.size), 0) << i;
  }
  ::close(fd);
}

TEST_P(AioEngines, ReadPastTheEndNamesTheFileAndOffset) {
  TempDir dir;
  const std::string path = dir.path() + "/short";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT, 0600);
  ASSERT_GE(fd, 0);
  Aligned b(8 * 4096);
  std::memset(b.p, 1, b.size);
  ASSERT_EQ(::pwrite(fd, b.p, 3 * 4096, 0), 3 * 4096);
  offload::AioOptions o;
  o.engine = GetParam();
  o.block_size = 4096;
  offload::AioQueue q(o);
  try {
    q.read(fd, path, b.p, b.size, 0);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruption);
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("offset 12288"), std::string::npos) << msg;
    EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  }
  // A bad descriptor: the errno, named.
  try {
    q.write(-1, "nowhere", b.p, 4096, 0);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIO);
    EXPECT_NE(std::string(e.what()).find("'nowhere'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Bad file descriptor"), std::string::npos) << e.what();
  }
  ::close(fd);
}

// ENOSPC, as a full disk gives it: /dev/full answers every write with it.
TEST_P(AioEngines, DiskFullIsAnErrorNamingFileOffsetAndErrno) {
  const int fd = ::open("/dev/full", O_WRONLY);
  ASSERT_GE(fd, 0) << "/dev/full";
  offload::AioOptions o;
  o.engine = GetParam();
  o.block_size = 4096;
  offload::AioQueue q(o);
  Aligned b(3 * 4096);
  std::memset(b.p, 7, b.size);
  try {
    q.write(fd, "/dev/full", b.p, b.size, 8192);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIO);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("write of 12288 bytes at offset 8192 of '/dev/full'"), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("No space left on device"), std::string::npos) << msg;
  }
  ::close(fd);
}

INSTANTIATE_TEST_SUITE_P(Offload, AioEngines, ::testing::Values("io_uring", "threads"));

// ---- the chunk swapper: passes that read, change and write every chunk, checked on disk

TEST(ChunkSwapper, PipelinedPassesKeepEveryChunkAndTheFileHoldsTheSlots) {
  TempDir dir;
  const std::vector<std::size_t> elems = {1, 1000, 1024, 4097, 33, 2048, 5000};
  for (std::size_t buffers : {1, 2, 3, 4}) {
    for (bool pipe : {false, true}) {
      MemoryTracker t;
      offload::ChunkSwapper::Options o;
      o.dir = dir.path();
      o.stem = "test";
      o.origin = "test.dir";
      o.buffer_count = buffers;
      o.pipeline_read = o.pipeline_write = pipe;
      o.aio.block_size = 8192;
      o.aio.queue_depth = 2;
      offload::ChunkSwapper sw(
          t, elems, {{MemCategory::kMasterParams, 4}, {MemCategory::kOptimizerState, 2}}, o);
      std::size_t expect = 0;
      for (std::size_t n : elems) expect += offload::align_up(n * 4) + offload::align_up(n * 2);
      EXPECT_EQ(sw.file_bytes(), expect);
      EXPECT_EQ(t.current(MemCategory::kMasterParams, MemTier::kNvme) +
                    t.current(MemCategory::kOptimizerState, MemTier::kNvme),
                expect);
      // Reference model of the contents, in memory.
      std::vector<std::vector<float>> a(elems.size());
      std::vector<std::vector<std::uint16_t>> b(elems.size());
      std::mt19937 rng(static_cast<unsigned>(buffers * 2 + pipe));
      sw.run(0, elems.size(), false, true, [&](const offload::ChunkSwapper::Staged& s) {
        a[s.chunk].resize(s.count);
        b[s.chunk].resize(s.count);
        for (std::size_t i = 0; i < s.count; ++i) {
          a[s.chunk][i] = static_cast<float>(rng() % 1000);
          b[s.chunk][i] = static_cast<std::uint16_t>(rng());
        }
        std::memcpy(s.part[0], a[s.chunk].data(), s.count * 4);
        std::memcpy(s.part[1], b[s.chunk].data(), s.count * 2);
      });
      for (int pass = 0; pass < 3; ++pass) {
        sw.run(0, elems.size(), true, true, [&](const offload::ChunkSwapper::Staged& s) {
          auto* pa = reinterpret_cast<float*>(s.part[0]);
          auto* pb = reinterpret_cast<std::uint16_t*>(s.part[1]);
          ASSERT_EQ(std::memcmp(pa, a[s.chunk].data(), s.count * 4), 0) << s.chunk;
          ASSERT_EQ(std::memcmp(pb, b[s.chunk].data(), s.count * 2), 0) << s.chunk;
          for (std::size_t i = 0; i < s.count; ++i) {
            pa[i] = a[s.chunk][i] += 1.0f;
            pb[i] = b[s.chunk][i] ^= 0x5a5a;
          }
        });
      }
      // The file, read independently: every slot holds its parts at the documented offsets.
      // Unlinked at open: no name in the directory, the data through the descriptor.
      EXPECT_TRUE(sw.file().unlinked());
      EXPECT_FALSE(fs::exists(sw.file().path())) << sw.file().path();
      EXPECT_TRUE(dir.files().empty());
      const std::string file = "/proc/self/fd/" + std::to_string(sw.file().fd());
      EXPECT_TRUE(sw.file().direct());
      const std::vector<char> disk = read_file(file);
      ASSERT_EQ(disk.size(), expect);
      for (std::size_t c = 0; c < elems.size(); ++c) {
        EXPECT_EQ(std::memcmp(disk.data() + sw.part_offset(c, 0), a[c].data(), elems[c] * 4), 0);
        EXPECT_EQ(std::memcmp(disk.data() + sw.part_offset(c, 1), b[c].data(), elems[c] * 2), 0);
      }
    }
    EXPECT_TRUE(dir.files().empty()) << "swap files left behind";
  }
}

// Two swappers of one stem in one directory: two files (two inodes), neither with a name left
// in the directory, told apart in errors by their descriptors.
TEST(ChunkSwapper, SwappersOfOneStemAreDistinctUnlinkedFiles) {
  TempDir dir;
  MemoryTracker t;
  offload::ChunkSwapper::Options o;
  o.dir = dir.path();
  o.stem = "same";
  o.origin = "test.dir";
  offload::ChunkSwapper a(t, {10}, {{MemCategory::kOther, 4}}, o);
  offload::ChunkSwapper b(t, {10}, {{MemCategory::kOther, 4}}, o);
  struct stat sa {
  }, sb{};
  ASSERT_EQ(::fstat(a.file().fd(), &sa), 0);
  ASSERT_EQ(::fstat(b.file().fd(), &sb), 0);
  EXPECT_NE(sa.st_ino, sb.st_ino);
  EXPECT_EQ(sa.st_nlink, 0u);
  EXPECT_EQ(sb.st_nlink, 0u);
  EXPECT_NE(a.file().label(), b.file().label());
  EXPECT_TRUE(dir.files().empty());
  EXPECT_EQ(open_swap_files(dir.path()).size(), 2u);
}

// ---- the engine with NVMe offload

// The planner's prediction for the test MLP (one unit per layer: W, b) at `ranks`.
PlanResult plan_mlp(const Config& cfg, int ranks) {
  PlanInput pin;
  pin.ranks = ranks;
  pin.config = cfg;
  for (std::size_t l = 0; l + 1 < kDims.size(); ++l) {
    pin.units.push_back(
        {"layer" + std::to_string(l), {{"W", {kDims[l + 1], kDims[l]}}, {"b", {kDims[l + 1]}}}});
  }
  return plan_engine_memory(pin);
}

// Declares and initialises the test MLP on `e` and trains `steps` steps (the second micro-step
// prefetches in stage 3, so the pools have settled after 2).
void train_mlp(Engine& e, const Mlp& mlp, Communicator& comm, int steps = 2) {
  mlp.declare(e);
  mlp.init(e, 1);
  testing::run_steps(e, mlp, comm.rank(), steps);
}

// The engine's tracker against the planner, category by category: memory, pinned, NVMe files.
void expect_plan_holds(Engine& e, const PlanResult& plan) {
  const MemoryTracker& t = e.tracker();
  const std::string what =
      "stage " + std::to_string(e.stage()) + " " + std::string(to_string(e.param_dtype()));
  for (std::size_t c = 0; c < kNumMemCategories; ++c) {
    const auto cat = static_cast<MemCategory>(c);
    if (cat == MemCategory::kActivations || cat == MemCategory::kOther) continue;  // the trainer's
    EXPECT_EQ(t.current(cat) - t.current(cat, MemTier::kNvme), plan.bytes[c])
        << to_string(cat) << " " << what;
    EXPECT_EQ(t.current(cat, MemTier::kNvme), plan.nvme[c]) << to_string(cat) << " " << what;
    EXPECT_EQ(t.current(cat, MemTier::kPinned), plan.pinned[c]) << to_string(cat) << " " << what;
  }
}

RunSpec nvme_spec(int stage, DType dt, int buffers, long chunk, const std::string& dir) {
  RunSpec s{.stage = stage, .ranks = 3, .dtype = dt, .clip = true, .overlap = stage == 3};
  s.offload_buffers = buffers;
  s.offload_chunk = chunk;
  s.offload_device = "nvme";
  s.nvme_path = dir;
  return s;
}

TEST(NvmeOffload, GivesBitwiseTheSameParametersAsNoOffload) {
  TempDir dir;
  int runs = 0;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (int stage : {1, 2, 3}) {
      RunSpec base{.stage = stage, .ranks = 3, .dtype = dt, .clip = true, .overlap = stage == 3};
      const RunResult ref = train(base);
      int variant = 0;
      for (int buffers : {1, 2, 4}) {
        for (long chunk : {7L, 100L, 4096L}) {  // 7 and 100 do not divide the shards
          RunSpec s = nvme_spec(stage, dt, buffers, chunk, dir.path());
          // Both aio engines, with and without the read/write pipeline.
          s.pipeline = variant % 2 == 0;
          s.aio_engine = (variant / 2) % 2 == 0 ? "io_uring" : "threads";
          ++variant;
          const RunResult got = train(s);
          ++runs;
          EXPECT_TRUE(bitwise_equal(got.params, ref.params)) << describe(s);
          EXPECT_TRUE(bitwise_equal(got.masters, ref.masters)) << describe(s);
          EXPECT_TRUE(dir.files().empty()) << "swap files left behind: " << describe(s);
        }
      }
    }
  }
  EXPECT_EQ(runs, 2 * 3 * 9);
}

TEST(NvmeOffload, GradientAccumulationAndFp16SkipsMatchToo) {
  TempDir dir;
  for (DType dt : {DType::kF16, DType::kBF16}) {
    RunSpec base{.stage = 2, .ranks = 2, .dtype = dt, .accumulation = 3, .clip = true};
    const RunResult ref = train(base);
    RunSpec s = nvme_spec(2, dt, 2, 64, dir.path());
    s.ranks = 2;
    s.accumulation = 3;
    const RunResult got = train(s);
    EXPECT_TRUE(bitwise_equal(got.params, ref.params)) << describe(s);
    EXPECT_TRUE(bitwise_equal(got.masters, ref.masters)) << describe(s);
    ASSERT_EQ(got.steps.size(), ref.steps.size());
    for (std::size_t i = 0; i < got.steps.size(); ++i) {
      EXPECT_EQ(got.steps[i].applied, ref.steps[i].applied) << i;
      EXPECT_EQ(got.steps[i].loss_scale, ref.steps[i].loss_scale) << i;
    }
  }
}

// The files hold exactly the master and both Adam moments of the rank's shards, chunk by chunk
// at 4 KiB-aligned offsets, and the tracker's NVMe tier is their size; compared against the
// same training with the state in pinned memory (read directly, not through the swapper).
TEST(NvmeOffload, FilesHoldExactlyTheExpectedBytes) {
  TempDir dir;
  constexpr long kChunk = 50;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    RunSpec nvme = nvme_spec(2, dt, 2, kChunk, dir.path());
    nvme.ranks = 2;
    RunSpec host = nvme;
    host.offload_device = "cpu";
    const Mlp mlp(kDims);
    ThreadGroup::run(2, [&](Communicator& comm) {
      Engine eh(comm, make_config(host));
      Engine en(comm, make_config(nvme));
      for (Engine* e : {&eh, &en}) {
        mlp.declare(*e);
        mlp.init(*e, 3);
        testing::run_steps(*e, mlp, comm.rank(), 3);
      }
      // This rank's file (names carry the rank), through its descriptor.
      const std::string file =
          open_swap_file(dir.path(), "zero-optim-r" + std::to_string(comm.rank()) + "-");
      ASSERT_FALSE(file.empty());
      const std::vector<char> disk = read_file(file);
      std::size_t expect = 0, off = 0;
      for (UnitId u = 0; u < en.num_units(); ++u) {
        const std::size_t shard = en.unit_shard_numel(u);
        const auto* master = reinterpret_cast<const char*>(eh.master_shard(u));
        const auto* m = static_cast<const char*>(eh.state_shard(u, 0));
        const auto* v = static_cast<const char*>(eh.state_shard(u, 1));
        for (std::size_t at = 0; at < shard; at += kChunk) {
          const std::size_t n = std::min<std::size_t>(kChunk, shard - at);
          const std::size_t part = offload::align_up(n * 4);
          ASSERT_LE(off + 3 * part, disk.size());
          EXPECT_EQ(std::memcmp(disk.data() + off, master + at * 4, n * 4), 0) << u << " " << at;
          EXPECT_EQ(std::memcmp(disk.data() + off + part, m + at * 4, n * 4), 0) << u << " " << at;
          EXPECT_EQ(std::memcmp(disk.data() + off + 2 * part, v + at * 4, n * 4), 0) << u;
          off += 3 * part;
          expect += 3 * part;
        }
      }
      EXPECT_EQ(disk.size(), expect);
      const MemoryTracker& t = en.tracker();
      EXPECT_EQ(t.current(MemCategory::kMasterParams, MemTier::kNvme) +
                    t.current(MemCategory::kOptimizerState, MemTier::kNvme),
                expect);
      EXPECT_EQ(t.current(MemCategory::kMasterParams, MemTier::kNvme), expect / 3);
      // Nothing of the optimizer is in memory; the staging buffers are.
      EXPECT_EQ(t.current(MemCategory::kMasterParams) - expect / 3, 0u);
      EXPECT_EQ(t.current(MemCategory::kOptimizerState) - 2 * expect / 3, 0u);
      EXPECT_GT(t.current(MemCategory::kOffloadStaging, MemTier::kPinned), 0u);
      // copy_*_shard read the same bytes back through the swapper.
      for (UnitId u = 0; u < en.num_units(); ++u) {
        std::vector<float> a(en.unit_shard_numel(u)), b(a.size());
        en.copy_master_shard(u, a.data());
        eh.copy_master_shard(u, b.data());
        EXPECT_TRUE(
            bitwise_equal(std::vector<std::vector<float>>{a}, std::vector<std::vector<float>>{b}));
        en.copy_state_shard(u, 1, a.data());
        eh.copy_state_shard(u, 1, b.data());
        EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
      }
      EXPECT_THROW((void)en.master_shard(0), Error);
      comm.barrier();
    });
    EXPECT_TRUE(dir.files().empty()) << "swap files left behind";
  }
}

// ---- int8 moments (block-wise 8-bit): offloaded like any state, 8-bit in the swap file

// Host and NVMe optimizer offload give the int8 run's bits without offload, every stage, with
// accumulation and clipping, on the CPU device and the discrete one; chunks are whole
// quantization blocks (7 and 100 round up to 256).
TEST(Int8MomentOffload, HostAndNvmeOffloadGiveBitwiseTheSameParameters) {
  TempDir dir;
  int runs = 0;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (int stage : {1, 2, 3}) {
      for (int accumulation : {1, 3}) {
        RunSpec base{.stage = stage,
                     .ranks = 3,
                     .dtype = dt,
                     .accumulation = accumulation,
                     .clip = true,
                     .overlap = stage == 3};
        base.moment_dtype = "int8";
        const RunResult ref = train(base);
        for (const char* device : {"cpu", "nvme"}) {
          for (long chunk : {7L, 100L, 600L}) {
            RunSpec s = nvme_spec(stage, dt, chunk == 600 ? 1 : 2, chunk, dir.path());
            s.moment_dtype = "int8";
            s.accumulation = accumulation;
            s.offload_device = device;
            s.discrete = chunk == 100;
            const RunResult got = train(s);
            ++runs;
            EXPECT_TRUE(bitwise_equal(got.params, ref.params)) << describe(s);
            EXPECT_TRUE(bitwise_equal(got.masters, ref.masters)) << describe(s);
            EXPECT_TRUE(dir.files().empty()) << "swap files left behind: " << describe(s);
          }
        }
      }
    }
  }
  EXPECT_EQ(runs, 2 * 3 * 2 * 2 * 3);
}

// The swap file holds the master and the two int8 moment arrays (codes and each block's absmax,
// as in memory) chunk by chunk, each part 4 KiB-aligned: the state parts are
// state_bytes(int8, n) = n + 4 n / 256 bytes, a quarter (plus the scales) of f32 moments'; the
// tracker's NVMe tier is the file; the plan predicts it.
TEST(Int8MomentOffload, TheSwapFileHoldsTheEightBitStateExactly) {
  TempDir dir;
  constexpr long kChunk = 256;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    RunSpec nvme = nvme_spec(2, dt, 2, kChunk, dir.path());
    nvme.ranks = 2;
    nvme.moment_dtype = "int8";
    RunSpec host = nvme;
    host.offload_device = "cpu";
    const Mlp mlp(kDims);
    const PlanResult plan = plan_mlp(make_config(nvme), 2);
    ThreadGroup::run(2, [&](Communicator& comm) {
      Engine eh(comm, make_config(host));
      Engine en(comm, make_config(nvme));
      for (Engine* e : {&eh, &en}) {
        mlp.declare(*e);
        mlp.init(*e, 3);
        testing::run_steps(*e, mlp, comm.rank(), 3);
      }
      const std::string file =
          open_swap_file(dir.path(), "zero-optim-r" + std::to_string(comm.rank()) + "-");
      ASSERT_FALSE(file.empty());
      const std::vector<char> disk = read_file(file);
      std::size_t off = 0, master_bytes = 0, state_file = 0;
      for (UnitId u = 0; u < en.num_units(); ++u) {
        const std::size_t shard = en.unit_shard_numel(u);
        ASSERT_EQ(shard % 256, 0u) << "a shard is whole quantization blocks";
        const auto* master = reinterpret_cast<const char*>(eh.master_shard(u));
        const auto* m = static_cast<const char*>(eh.state_shard(u, 0));
        const auto* v = static_cast<const char*>(eh.state_shard(u, 1));
        for (std::size_t at = 0; at < shard; at += kChunk) {
          const std::size_t n = std::min<std::size_t>(kChunk, shard - at);
          const std::size_t sb = state_bytes(MomentDType::kInt8, n);
          const std::size_t sat = state_bytes(MomentDType::kInt8, at);
          const std::size_t mp = offload::align_up(n * 4), sp = offload::align_up(sb);
          ASSERT_LE(off + mp + 2 * sp, disk.size());
          EXPECT_EQ(std::memcmp(disk.data() + off, master + at * 4, n * 4), 0) << u << " " << at;
          EXPECT_EQ(std::memcmp(disk.data() + off + mp, m + sat, sb), 0) << u << " " << at;
          EXPECT_EQ(std::memcmp(disk.data() + off + mp + sp, v + sat, sb), 0) << u << " " << at;
          off += mp + 2 * sp;
          master_bytes += mp;
          state_file += 2 * sp;
        }
      }
      EXPECT_EQ(disk.size(), off);
      const MemoryTracker& t = en.tracker();
      EXPECT_EQ(t.current(MemCategory::kMasterParams, MemTier::kNvme), master_bytes);
      EXPECT_EQ(t.current(MemCategory::kOptimizerState, MemTier::kNvme), state_file);
      for (std::size_t c = 0; c < kNumMemCategories; ++c) {
        EXPECT_EQ(t.current(static_cast<MemCategory>(c), MemTier::kNvme), plan.nvme[c]);
      }
      // The states read back through the swapper are the host tier's bytes.
      for (UnitId u = 0; u < en.num_units(); ++u) {
        const std::size_t sb = state_bytes(MomentDType::kInt8, en.unit_shard_numel(u));
        std::vector<char> a(sb), b(sb);
        for (int k = 0; k < 2; ++k) {
          en.copy_state_shard(u, k, a.data());
          eh.copy_state_shard(u, k, b.data());
          EXPECT_EQ(a, b) << "unit " << u << " state " << k;
        }
      }
      comm.barrier();
    });
    EXPECT_TRUE(dir.files().empty()) << "swap files left behind";
  }
}

// ---- errors: each names the key or the file and offset

std::string nvme_error(const RunSpec& s) {
  try {
    train(s);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(NvmeOffload, MissingOrNonDirectoryPathIsAnErrorNamingTheKey) {
  TempDir dir;
  RunSpec s = nvme_spec(1, DType::kF32, 2, 64, dir.path() + "/does-not-exist");
  s.ranks = 1;
  std::string msg = nvme_error(s);
  EXPECT_NE(msg.find("zero_optimization.offload_optimizer.nvme_path"), std::string::npos) << msg;
  EXPECT_NE(msg.find("does-not-exist"), std::string::npos) << msg;
  EXPECT_NE(msg.find("No such file or directory"), std::string::npos) << msg;
  const std::string file = dir.path() + "/plain-file";
  { std::ofstream(file) << "x"; }
  s.nvme_path = file;
  msg = nvme_error(s);
  EXPECT_NE(msg.find("not a directory"), std::string::npos) << msg;
}

// Runs fn in a child (gtest's threadsafe death test: a fresh exec of this binary), which
// prints the zero::Error it got and ends with status 3; the parent matches the message.
#define EXPECT_CHILD_ERROR(fn, regex)                            \
  EXPECT_EXIT(                                                   \
      {                                                          \
        try {                                                    \
          fn();                                                  \
        } catch (const Error& e) {                               \
          std::cerr << "zero::Error: " << e.what() << std::endl; \
          std::_Exit(3);                                         \
        }                                                        \
        std::cerr << "no error" << std::endl;                    \
        std::_Exit(4);                                           \
      },                                                         \
      ::testing::ExitedWithCode(3), regex)

TEST(NvmeOffloadDeathTest, UnwritablePathIsAnErrorNamingTheDirectory) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  TempDir dir;
  fs::permissions(dir.path(), fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                                  fs::perms::others_read | fs::perms::others_exec);
  const std::string ro = dir.path() + "/read-only";
  fs::create_directory(ro);
  fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read |
                          fs::perms::group_exec | fs::perms::others_read | fs::perms::others_exec);
  // Root may write anywhere: the child drops to nobody first.
  auto run = [&] {
    if (::geteuid() == 0) {
      if (::setgid(65534) != 0 || ::setuid(65534) != 0) {
        std::cerr << "cannot drop privileges" << std::endl;
        std::_Exit(5);
      }
    }
    RunSpec s = nvme_spec(1, DType::kF32, 2, 64, ro);
    s.ranks = 1;
    train(s);
  };
  EXPECT_CHILD_ERROR(run, "nvme_path.*read-only.*cannot create swap file.*Permission denied");
}

TEST(NvmeOffloadDeathTest, FileSizeLimitHitMidWriteIsAnErrorNamingFileAndOffset) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  TempDir dir;
  for (const char* engine : {"io_uring", "threads"}) {
    auto run = [&] {
      // 20000 bytes: the first unit's slot (3 x 4 KiB) lands, the second one's write stops
      // short at the limit and its retry fails (EFBIG; SIGXFSZ ignored, as servers do).
      std::signal(SIGXFSZ, SIG_IGN);
      const rlimit lim{20000, 20000};
      ::setrlimit(RLIMIT_FSIZE, &lim);
      RunSpec s = nvme_spec(1, DType::kF32, 2, 1024, dir.path());
      s.ranks = 1;
      s.aio_engine = engine;
      train(s);
    };
    EXPECT_CHILD_ERROR(run,
                       "write of [0-9]+ bytes at offset [0-9]+ of '.*zero-optim-r0-.*\\.swap "
                       "\\(unlinked; fd [0-9]+\\)'"
                       ".*File too large");
  }
}

TEST(NvmeOffload, TruncatedStateFileIsAnErrorNamingFileAndOffset) {
  TempDir dir;
  RunSpec s = nvme_spec(1, DType::kF32, 2, 64, dir.path());
  s.ranks = 1;
  const Mlp mlp(kDims);
  ThreadGroup::run(1, [&](Communicator& comm) {
    Engine e(comm, make_config(s));
    mlp.declare(e);
    mlp.init(e, 1);
    mlp.micro_step(e, testing::make_batch(mlp.in(), mlp.out(), kRows, 0, 0, 0));
    e.step();
    EXPECT_TRUE(dir.files().empty());
    const auto files = open_swap_files(dir.path());
    ASSERT_EQ(files.size(), 1u);
    const auto size = fs::file_size(files[0].second);
    fs::resize_file(files[0].second, size / 2);  // truncate(2) through /proc/self/fd/<n>
    mlp.micro_step(e, testing::make_batch(mlp.in(), mlp.out(), kRows, 1, 0, 0));
    try {
      e.step();
      FAIL() << "no error";
    } catch (const Error& err) {
      EXPECT_EQ(err.code(), ErrorCode::kCorruption);
      const std::string msg = err.what();
      EXPECT_NE(msg.find(files[0].first + " (unlinked; fd "), std::string::npos) << msg;
      EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
      EXPECT_NE(msg.find("offset"), std::string::npos) << msg;
    }
  });
}

// ---- optimizer offload to host memory: the same bits as without, state in pinned memory

TEST(HostOffload, HostOptimizerOffloadGivesBitwiseTheSameParameters) {
  int runs = 0;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (int stage : {1, 2, 3}) {
      RunSpec base{.stage = stage, .ranks = 3, .dtype = dt, .clip = true, .overlap = stage == 3};
      const RunResult ref = train(base);
      for (int buffers : {1, 2, 4}) {
        for (long chunk : {7L, 100L, 4096L}) {  // 7 and 100 do not divide the shards
          RunSpec s = base;
          s.offload_buffers = buffers;
          s.offload_chunk = chunk;
          const RunResult got = train(s);
          ++runs;
          EXPECT_TRUE(bitwise_equal(got.params, ref.params))
              << describe(s) << " offload " << buffers << " x " << chunk;
          EXPECT_TRUE(bitwise_equal(got.masters, ref.masters))
              << describe(s) << " offload " << buffers << " x " << chunk;
        }
      }
    }
  }
  EXPECT_EQ(runs, 2 * 3 * 9);
}

// The offload paths of a discrete device (a GPU's): gradient shards copied device -> pinned as
// each reduce-scatter completes, chunks copied in and parameters copied out on the copy lane,
// parameter shards copied into the gathered buffer before an in-place all-gather. Run on the
// discrete CPU device (tests/common/discrete_device.hpp), whose memory the host cannot touch except
// through the device interface, they must train bitwise like no offload on the CPU device.
TEST(DiscreteDeviceOffload, OptimizerAndParameterOffloadMatchNoOffloadBitwise) {
  TempDir dir;
  int runs = 0;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (int stage : {1, 2, 3}) {
      for (int accumulation : {1, 3}) {
        RunSpec base{.stage = stage,
                     .ranks = 3,
                     .dtype = dt,
                     .accumulation = accumulation,
                     .clip = true,
                     .overlap = stage == 3};
        const RunResult ref = train(base);
        for (const char* device : {"cpu", "nvme"}) {
          for (const char* param : {"none", "cpu", "nvme"}) {
            if (stage < 3 && std::string(param) != "none") continue;
            RunSpec s = nvme_spec(stage, dt, accumulation == 1 ? 2 : 1, accumulation == 1 ? 7 : 100,
                                  dir.path());
            s.accumulation = accumulation;
            s.offload_device = device;
            s.offload_param = param;
            s.discrete = true;
            const RunResult got = train(s);
            ++runs;
            EXPECT_TRUE(bitwise_equal(got.params, ref.params))
                << describe(s) << " offload_param " << param;
            EXPECT_TRUE(bitwise_equal(got.masters, ref.masters))
                << describe(s) << " offload_param " << param;
            EXPECT_TRUE(dir.files().empty()) << "swap files left behind: " << describe(s);
          }
        }
      }
    }
  }
  EXPECT_EQ(runs, 2 * 2 * (2 + 2 + 6));
}

TEST(NvmeOffload, ThePlanPredictsMemoryAndFilesExactly) {
  TempDir dir;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (int stage : {1, 2, 3}) {
      RunSpec spec = nvme_spec(stage, dt, 3, 37, dir.path());
      spec.ranks = 2;
      const Config cfg = make_config(spec);
      const Mlp mlp(kDims);
      const PlanResult plan = plan_mlp(cfg, 2);
      ThreadGroup::run(2, [&](Communicator& comm) {
        Engine e(comm, cfg);
        train_mlp(e, mlp, comm);
        expect_plan_holds(e, plan);
      });
    }
  }
}

// offload_param = cpu: stage 3's parameter shards in pinned host memory, gathered from there;
// alone and with the optimizer offloaded to host memory or NVMe.
TEST(ParamOffload, HostParameterShardsGiveBitwiseTheSameParametersAndThePlanKnows) {
  TempDir dir;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    RunSpec base{.stage = 3, .ranks = 3, .dtype = dt, .clip = true, .overlap = true};
    const RunResult ref = train(base);
    for (const char* opt : {"none", "cpu", "nvme"}) {
      RunSpec s = base;
      s.offload_param = "cpu";
      if (std::string(opt) != "none") {
        s = nvme_spec(3, dt, 2, 100, dir.path());
        s.offload_device = opt;
        s.offload_param = "cpu";
      }
      const RunResult got = train(s);
      EXPECT_TRUE(bitwise_equal(got.params, ref.params)) << describe(s) << " param offload";
      EXPECT_TRUE(bitwise_equal(got.masters, ref.masters)) << describe(s) << " param offload";
    }
    // Where the bytes are: the shards pinned, the plan says so.
    RunSpec s = base;
    s.ranks = 2;
    s.offload_param = "cpu";
    const Config cfg = make_config(s);
    const Mlp mlp(kDims);
    const PlanResult plan = plan_mlp(cfg, 2);
    ThreadGroup::run(2, [&](Communicator& comm) {
      Engine e(comm, cfg);
      train_mlp(e, mlp, comm);
      std::size_t shard = 0;
      for (UnitId u = 0; u < e.num_units(); ++u) shard += e.unit_shard_numel(u);
      const MemoryTracker& t = e.tracker();
      EXPECT_EQ(t.current(MemCategory::kParams16, MemTier::kPinned), shard * dtype_size(dt));
      EXPECT_EQ(plan.pinned[static_cast<std::size_t>(MemCategory::kParams16)],
                shard * dtype_size(dt));
      EXPECT_EQ(t.current(MemCategory::kParams16), plan.at(MemCategory::kParams16));
    });
  }
}

// offload_param = nvme: the shards in a swap file (one slot per sharded unit), read into their
// place in the gathered buffer at every gather, written back by the optimizer's chunk loop.
TEST(ParamOffload, NvmeParameterShardsGiveBitwiseTheSameParametersAndTheFileHoldsThem) {
  TempDir dir;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    RunSpec base{.stage = 3, .ranks = 3, .dtype = dt, .clip = true, .overlap = true};
    const RunResult ref = train(base);
    for (const char* opt : {"cpu", "nvme"}) {
      for (int buffers : {1, 4}) {
        RunSpec s = nvme_spec(3, dt, buffers, 100, dir.path());
        s.offload_device = opt;
        s.offload_param = "nvme";
        s.pipeline = buffers > 1;
        const RunResult got = train(s);
        EXPECT_TRUE(bitwise_equal(got.params, ref.params)) << describe(s) << " param nvme";
        EXPECT_TRUE(bitwise_equal(got.masters, ref.masters)) << describe(s) << " param nvme";
        EXPECT_TRUE(dir.files().empty()) << "swap files left behind";
      }
    }
    // The file holds each rank's shard of the working parameters, exactly; the plan knows.
    RunSpec s = nvme_spec(3, dt, 2, 64, dir.path());
    s.ranks = 2;
    s.offload_param = "nvme";
    const Config cfg = make_config(s);
    const Mlp mlp(kDims);
    const PlanResult plan = plan_mlp(cfg, 2);
    ThreadGroup::run(2, [&](Communicator& comm) {
      Engine e(comm, cfg);
      train_mlp(e, mlp, comm);
      expect_plan_holds(e, plan);
      const MemoryTracker& t = e.tracker();
      // Whole units from read_param (a gather), laid out as the engine does (W at 0, b at the
      // next multiple of 32), this rank's shard in the working dtype.
      std::vector<std::vector<char>> expect_slots;
      std::size_t expect_bytes = 0;
      for (UnitId u = 0; u < e.num_units(); ++u) {
        std::vector<float> whole(e.unit_padded_numel(u), 0.0f);
        std::size_t at = 0;
        for (int p = 0; p < 2; ++p) {
          const std::size_t n = e.unit(u).params[static_cast<std::size_t>(p)].numel();
          e.read_param(u, p, whole.data() + at, n);
          at = (at + n + 31) / 32 * 32;
        }
        const std::size_t shard = e.unit_shard_numel(u), ws = dtype_size(dt);
        std::vector<char> slot(offload::align_up(shard * ws), 0);
        convert(whole.data() + static_cast<std::size_t>(comm.rank()) * shard, DType::kF32,
                slot.data(), dt, shard);
        slot.resize(shard * ws);
        expect_bytes += offload::align_up(shard * ws);
        expect_slots.push_back(std::move(slot));
      }
      EXPECT_EQ(t.current(MemCategory::kParams16, MemTier::kNvme), expect_bytes);
      const std::string file =
          open_swap_file(dir.path(), "zero-param-r" + std::to_string(comm.rank()) + "-");
      ASSERT_FALSE(file.empty());
      const std::vector<char> disk = read_file(file);
      ASSERT_EQ(disk.size(), expect_bytes);
      std::size_t off = 0;
      for (std::size_t u = 0; u < expect_slots.size(); ++u) {
        EXPECT_EQ(std::memcmp(disk.data() + off, expect_slots[u].data(), expect_slots[u].size()), 0)
            << "unit " << u;
        off += offload::align_up(expect_slots[u].size());
      }
      comm.barrier();
    });
    EXPECT_TRUE(dir.files().empty());
  }
  // NVMe parameters need the optimizer offloaded (its chunk loop writes them back).
  RunSpec s{.stage = 3, .ranks = 1};
  s.offload_param = "nvme";
  s.nvme_path = dir.path();
  const std::string msg = nvme_error(s);
  EXPECT_NE(msg.find("zero_optimization.offload_param.device"), std::string::npos) << msg;
  EXPECT_NE(msg.find("zero_optimization.offload_optimizer.device"), std::string::npos) << msg;
}

// Stage 1 keeps whole gradients on the device and stages the shard's gradient chunk by chunk at
// the step; stages 2-3 keep the fp32 gradient shards in pinned host memory (ZeRO-Offload), so
// only the 16-bit parameter chunk is staged.
TEST(HostOffload, StateMasterAndGradientShardsLiveInPinnedMemoryAndThePlanKnows) {
  for (int stage : {1, 2}) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      const RunSpec spec{
          .stage = stage, .ranks = 2, .dtype = dt, .offload_buffers = 2, .offload_chunk = 50};
      const Config cfg = make_config(spec);
      const Mlp mlp(kDims);
      const PlanResult plan = plan_mlp(cfg, 2);
      const std::size_t grad_staging = stage == 1 ? 4 : 0,
                        param_staging = dt == DType::kF32 ? 0 : 2;
      ThreadGroup::run(2, [&](Communicator& comm) {
        Engine e(comm, cfg);
        train_mlp(e, mlp, comm);
        const MemoryTracker& t = e.tracker();
        std::size_t shard = 0, padded = 0;
        for (UnitId u = 0; u < e.num_units(); ++u) {
          shard += e.unit_shard_numel(u);
          padded += e.unit_padded_numel(u);
        }
        EXPECT_EQ(t.current(MemCategory::kMasterParams, MemTier::kPinned), shard * 4);
        EXPECT_EQ(t.current(MemCategory::kOptimizerState, MemTier::kPinned), 2 * shard * 4);
        EXPECT_EQ(t.current(MemCategory::kMasterParams, MemTier::kHost), 0u);
        EXPECT_EQ(t.current(MemCategory::kOptimizerState, MemTier::kHost), 0u);
        // Gradients: stage 1 whole on the "device" (host tier here); stage 2 the fp32 shard
        // pinned, the in-flight unit buffers on the device.
        EXPECT_EQ(t.current(MemCategory::kGradients, MemTier::kPinned),
                  stage == 1 ? 0u : shard * 4);
        if (stage == 1) {
          EXPECT_EQ(
              t.current(MemCategory::kGradients, MemTier::kHost) - e.buffer_bytes().in_flight_grads,
              padded * 4);
        }
        const std::size_t staging = 2 * 50 * (grad_staging + param_staging);
        EXPECT_EQ(t.current(MemCategory::kOffloadStaging, MemTier::kPinned), staging);
        // A buffer_size beyond the largest shard (DeepSpeed's default is 1e8) is capped to it.
        Config big = cfg;
        big.zero_optimization.offload_optimizer.buffer_size = 100'000'000;
        Engine e2(comm, big);
        mlp.declare(e2);
        mlp.init(e2, 1);
        std::size_t max_shard = 0;
        for (UnitId u = 0; u < e2.num_units(); ++u) {
          max_shard = std::max(max_shard, e2.unit_shard_numel(u));
        }
        EXPECT_EQ(e2.tracker().current(MemCategory::kOffloadStaging, MemTier::kPinned),
                  2 * max_shard * (grad_staging + param_staging));
        for (std::size_t c = 0; c < kNumMemCategories; ++c) {
          EXPECT_EQ(t.current(static_cast<MemCategory>(c)), plan.bytes[c])
              << to_string(static_cast<MemCategory>(c)) << " " << to_string(dt);
          EXPECT_EQ(t.current(static_cast<MemCategory>(c), MemTier::kPinned), plan.pinned[c])
              << to_string(static_cast<MemCategory>(c)) << " " << to_string(dt);
        }
      });
    }
  }
}

}  // namespace
}  // namespace zero
