// The adapter from the training Config to CommOptions (include/zero/comm_config.hpp).
#include "zero/comm_config.hpp"

#include <utility>

namespace zero {

CommOptions comm_options(const Config& config, CommOptions base) {
  if (base.backend.empty()) base.backend = config.comm_backend;
  base.timeout_s = config.comm_timeout_s;
  return base;
}

std::unique_ptr<Communicator> make_communicator(const Config& config, const CommOptions& options) {
  return make_communicator(comm_options(config, options));
}

}  // namespace zero
