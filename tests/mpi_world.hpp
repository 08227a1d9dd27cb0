// tests/mpi_world.hpp — the MPI world communicator the MPI tests share (MPI is initialised once
// per process; 120 s per collective wait).
#pragma once

#include <memory>

#include "zero/comm/comm.hpp"

namespace zero::testing {

inline Communicator& mpi_world() {
  static std::unique_ptr<Communicator> comm = [] {
    CommOptions options;
    options.timeout_s = 120;
    options.backend = "mpi";  // also when started without mpirun: a world of one
    return make_communicator(options);
  }();
  return *comm;
}

}  // namespace zero::testing
