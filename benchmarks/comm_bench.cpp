// bench_comm — bandwidth of reduce_scatter / all_gather / all_reduce, 1 KiB .. 256 MiB (f32).
//
//   ./bench_comm                         in-process backend at N = 2 and 4 ranks (threads)
//   mpirun -np 4 ./bench_comm            MPI backend, beside raw MPI on the same buffers
//
// Size = the per-rank buffer of nccl-tests: the send buffer of reduce_scatter, the receive
// buffer of all_gather, the buffer of all_reduce. With t the time of one collective:
//   algbw_GBps = size / t
//   busbw_GBps = algbw * (N-1)/N (reduce_scatter, all_gather), algbw * 2 (N-1)/N (all_reduce)
//                (nccl-tests' bus bandwidth, comparable across N and with NCCL / MPI figures)
//
// Each benchmark iteration times `reps` back-to-back collectives of ours and, in the same
// iteration, the reference on the same buffers, so both see the same machine state.
//   in-process: the memcpy ceiling = N threads each copying `size` bytes at once (GB/s per
//     thread). In shared memory every rank of these collectives moves about one buffer's worth
//     of memory traffic (all_gather: copies size bytes; reduce_scatter: reads size bytes from
//     the N senders, writes size/N; all_reduce: reads its 1/N piece from N senders and writes
//     it to N receivers), so a copy of the buffer bounds algbw: ratio = algbw / ceiling.
//   MPI: MPI_Reduce_scatter_block / MPI_Allgather / MPI_Allreduce (raw_GBps, bus bandwidth) and
//     their nonblocking forms + MPI_Wait (raw_nb_GBps); ratio = busbw / raw.
// Under MPI only rank 0 prints; the iteration count is fixed so all ranks run the same loop.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "zero/comm/comm.hpp"
#include "zero/core/error.hpp"

#if ZERO_WITH_MPI
#include <mpi.h>
#endif

namespace {

using zero::Collective;
using zero::Communicator;
using zero::DType;
using zero::ReduceOp;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Enough repetitions that one timed block moves ~256 MiB (at least 1).
int reps_for(std::size_t bytes) {
  return static_cast<int>(std::clamp<std::size_t>((std::size_t{256} << 20) / bytes, 1, 2000));
}

double bus_factor(Collective op, int n) {
  const double f = static_cast<double>(n - 1) / n;
  return op == Collective::kAllReduce ? 2 * f : f;
}

// One rank's buffers for a collective on a per-rank buffer of `bytes`.
struct RankBuffers {
  std::vector<float> send, recv;
  RankBuffers(Collective op, std::size_t elems, int n) {
    const std::size_t shard = elems / n;
    switch (op) {
      case Collective::kReduceScatter: send.assign(elems, 1.0f), recv.assign(shard, 0.0f); break;
      case Collective::kAllGather: send.assign(shard, 1.0f), recv.assign(elems, 0.0f); break;
      default: send.assign(elems, 1.0f), recv.assign(elems, 0.0f);
    }
  }
};

void run_ours(Communicator& c, Collective op, RankBuffers& b, std::size_t elems) {
  const std::size_t shard = elems / c.size();
  switch (op) {
    case Collective::kReduceScatter:
      c.reduce_scatter(b.send.data(), b.recv.data(), shard, DType::kF32, ReduceOp::kSum);
      break;
    case Collective::kAllGather:
      c.all_gather(b.send.data(), b.recv.data(), shard, DType::kF32);
      break;
    default: c.all_reduce(b.send.data(), b.recv.data(), elems, DType::kF32, ReduceOp::kSum);
  }
}

// Sets algbw / busbw of ours and the reference figure with the ratio.
void set_counters(benchmark::State& state, Collective op, int n, double ops, double size_bytes,
                  double ours_s, double ref_bytes, double ref_s, const char* ref_name,
                  bool ratio_of_algbw) {
  const double algbw = size_bytes / ours_s / 1e9;
  const double busbw = algbw * bus_factor(op, n);
  const double ref = ref_bytes / ref_s / 1e9;
  state.counters["us_per_op"] = ours_s / ops * 1e6;
  state.counters["algbw_GBps"] = algbw;
  state.counters["busbw_GBps"] = busbw;
  state.counters[ref_name] = ref;
  state.counters["ratio"] = (ratio_of_algbw ? algbw : busbw) / ref;
}

// ---------------------------------------------------------------------------------------------
// in-process

void BM_Thread(benchmark::State& state, Collective op) {
  const int n = static_cast<int>(state.range(0));
  const std::size_t bytes = static_cast<std::size_t>(state.range(1));
  const std::size_t elems = std::max<std::size_t>(bytes / 4 / n, 1) * n;
  const int reps = reps_for(bytes);
  std::vector<RankBuffers> buffers;
  std::vector<std::vector<char>> copy_src, copy_dst;
  for (int r = 0; r < n; ++r) {
    buffers.emplace_back(op, elems, n);
    copy_src.emplace_back(elems * 4, 1);
    copy_dst.emplace_back(elems * 4, 0);
  }
  double ours_s = 0, ceiling_s = 0;
  for (auto _ : state) {
    double t_ours = 0;
    zero::ThreadGroup::run(n, [&](Communicator& c) {
      c.barrier();
      const auto t0 = Clock::now();
      for (int k = 0; k < reps; ++k) run_ours(c, op, buffers[c.rank()], elems);
      c.barrier();
      if (c.rank() == 0) t_ours = since(t0);
    });
    // The ceiling: the same N threads each copying `bytes` at the same time.
    double t_copy = 0;
    std::barrier sync(n);
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        sync.arrive_and_wait();
        const auto t0 = Clock::now();
        for (int k = 0; k < reps; ++k) {
          std::memcpy(copy_dst[r].data(), copy_src[r].data(), copy_src[r].size());
          benchmark::ClobberMemory();
        }
        sync.arrive_and_wait();
        if (r == 0) t_copy = since(t0);
      });
    }
    for (auto& t : threads) t.join();
    ours_s += t_ours;
    ceiling_s += t_copy;
    state.SetIterationTime(t_ours);  // one iteration = `reps` collectives
  }
  const double bytes_moved = static_cast<double>(state.iterations()) * reps * elems * 4;
  set_counters(state, op, n, bytes_moved / (elems * 4.0), bytes_moved, ours_s, bytes_moved,
               ceiling_s, "ceiling_GBps", true);
}

void thread_args(benchmark::internal::Benchmark* b) {
  for (int n : {2, 4}) {
    for (std::int64_t bytes = 1 << 10; bytes <= (std::int64_t{256} << 20); bytes *= 4) {
      b->Args({n, bytes});
    }
  }
  b->ArgNames({"N", "bytes"})->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
}

// ---------------------------------------------------------------------------------------------
// MPI: ours beside raw MPI on the same buffers

#if ZERO_WITH_MPI
Communicator* g_mpi = nullptr;
MPI_Comm g_raw = MPI_COMM_NULL;

void raw_mpi(Collective op, RankBuffers& b, std::size_t elems, int n, bool nonblocking) {
  const int shard = static_cast<int>(elems / n);
  MPI_Request req = MPI_REQUEST_NULL;
  switch (op) {
    case Collective::kReduceScatter:
      if (nonblocking) {
        MPI_Ireduce_scatter_block(b.send.data(), b.recv.data(), shard, MPI_FLOAT, MPI_SUM, g_raw,
                                  &req);
      } else {
        MPI_Reduce_scatter_block(b.send.data(), b.recv.data(), shard, MPI_FLOAT, MPI_SUM, g_raw);
      }
      break;
    case Collective::kAllGather:
      if (nonblocking) {
        MPI_Iallgather(b.send.data(), shard, MPI_FLOAT, b.recv.data(), shard, MPI_FLOAT, g_raw,
                       &req);
      } else {
        MPI_Allgather(b.send.data(), shard, MPI_FLOAT, b.recv.data(), shard, MPI_FLOAT, g_raw);
      }
      break;
    default:
      if (nonblocking) {
        MPI_Iallreduce(b.send.data(), b.recv.data(), static_cast<int>(elems), MPI_FLOAT, MPI_SUM,
                       g_raw, &req);
      } else {
        MPI_Allreduce(b.send.data(), b.recv.data(), static_cast<int>(elems), MPI_FLOAT, MPI_SUM,
                      g_raw);
      }
  }
  if (nonblocking) MPI_Wait(&req, MPI_STATUS_IGNORE);
}

void BM_Mpi(benchmark::State& state, Collective op) {
  Communicator& c = *g_mpi;
  const int n = c.size();
  const std::size_t bytes = static_cast<std::size_t>(state.range(0));
  const std::size_t elems = std::max<std::size_t>(bytes / 4 / n, 1) * n;
  const int reps = std::max(1, reps_for(bytes) / 8);
  RankBuffers b(op, elems, n);
  double ours_s = 0, raw_s = 0, raw_nb_s = 0;
  // Ours goes first in even iterations and last in odd ones, so neither always runs warmer.
  auto time_block = [&](auto&& fn) {
    MPI_Barrier(g_raw);
    const auto t0 = Clock::now();
    for (int k = 0; k < reps; ++k) fn();
    MPI_Barrier(g_raw);
    return since(t0);
  };
  bool ours_first = true;
  for (auto _ : state) {
    double t_ours = 0;
    if (ours_first) t_ours = time_block([&] { run_ours(c, op, b, elems); });
    raw_s += time_block([&] { raw_mpi(op, b, elems, n, false); });
    raw_nb_s += time_block([&] { raw_mpi(op, b, elems, n, true); });
    if (!ours_first) t_ours = time_block([&] { run_ours(c, op, b, elems); });
    ours_first = !ours_first;
    ours_s += t_ours;
    state.SetIterationTime(t_ours);  // one iteration = `reps` collectives
  }
  const double bytes_moved = static_cast<double>(state.iterations()) * reps * elems * 4;
  const double bus = bus_factor(op, n) * bytes_moved;
  set_counters(state, op, n, bytes_moved / (elems * 4.0), bytes_moved, ours_s, bus, raw_s,
               "raw_GBps", false);
  state.counters["raw_nb_GBps"] = bus / raw_nb_s / 1e9;
  state.counters["N"] = n;
}

void mpi_args(benchmark::internal::Benchmark* b) {
  for (std::int64_t bytes = 1 << 10; bytes <= (std::int64_t{256} << 20); bytes *= 4) b->Arg(bytes);
  // A fixed iteration count: every rank must run the same number of collectives.
  b->ArgName("bytes")->UseManualTime()->Iterations(4)->Unit(benchmark::kMicrosecond);
}
#endif

class NullReporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

}  // namespace

int main(int argc, char** argv) try {
  benchmark::Initialize(&argc, argv);
  const zero::LaunchInfo launch = zero::detect_launch();
  std::unique_ptr<Communicator> mpi;
#if ZERO_WITH_MPI
  if (launch.mpi_launcher) {
    zero::CommOptions options;
    options.backend = "mpi";
    mpi = zero::make_communicator(options);
    g_mpi = mpi.get();
    MPI_Comm_dup(MPI_COMM_WORLD, &g_raw);
    benchmark::RegisterBenchmark("BM_MpiReduceScatter", BM_Mpi, Collective::kReduceScatter)
        ->Apply(mpi_args);
    benchmark::RegisterBenchmark("BM_MpiAllGather", BM_Mpi, Collective::kAllGather)
        ->Apply(mpi_args);
    benchmark::RegisterBenchmark("BM_MpiAllReduce", BM_Mpi, Collective::kAllReduce)
        ->Apply(mpi_args);
  }
#endif
  if (!mpi) {
    benchmark::RegisterBenchmark("BM_ThreadReduceScatter", BM_Thread, Collective::kReduceScatter)
        ->Apply(thread_args);
    benchmark::RegisterBenchmark("BM_ThreadAllGather", BM_Thread, Collective::kAllGather)
        ->Apply(thread_args);
    benchmark::RegisterBenchmark("BM_ThreadAllReduce", BM_Thread, Collective::kAllReduce)
        ->Apply(thread_args);
  }
  NullReporter quiet;
  if (mpi && mpi->rank() != 0) {
    benchmark::RunSpecifiedBenchmarks(&quiet);
  } else {
    benchmark::RunSpecifiedBenchmarks();
  }
  benchmark::Shutdown();
#if ZERO_WITH_MPI
  if (g_raw != MPI_COMM_NULL) MPI_Comm_free(&g_raw);
#endif
  return 0;
} catch (...) {
  return zero::report_exception("bench_comm");
}
