// ckpt/agree.hpp — all ranks agree on the outcome of a local phase (verification, writing):
// if any rank failed, every rank throws the error of the lowest failing rank (its code and
// message, broadcast), so no rank goes on while another has given up.
#pragma once

#include <exception>

#include "zero/comm/comm.hpp"

namespace zero::ckpt::detail {

// Collective. `local`: this rank's failure (null: it succeeded).
void agree(Communicator& comm, const std::exception_ptr& local);

}  // namespace zero::ckpt::detail
