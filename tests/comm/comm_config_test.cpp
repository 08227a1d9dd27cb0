// The adapter from the training Config to CommOptions (zero/config/comm_config.hpp): which setting
// wins, and that the two default timeouts agree.
#include <gtest/gtest.h>

#include "zero/comm/comm.hpp"
#include "zero/config/comm_config.hpp"

namespace zero::test {
namespace {

TEST(CommConfig, DefaultTimeoutsAgree) {
  // config.hpp cannot name kDefaultCommTimeoutS (it does not include comm.hpp): this holds them
  // together.
  EXPECT_EQ(kDefaultCommTimeoutS, Config{}.comm_timeout_s);
  EXPECT_EQ(kDefaultCommTimeoutS, CommOptions{}.timeout_s);
  EXPECT_EQ("", CommOptions{}.backend);  // not set: make_communicator() takes it as auto
}

TEST(CommConfig, BackendComesFromTheConfigUnlessSetInTheOptions) {
  Config config;
  config.comm_backend = "mpi";
  EXPECT_EQ("mpi", comm_options(config).backend);
  CommOptions base;
  base.backend = "thread";
  EXPECT_EQ("thread", comm_options(config, base).backend);
  base.backend = "auto";  // explicit auto wins over the config too
  EXPECT_EQ("auto", comm_options(config, base).backend);
}

TEST(CommConfig, TimeoutComesFromTheConfigAndTheRestFromTheOptions) {
  const Config config = parse_config(R"({"comm_timeout_s": 0.25, "comm_backend": "thread"})");
  CommOptions base;
  base.rank = 0;
  base.size = 1;
  base.local_rank = 0;
  base.device_buffers = true;
  base.device = 3;
  base.rendezvous_file = "/tmp/id";
  base.timeout_s = 99;
  const CommOptions o = comm_options(config, base);
  EXPECT_EQ(0.25, o.timeout_s);
  EXPECT_EQ("thread", o.backend);
  EXPECT_EQ(0, o.rank);
  EXPECT_EQ(1, o.size);
  EXPECT_EQ(0, o.local_rank);
  EXPECT_TRUE(o.device_buffers);
  EXPECT_EQ(3, o.device);
  EXPECT_EQ("/tmp/id", o.rendezvous_file);
}

TEST(CommConfig, DebugAndFlightRecorderComeFromTheConfig) {
  EXPECT_EQ(CommDebug::kOff, comm_options(Config{}).debug);
  EXPECT_EQ(CommOptions{}.flight_recorder, comm_options(Config{}).flight_recorder);
  const Config config = parse_config(
      R"({"comm_debug": "detail", "comm_flight_recorder": 16, "comm_flight_dir": "flight"})");
  const CommOptions o = comm_options(config);
  EXPECT_EQ(CommDebug::kDetail, o.debug);
  EXPECT_EQ(16u, o.flight_recorder);
  EXPECT_EQ("flight", o.flight_dir);
  EXPECT_THROW(parse_config(R"({"comm_debug": "info"})"), Error);
  EXPECT_THROW(parse_config(R"({"comm_flight_recorder": -1})"), Error);
  CommOptions single;
  single.rank = 0;
  single.size = 1;
  Config on = config;
  on.comm_flight_dir.clear();  // no signal handlers in this test process
  auto c = make_communicator(on, single);
  EXPECT_EQ(CommDebug::kDetail, c->debug());
}

TEST(CommConfig, MakeCommunicatorFromAConfig) {
  Config config;
  config.comm_backend = "thread";
  config.comm_timeout_s = 7;
  CommOptions single;
  single.rank = 0;
  single.size = 1;
  auto c = make_communicator(config, single);
  EXPECT_EQ("thread", c->backend());
  EXPECT_EQ(7.0, c->timeout_s());
  config.comm_backend = "bogus";  // Config validation is bypassed here; the factory still checks
  try {
    make_communicator(config, single);
    ADD_FAILURE() << "backend 'bogus' accepted";
  } catch (const Error& e) {
    EXPECT_EQ(ErrorCode::kConfig, e.code());
    EXPECT_NE(std::string::npos, e.message().find("'bogus'")) << e.what();
  }
}

}  // namespace
}  // namespace zero::test
