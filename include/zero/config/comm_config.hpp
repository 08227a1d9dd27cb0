// zero/config/comm_config.hpp — communicators from a training Config: the adapter above
// zero/comm/comm.hpp.
//
// The communicator layer takes its own CommOptions and knows nothing of Config; this header maps
// the Config keys that concern it (comm_backend, comm_timeout_s) onto CommOptions, so that a
// trainer still makes its communicator in one line:
//   auto comm = zero::make_communicator(config);          // launcher's rank / size
//   auto comm = zero::make_communicator(config, options); // plus explicit CommOptions
//
// Thread safety: plain functions of their arguments; make_communicator() as in comm.hpp.
#pragma once

#include <memory>

#include "zero/comm/comm.hpp"
#include "zero/config/config.hpp"

namespace zero {

// `base` with the Config's communicator settings filled in:
//   backend    config.comm_backend, unless base.backend is set (not empty), which wins;
//   timeout_s  config.comm_timeout_s (set it on the result to override).
// Every other field is base's. Does not validate (make_communicator() does).
CommOptions comm_options(const Config& config, CommOptions base = {});

// make_communicator(comm_options(config, options)).
std::unique_ptr<Communicator> make_communicator(const Config& config,
                                                const CommOptions& options = {});

}  // namespace zero
