// plan/calibrate_parts.hpp — what calibrate() (plan/calibrate.cpp) shares with its CUDA part
// (plan/calibrate_device.cpp). The library's own; not a public header.
#pragma once

#include <cstddef>
#include <string>

#include "zero/comm/comm.hpp"
#include "zero/plan/profile.hpp"

namespace zero::detail {

// One `op` ("all_reduce", "reduce_scatter", "all_gather") of f32 elements, `count` per rank of
// the whole buffer (all_reduce: send and recv; reduce_scatter: send; all_gather: recv; a multiple
// of c.size()), between a barrier before and one after: the seconds it took on this rank.
double timed_collective(Communicator& c, const std::string& op, const void* send, void* recv,
                        std::size_t count);

// calibrate()'s CUDA part: fills p.cuda where a device exists (plan/calibrate_device.cpp).
void calibrate_cuda(const CalibrateOptions& options, MachineProfile& p);

}  // namespace zero::detail
