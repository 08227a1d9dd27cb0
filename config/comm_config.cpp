// The adapter from the training Config to CommOptions (include/zero/config/comm_config.hpp).
#include "zero/config/comm_config.hpp"

#include <utility>

namespace zero {

CommOptions comm_options(const Config& config, CommOptions base) {
  if (base.backend.empty()) base.backend = config.comm_backend;
  base.timeout_s = config.comm_timeout_s;
  base.debug = config.comm_debug == "detail" ? CommDebug::kDetail : CommDebug::kOff;
  base.flight_recorder = config.comm_flight_recorder;
  base.flight_dir = config.comm_flight_dir;
  return base;
}

std::unique_ptr<Communicator> make_communicator(const Config& config, const CommOptions& options) {
  return make_communicator(comm_options(config, options));
}

}  // namespace zero
