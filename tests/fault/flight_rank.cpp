// The program the flight-recorder test (mpi_flight_test.cpp) runs under mpirun: three steps of a
// 4-unit model's collectives on the world communicator (gather units 0..3, then reduce-scatter
// 3..0, each tagged with its unit and under its engine-like phase), the flight recorder writing
// to <dir>. At step 1, before unit 1's reduce-scatter (seq 14), rank 1 meets its fault:
//   stop  writes its pid to <dir>/stopped.pid, stops itself (SIGSTOP) and, when continued,
//         stays stuck (pause) so that its record shows where it stopped;
//   kill  raise(SIGKILL).
// The other ranks time out at seq 14 after <comm_timeout_s> (the collectives before it have
// 600 s) and write their records.
// usage: flight_rank <stop|kill> <comm_timeout_s> <dir>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "zero/comm/comm.hpp"

namespace {

using namespace zero;

void fault(const std::string& action, const std::string& dir) {
  std::fprintf(stderr, "FLIGHT-FAULT rank 1 %s\n", action.c_str());
  if (action == "kill") ::raise(SIGKILL);
  const std::string path = dir + "/stopped.pid";
  {
    std::ofstream f(path + ".tmp");
    f << ::getpid() << '\n';
  }
  std::filesystem::rename(path + ".tmp", path);
  ::raise(SIGSTOP);
  for (;;) ::pause();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s <stop|kill> <comm_timeout_s> <dir>\n", argv[0]);
    return 2;
  }
  const std::string action = argv[1];
  const std::string dir = argv[3];
  try {
    CommOptions options;
    options.backend = "mpi";
    // Generous until the collective rank 1 never joins: only that one may time out, however
    // busy the machine.
    options.timeout_s = 600;
    options.flight_recorder = 32;
    options.flight_dir = dir;
    auto c = make_communicator(options);
    const auto n = static_cast<std::size_t>(c->size());
    std::vector<float> shard(64, 1.0f), full(64 * n, 1.0f);
    for (int step = 0; step < 3; ++step) {
      for (int u = 0; u < 4; ++u) {
        c->set_phase("gather", u);
        c->tag_next(u);
        c->all_gather(shard.data(), full.data(), 64, DType::kF32);
      }
      for (int u = 3; u >= 0; --u) {
        c->set_phase("backward", u);
        if (step == 1 && u == 1) {
          if (c->rank() == 1) fault(action, dir);
          c->set_timeout_s(std::atof(argv[2]));
        }
        c->tag_next(u);
        c->reduce_scatter(full.data(), shard.data(), 64, DType::kF32, ReduceOp::kSum);
      }
    }
    std::fprintf(stderr, "FLIGHT-DONE rank %d\n", c->rank());
  } catch (const Error& e) {
    std::fprintf(stderr, "FLIGHT-ERROR %s\n", e.what());
    return 1;
  }
  return 0;
}
