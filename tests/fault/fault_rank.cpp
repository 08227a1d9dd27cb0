// tests/fault/fault_rank.cpp — the program the fault tests run: two ranks train the engine's
// MLP and rank 1 meets a fault at a chosen point of step 1.
//
//   fault_rank <mpi|thread> <point> <action> <comm_timeout_s>
//     mpi     one rank of an mpirun job (MPI backend); thread: both ranks in-process
//             (ThreadGroup::run)
//     point   forward       stage 3, before rank 1's forward (the others wait in its all_gather)
//             backward      stage 2, when rank 1 issues its 2nd reduce_scatter (the last unit's
//                           gradients are handed over, their reduce_scatter in flight)
//             step-norm     stage 2, in the optimizer step: at the all_gather of the gradient
//                           statistics (norm for clipping, overflow flag)
//             step-params   stage 2, in the optimizer step: at the all_gather of the updated
//                           parameters
//     action  kill (raise(SIGKILL)), throw, sleep (forever), spin (a computation that never ends)
//
// Lines for the driver (stderr, one write each; t is CLOCK_REALTIME in seconds, comparable
// across the processes of one machine):
//   FAULT-INJECT rank 1 <action> at <point> (<collective>) t=<t>
//   FAULT-ERROR rank <r> code=<code> t=<t>: <message>     a rank's training ended in an error
//   FAULT-RUN-ERROR code=<code> t=<t>: <message>          thread: what ThreadGroup::run threw
//   FAULT-DONE rank <r>                                    trained all steps (the fault missed)
// Exit status: 1 after an error, 0 when every step trained, 2 on bad arguments.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>

#include "common/mlp_training.hpp"
#include "fault/fault_comm.hpp"
#include "zero/comm/comm.hpp"
#include "zero/engine/engine.hpp"

namespace {

using namespace zero;
namespace zt = zero::testing;

double realtime_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void say(const std::string& line) {
  const std::string l = line + "\n";
  if (::write(2, l.data(), l.size()) < 0) std::perror("write");
}

struct Fault {
  std::string point;
  std::string action;
};

void act(const Fault& f, int rank, const std::string& what) {
  say(detail::cat("FAULT-INJECT rank ", rank, " ", f.action, " at ", f.point, " (", what,
                  ") t=", std::to_string(realtime_s())));
  if (f.action == "kill") {
    ::raise(SIGKILL);
  } else if (f.action == "throw") {
    throw std::runtime_error("injected fault at " + f.point);
  } else if (f.action == "sleep") {
    for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
  } else {  // spin: a computation that never ends
    volatile unsigned long x = 0;
    for (;;) x = x + 1;
  }
}

// Stage 3 gathers parameters in forward; stage 2 has no collective in forward and backward
// but the gradients' reduce_scatter, so what the others wait in is known.
int stage_of(const std::string& point) { return point == "forward" ? 3 : 2; }

// One rank's training: 3 steps; rank 1 meets the fault in step 1.
void train(Communicator& world, const Fault& f) {
  zt::FaultComm comm(world);
  const int stage = stage_of(f.point);
  // overlap: gradients are reduce-scattered (asynchronously) as backward hands them over.
  zt::RunSpec spec{.stage = stage, .ranks = world.size(), .clip = true, .overlap = true};
  const Config cfg = zt::make_config(spec);
  zt::Mlp mlp(zt::kDims);
  Engine e(comm, cfg);
  mlp.declare(e);
  mlp.init(e, 42);
  const int r = world.rank();
  for (int step = 0; step < 3; ++step) {
    if (step == 1 && r == 1) {
      auto action = [&](const std::string& what) { act(f, r, what); };
      if (f.point == "forward") action("before any collective of the step");
      if (f.point == "backward") comm.arm(Collective::kReduceScatter, 2, action);
      if (f.point == "step-norm") comm.arm(Collective::kAllGather, 1, action);
      if (f.point == "step-params") comm.arm(Collective::kAllGather, 2, action);
    }
    mlp.micro_step(e, zt::make_batch(mlp.in(), mlp.out(), zt::kRows, step, 0, r));
    e.step();
  }
  say(detail::cat("FAULT-DONE rank ", r));
}

void train_reporting(Communicator& world, const Fault& f) {
  try {
    train(world, f);
  } catch (const Error& e) {
    say(detail::cat("FAULT-ERROR rank ", world.rank(), " code=", to_string(e.code()),
                    " t=", std::to_string(realtime_s()), ": ", e.message()));
    throw;
  } catch (const std::exception& e) {
    say(detail::cat("FAULT-ERROR rank ", world.rank(),
                    " code=other t=", std::to_string(realtime_s()), ": ", e.what()));
    throw;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s <mpi|thread> <point> <action> <comm_timeout_s>\n", argv[0]);
    return 2;
  }
  const std::string backend = argv[1];
  const Fault fault{argv[2], argv[3]};
  const double timeout_s = std::atof(argv[4]);
  try {
    if (backend == "mpi") {
      CommOptions options;
      options.backend = "mpi";
      options.timeout_s = timeout_s;
      auto world = make_communicator(options);
      train_reporting(*world, fault);
    } else {
      ThreadGroup::run(
          2, [&](Communicator& c) { train_reporting(c, fault); }, timeout_s);
    }
  } catch (const Error& e) {
    if (backend != "mpi") {
      say(detail::cat("FAULT-RUN-ERROR code=", to_string(e.code()),
                      " t=", std::to_string(realtime_s()), ": ", e.message()));
    }
    return 1;
  } catch (const std::exception& e) {
    if (backend != "mpi") {
      say(detail::cat("FAULT-RUN-ERROR code=other t=", std::to_string(realtime_s()), ": ",
                      e.what()));
    }
    return 1;
  }
  return 0;
}
