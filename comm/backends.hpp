// comm/backends.hpp — constructors of the process-level backends, for make_communicator().
//
// Each is defined in its backend file, compiled only when the backend is built (MPI:
// ZERO_WITH_MPI, NCCL: ZERO_WITH_CUDA); launch.cpp calls them behind the same conditions.
//
// Thread safety: call from the thread that will use the communicator.
#pragma once

#include <memory>
#include <string>

#include "zero/comm/comm.hpp"

namespace zero::detail {

// The world communicator over MPI_COMM_WORLD (initialising MPI with MPI_THREAD_MULTIPLE if the
// application has not). Throws kConfig when MPI's rank / size disagree with `launch` (unless
// launch.source is "none"), kCommunication when MPI cannot start.
std::unique_ptr<Communicator> make_mpi_communicator(const LaunchInfo& launch, double timeout_s);

// The world NCCL communicator of this process's GPU; bootstraps the unique id through MPI (under
// an MPI launcher, when built with MPI), a TCP rendezvous at MASTER_ADDR:MASTER_PORT or a shared
// file. Throws kCuda without a usable device, kCommunication when NCCL fails, kConfig when no
// bootstrap path is configured for size > 1.
std::unique_ptr<Communicator> make_nccl_communicator(const LaunchInfo& launch,
                                                     const CommOptions& options, double timeout_s);

}  // namespace zero::detail
