// nvme_train_child — the process nvme_fault_test signals, fills and starves: trains the test MLP
// with the optimizer state (and, at stage 3, the parameter shards) in swap files under --dir.
//
//   nvme_train_child --dir DIR [--stage S] [--ranks N] [--chunk ELEMS] [--steps K (0: until
//                    killed)] [--aio io_uring|threads] [--pause-after K] [--fsize BYTES]
//
// stdout, one line each, flushed: "handlers SIGINT=<default|other> SIGTERM=..." once the engines
// exist (the library must install none), "step <k>" after each step, "paused" after step
// --pause-after (then it waits for a line on stdin), "done" at the end. An error: "error: <what>"
// on stderr, exit status 2. --fsize sets RLIMIT_FSIZE (SIGXFSZ ignored) so a write fails EFBIG.
#include <sys/resource.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <mutex>
#include <string>

#include "common/mlp_training.hpp"
#include "zero/comm/comm.hpp"
#include "zero/core/error.hpp"
#include "zero/engine/engine.hpp"

namespace {

const char* disposition(int sig) {
  struct sigaction sa {};
  ::sigaction(sig, nullptr, &sa);
  return sa.sa_handler == SIG_DFL ? "default" : "other";
}

int run(int argc, char** argv) {
  zero::testing::RunSpec s;
  s.stage = 2;
  s.ranks = 1;
  s.offload_buffers = 2;
  s.offload_chunk = 64;
  s.offload_device = "nvme";
  int steps = 0, pause_after = -1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--dir") {
      s.nvme_path = v;
    } else if (a == "--stage") {
      s.stage = std::stoi(v);
    } else if (a == "--ranks") {
      s.ranks = std::stoi(v);
    } else if (a == "--chunk") {
      s.offload_chunk = std::stol(v);
    } else if (a == "--steps") {
      steps = std::stoi(v);
    } else if (a == "--aio") {
      s.aio_engine = v;
    } else if (a == "--pause-after") {
      pause_after = std::stoi(v);
    } else if (a == "--fsize") {
      std::signal(SIGXFSZ, SIG_IGN);
      const rlim_t n = std::stoull(v);
      const rlimit lim{n, n};
      if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) std::perror("setrlimit");
    } else {
      std::fprintf(stderr, "nvme_train_child: unknown argument %s\n", a.c_str());
      return 64;
    }
  }
  if (s.stage == 3) s.offload_param = "nvme";
  const zero::Config cfg = zero::testing::make_config(s);
  const zero::testing::Mlp mlp(zero::testing::kDims);
  std::mutex out_mu;
  auto say = [&](const std::string& line) {
    std::lock_guard<std::mutex> lk(out_mu);
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  };
  zero::ThreadGroup::run(s.ranks, [&](zero::Communicator& comm) {
    zero::Engine e(comm, cfg);
    mlp.declare(e);
    mlp.init(e, 42);
    comm.barrier();
    if (comm.rank() == 0) {
      say(std::string("handlers SIGINT=") + disposition(SIGINT) +
          " SIGTERM=" + disposition(SIGTERM));
    }
    for (int step = 0; steps == 0 || step < steps; ++step) {
      mlp.micro_step(e, zero::testing::make_batch(mlp.in(), mlp.out(), zero::testing::kRows, step,
                                                  0, comm.rank()));
      e.step();
      comm.barrier();
      if (comm.rank() != 0) {
        if (step + 1 == pause_after) comm.barrier();
        continue;
      }
      say("step " + std::to_string(step + 1));
      if (step + 1 == pause_after) {
        say("paused");
        std::string line;
        std::getline(std::cin, line);
        comm.barrier();
      }
    }
  });
  say("done");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
