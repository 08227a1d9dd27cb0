// bench_ckpt: checkpoint save and load against raw sequential I/O of the same bytes, and the step
// stall of an asynchronous save against its full time — all measured in the same run.
//
//   bench_ckpt [--params M] [--ranks N] [--reps R] [--dir DIR]
//
// An engine of M million parameters (8 units, bf16 training, stage 2, AdamW: 12 bytes per
// parameter saved — fp32 master + m + v) on N in-process ranks. Per repetition, interleaved:
//   save      zero::ckpt::Saver::save (synchronous: every rank writes and fsyncs its file with
//             XXH3 checksums, rank 0 commits); the time until it returns on every rank
//   raw write every rank writes the same number of bytes to a file of its own with 8 MiB
//             write() calls and one fsync (what a checkpoint costs without zero)
//   load      zero::ckpt::load into fresh engines (the files' pages dropped from the page cache
//             first): verify every checksum, then read the ranges
//   raw read  the same files read sequentially in 8 MiB requests (pages dropped first)
//   async     Saver::save with async: the time save() blocks the step (the host snapshot), and
//             the time until wait() returns (written and committed)
// Reported: medians, GB/s, save / raw and load / raw ratios, stall / full.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "zero/ckpt/ckpt.hpp"
#include "zero/comm/comm.hpp"
#include "zero/config/config.hpp"
#include "zero/core/error.hpp"
#include "zero/engine/engine.hpp"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using namespace zero;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

void drop_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

void drop_tree(const std::string& dir) {
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) drop_cache(e.path().string());
  }
}

void raw_write(const std::string& path, std::size_t bytes, const std::vector<char>& buf) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ZERO_CHECK(fd >= 0, kIO, "bench_ckpt: cannot create ", path);
  for (std::size_t done = 0; done < bytes;) {
    const std::size_t n = std::min(buf.size(), bytes - done);
    ZERO_CHECK(::write(fd, buf.data(), n) == static_cast<ssize_t>(n), kIO, "bench_ckpt: write");
    done += n;
  }
  ::fsync(fd);
  ::close(fd);
}

std::size_t raw_read(const std::string& path, std::vector<char>& buf) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  ZERO_CHECK(fd >= 0, kIO, "bench_ckpt: cannot open ", path);
  std::size_t total = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n <= 0) break;
    total += static_cast<std::size_t>(n);
  }
  ::close(fd);
  return total;
}

struct Options {
  double mparams = 24;
  int ranks = 2;
  int reps = 3;
  std::string dir = "/tmp";
};

}  // namespace

int main(int argc, char** argv) try {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--params")
      o.mparams = std::stod(v);
    else if (a == "--ranks")
      o.ranks = std::stoi(v);
    else if (a == "--reps")
      o.reps = std::stoi(v);
    else if (a == "--dir")
      o.dir = v;
    else {
      std::fprintf(stderr, "bench_ckpt: unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  const std::string root = o.dir + "/zero-bench-ckpt-" + std::to_string(::getpid());
  fs::remove_all(root);
  fs::create_directories(root + "/raw");
  const Config cfg = parse_config(
      R"({"zero_optimization": {"stage": 2}, "bf16": {"enabled": true},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})");
  const auto per_unit = static_cast<std::int64_t>(o.mparams * 1e6 / 8);
  std::vector<UnitSpec> units;
  for (int u = 0; u < 8; ++u) {
    units.push_back({"block" + std::to_string(u), {{"w", {per_unit / 1024, 1024}}, {"b", {1024}}}});
  }
  std::vector<double> save_s, raw_w_s, load_s, raw_r_s, stall_s, async_s;
  std::size_t total_bytes = 0;
  std::mutex mu;
  try {
    ThreadGroup::run(o.ranks, [&](Communicator& comm) {
      auto make = [&] {
        auto e = std::make_unique<Engine>(comm, cfg);
        for (const UnitSpec& s : units) e->add_unit(s);
        return e;
      };
      auto e = make();
      std::mt19937 rng(1);
      std::normal_distribution<float> d(0.0f, 0.02f);
      for (UnitId u = 0; u < e->num_units(); ++u) {
        for (std::size_t p = 0; p < units[static_cast<std::size_t>(u)].params.size(); ++p) {
          std::vector<float> v(units[static_cast<std::size_t>(u)].params[p].numel());
          for (float& x : v) x = d(rng);
          e->set_param(u, static_cast<int>(p), v.data(), v.size());
        }
      }
      std::vector<char> buf(std::size_t{8} << 20, 7);
      const std::string raw = root + "/raw/rank-" + std::to_string(comm.rank());
      for (int rep = 0; rep < o.reps; ++rep) {
        const std::string dir = root + "/ckpt";
        // save
        comm.barrier();
        auto t0 = Clock::now();
        ckpt::SaveInfo info;
        {
          ckpt::Saver saver(*e, {.dir = dir, .keep = 1});
          info = saver.save("bench");
        }
        comm.barrier();
        const double ts = since(t0);
        float bytes = static_cast<float>(info.bytes) / 1e6f;  // MB, summed over ranks
        comm.all_reduce(&bytes, &bytes, 1, DType::kF32, ReduceOp::kSum);
        // raw write of this rank's bytes
        comm.barrier();
        t0 = Clock::now();
        raw_write(raw, info.bytes, buf);
        comm.barrier();
        const double trw = since(t0);
        // load (cold)
        auto fresh = make();
        fresh->param_shards();  // laid out before the clock starts
        if (comm.rank() == 0) drop_tree(dir);
        comm.barrier();
        t0 = Clock::now();
        ckpt::load(*fresh, dir);
        comm.barrier();
        const double tl = since(t0);
        fresh.reset();
        // raw read (cold)
        drop_cache(raw);
        comm.barrier();
        t0 = Clock::now();
        raw_read(raw, buf);
        comm.barrier();
        const double trr = since(t0);
        // async: the stall and the full time
        comm.barrier();
        t0 = Clock::now();
        ckpt::Saver saver(*e, {.dir = dir, .keep = 1, .async = true});
        saver.save("bench");
        const double stall = since(t0);
        saver.wait();
        const double full = since(t0);
        if (comm.rank() == 0) {
          std::lock_guard<std::mutex> lock(mu);
          total_bytes = static_cast<std::size_t>(bytes * 1e6f);
          save_s.push_back(ts);
          raw_w_s.push_back(trw);
          load_s.push_back(tl);
          raw_r_s.push_back(trr);
          stall_s.push_back(stall);
          async_s.push_back(full);
          std::printf(
              "rep %d: save %.3f s, raw write %.3f s, load %.3f s, raw read %.3f s, "
              "async stall %.3f s of %.3f s\n",
              rep, ts, trw, tl, trr, stall, full);
          std::fflush(stdout);
        }
      }
    });
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "bench_ckpt: %s\n", ex.what());
    fs::remove_all(root);
    return 2;
  }
  fs::remove_all(root);
  const double gb = static_cast<double>(total_bytes) / 1e9;
  const double s = median(save_s), rw = median(raw_w_s), l = median(load_s), rr = median(raw_r_s);
  const double st = median(stall_s), fa = median(async_s);
  std::printf(
      "bench_ckpt: %.0fM parameters, %d ranks, stage 2 bf16 AdamW, %.3f GB of state, "
      "median of %d\n",
      o.mparams, o.ranks, gb, o.reps);
  std::printf("  save   %.3f s  %.2f GB/s | raw write %.3f s  %.2f GB/s | save / raw time %.2f\n",
              s, gb / s, rw, gb / rw, s / rw);
  std::printf("  load   %.3f s  %.2f GB/s | raw read  %.3f s  %.2f GB/s | load / raw time %.2f\n",
              l, gb / l, rr, gb / rr, l / rr);
  std::printf("  async  step stall %.3f s of %.3f s full save (%.1f%%)\n", st, fa, 100.0 * st / fa);
  return 0;
} catch (...) {
  return zero::report_exception("bench_ckpt");
}
