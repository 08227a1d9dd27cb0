// Launch detection (torchrun / OpenMPI / PMI / Slurm variables, explicit options, conflicts) and
// the NCCL-id rendezvous over TCP and a shared file, with ranks as threads.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>

#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include "comm/rendezvous.hpp"
#include "common/temp_dir.hpp"
#include "zero/comm/comm.hpp"

namespace zero::test {
namespace {

// detect_launch with a fake environment.
LaunchInfo detect(const std::map<std::string, std::string>& env, CommOptions options = {}) {
  return detect_launch(options, [&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

std::string config_error(const std::map<std::string, std::string>& env, CommOptions options = {}) {
  try {
    detect(env, options);
  } catch (const Error& e) {
    EXPECT_EQ(ErrorCode::kConfig, e.code()) << e.what();
    return e.message();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(DetectLaunch, NoVariablesIsASingleProcess) {
  const LaunchInfo info = detect({});
  EXPECT_EQ(0, info.rank);
  EXPECT_EQ(1, info.size);
  EXPECT_EQ("none", info.source);
  EXPECT_FALSE(info.mpi_launcher);
}

TEST(DetectLaunch, ReadsEachLauncher) {
  LaunchInfo t = detect({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}});
  EXPECT_EQ(3, t.rank);
  EXPECT_EQ(8, t.size);
  EXPECT_EQ(1, t.local_rank);
  EXPECT_EQ("torchrun", t.source);
  EXPECT_FALSE(t.mpi_launcher);
  LaunchInfo o = detect({{"OMPI_COMM_WORLD_RANK", "2"},
                         {"OMPI_COMM_WORLD_SIZE", "4"},
                         {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}});
  EXPECT_EQ(2, o.rank);
  EXPECT_EQ(4, o.size);
  EXPECT_EQ("openmpi", o.source);
  EXPECT_TRUE(o.mpi_launcher);
  LaunchInfo p = detect({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}});
  EXPECT_EQ(1, p.rank);
  EXPECT_EQ("pmi", p.source);
  LaunchInfo s = detect({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "6"}, {"SLURM_LOCALID", "1"}});
  EXPECT_EQ(5, s.rank);
  EXPECT_EQ(6, s.size);
  EXPECT_EQ(1, s.local_rank);
  EXPECT_EQ("slurm", s.source);
  // A size alone (an allocation, not a launched rank) does not place the process.
  EXPECT_EQ("none", detect({{"SLURM_NTASKS", "6"}}).source);
}

TEST(DetectLaunch, RanksPerNodeComeFromEachLauncher) {
  EXPECT_EQ(0, detect({{"RANK", "3"}, {"WORLD_SIZE", "8"}}).local_size);  // not said
  EXPECT_EQ(4, detect({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_WORLD_SIZE", "4"}}).local_size);
  const LaunchInfo o = detect({{"OMPI_COMM_WORLD_RANK", "2"},
                               {"OMPI_COMM_WORLD_SIZE", "4"},
                               {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                               {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  EXPECT_EQ(2, o.local_size);
  EXPECT_EQ("OMPI_COMM_WORLD_LOCAL_SIZE=2", o.local_size_from);
  EXPECT_EQ(3, detect({{"PMI_RANK", "1"}, {"PMI_SIZE", "6"}, {"MPI_LOCALNRANKS", "3"}}).local_size);
  EXPECT_EQ(2,
            detect({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}, {"SLURM_NTASKS_PER_NODE", "2"}})
                .local_size);
  // A local size past the world, or a local rank past the local size, is refused.
  EXPECT_NE(config_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "3"}})
                .find("ranks per node out of range: LOCAL_WORLD_SIZE=3"),
            std::string::npos);
  EXPECT_NE(
      config_error(
          {{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}})
          .find("LOCAL_RANK=2"),
      std::string::npos);
  // Two launchers that disagree on it are named.
  EXPECT_NE(config_error({{"RANK", "1"},
                          {"WORLD_SIZE", "4"},
                          {"LOCAL_WORLD_SIZE", "2"},
                          {"OMPI_COMM_WORLD_RANK", "1"},
                          {"OMPI_COMM_WORLD_SIZE", "4"},
                          {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}})
                .find("conflicting ranks per node"),
            std::string::npos);
}

TEST(DetectLaunch, AgreeingSourcesAreMerged) {
  CommOptions opt;
  opt.rank = 1;
  opt.size = 2;
  const LaunchInfo info = detect({{"OMPI_COMM_WORLD_RANK", "1"},
                                  {"OMPI_COMM_WORLD_SIZE", "2"},
                                  {"SLURM_PROCID", "1"},
                                  {"SLURM_NTASKS", "2"}},
                                 opt);
  EXPECT_EQ(1, info.rank);
  EXPECT_EQ("explicit,openmpi,slurm", info.source);
}

TEST(DetectLaunch, ConflictsNameTheVariables) {
  std::string m = config_error({{"RANK", "1"},
                                {"WORLD_SIZE", "4"},
                                {"OMPI_COMM_WORLD_RANK", "2"},
                                {"OMPI_COMM_WORLD_SIZE", "4"}});
  EXPECT_NE(std::string::npos, m.find("RANK=1")) << m;
  EXPECT_NE(std::string::npos, m.find("OMPI_COMM_WORLD_RANK=2")) << m;
  m = config_error(
      {{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}});
  EXPECT_NE(std::string::npos, m.find("WORLD_SIZE=4")) << m;
  EXPECT_NE(std::string::npos, m.find("SLURM_NTASKS=2")) << m;
  CommOptions opt;
  opt.rank = 0;
  opt.size = 2;
  m = config_error({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}}, opt);
  EXPECT_NE(std::string::npos, m.find("CommOptions::rank=0")) << m;
  EXPECT_NE(std::string::npos, m.find("PMI_RANK=1")) << m;
}

TEST(DetectLaunch, MalformedValuesAreConfigErrors) {
  EXPECT_NE(std::string::npos, config_error({{"RANK", "x1"}, {"WORLD_SIZE", "2"}}).find("RANK"));
  EXPECT_NE(std::string::npos, config_error({{"RANK", "1"}, {"WORLD_SIZE", "2 "}}).find("WORLD"));
  EXPECT_NE(std::string::npos, config_error({{"RANK", "1"}}).find("WORLD_SIZE"));
  EXPECT_NE(std::string::npos, config_error({{"RANK", "2"}, {"WORLD_SIZE", "2"}}).find("range"));
  EXPECT_NE(std::string::npos, config_error({{"RANK", "0"}, {"WORLD_SIZE", "0"}}).find(">= 1"));
  EXPECT_NE(std::string::npos,
            config_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "-1"}}).find("local"));
  CommOptions only_rank;
  only_rank.rank = 1;
  EXPECT_NE(std::string::npos, config_error({}, only_rank).find("both"));
}

TEST(MakeCommunicator, AutoWithoutABackendForTheWorldSizeIsAConfigError) {
  CommOptions opt;
  opt.rank = 0;
  opt.size = 2;  // explicit, not an MPI launch, host buffers: nothing can connect the ranks
  try {
    make_communicator(opt);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(ErrorCode::kConfig, e.code()) << e.what();
    EXPECT_NE(std::string::npos, e.message().find("world size 2")) << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// rendezvous

TEST(Rendezvous, TcpHandsRankZerosBlobToEveryRank) {
  const std::string blob("\x01\x00nccl-unique-id\xff", 18);
  // A port unlikely to be taken; derived from the pid so parallel runs do not collide.
  const int port = 20000 + static_cast<int>(::getpid() % 20000);
  std::vector<std::string> got(4);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 4; ++r) {
    ranks.emplace_back([&, r] {
      got[r] = detail::tcp_broadcast("127.0.0.1", port, r, 4, r == 0 ? blob : "", 20.0);
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 4; ++r) EXPECT_EQ(blob, got[r]) << "rank " << r;
}

TEST(Rendezvous, TcpWithoutRankZeroTimesOut) {
  const int port = 40000 + static_cast<int>(::getpid() % 20000);
  try {
    detail::tcp_broadcast("127.0.0.1", port, 1, 2, "", 0.3);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(ErrorCode::kTimeout, e.code()) << e.what();
    EXPECT_NE(std::string::npos, e.message().find(std::to_string(port))) << e.what();
  }
  EXPECT_THROW(detail::tcp_broadcast("127.0.0.1", 0, 1, 2, "", 0.1), Error);
}

// A stand-in for torchrun's agent store holding MASTER_PORT: accepts every connection and
// either stays silent or answers `reply`. Closes when destroyed.
class PortHolder {
 public:
  PortHolder(int port, std::string reply) : reply_(std::move(reply)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    bound_ = ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 && ::listen(fd_, 64) == 0;
    thread_ = std::thread([this] {
      for (;;) {
        pollfd p{fd_, POLLIN, 0};
        if (::poll(&p, 1, 50) <= 0) {
          if (stop_) return;
          continue;
        }
        const int c = ::accept(fd_, nullptr, nullptr);
        if (c < 0) continue;
        ++connections_;
        if (!reply_.empty()) (void)!::send(c, reply_.data(), reply_.size(), MSG_NOSIGNAL);
        held_.push_back(c);  // silent: keep it open, as a store waiting for a query does
      }
    });
  }
  ~PortHolder() {
    stop_ = true;
    thread_.join();
    for (int c : held_) ::close(c);
    ::close(fd_);
  }
  bool bound() const { return bound_; }
  int connections() const { return connections_; }

 private:
  int fd_ = -1;
  bool bound_ = false;
  std::string reply_;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};
  std::vector<int> held_;
  std::thread thread_;
};

void expect_broadcast_past_a_holder(const std::string& reply, const std::string& what) {
  const std::string blob("\x02\x00nccl-id\xfe", 10);
  const int port = 30000 + static_cast<int>((::getpid() * 7 + reply.size() * 131) % 20000);
  PortHolder holder(port, reply);
  ASSERT_TRUE(holder.bound()) << "port " << port << " taken";
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string> got(4);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 4; ++r) {
    ranks.emplace_back([&, r] {
      got[r] = detail::tcp_broadcast("127.0.0.1", port, r, 4, r == 0 ? blob : "", 20.0, "job-7/0");
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 4; ++r) EXPECT_EQ(blob, got[r]) << what << ", rank " << r;
  EXPECT_GE(holder.connections(), 1) << what << ": the ranks never tried MASTER_PORT";
  std::printf("rendezvous of 4 ranks past a listener on MASTER_PORT that %s: %.3f s\n",
              what.c_str(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

TEST(Rendezvous, TcpWorksWhenAnotherListenerHoldsMasterPortSilently) {
  expect_broadcast_past_a_holder("", "stays silent (torchrun's store)");
}

TEST(Rendezvous, TcpWorksWhenAnotherListenerHoldsMasterPortAnsweringGarbage) {
  expect_broadcast_past_a_holder("HTTP/1.0 400 Bad Request\r\n\r\n", "answers garbage");
}

TEST(Rendezvous, TcpSkipsARankZeroOfAnotherJob) {
  const int port = 25000 + static_cast<int>(::getpid() % 20000);
  // Another job's rank 0 on MASTER_PORT, waiting for a rank that never comes.
  std::thread other([&] {
    EXPECT_THROW(detail::tcp_broadcast("127.0.0.1", port, 0, 2, "other", 2.0, "job-other"), Error);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::vector<std::string> got(2);
  std::thread r0(
      [&] { got[0] = detail::tcp_broadcast("127.0.0.1", port, 0, 2, "mine", 5.0, "job-mine"); });
  got[1] = detail::tcp_broadcast("127.0.0.1", port, 1, 2, "", 5.0, "job-mine");
  r0.join();
  other.join();
  EXPECT_EQ("mine", got[0]);
  EXPECT_EQ("mine", got[1]);
}

TEST(Rendezvous, TcpWithOnlyASilentListenerTimesOutNamingMasterAddrAndPort) {
  const int port = 45000 + static_cast<int>(::getpid() % 15000);
  PortHolder holder(port, "");
  ASSERT_TRUE(holder.bound());
  const auto start = std::chrono::steady_clock::now();
  try {
    detail::tcp_broadcast("127.0.0.1", port, 1, 2, "", 1.0, "job");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(ErrorCode::kTimeout, e.code()) << e.what();
    EXPECT_NE(std::string::npos, e.message().find("127.0.0.1:" + std::to_string(port))) << e.what();
    EXPECT_NE(std::string::npos, e.message().find("MASTER_ADDR:MASTER_PORT")) << e.what();
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("nothing answering: error after %.3f s (timeout 1 s)\n", s);
  EXPECT_LT(s, 2.5);
}

TEST(Rendezvous, FileHandsRankZerosBlobToEveryRankAndRefusesAStaleFile) {
  const testing::TempDir tmp;
  const std::string path = tmp.file("rdv.id");
  const std::string blob(128, 'z');
  std::vector<std::string> got(3);
  std::vector<std::thread> ranks;
  for (int r = 2; r >= 0; --r) {  // readers start first
    ranks.emplace_back(
        [&, r] { got[r] = detail::file_broadcast(path, r, r == 0 ? blob : "", 20.0); });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 3; ++r) EXPECT_EQ(blob, got[r]);
  try {
    detail::file_broadcast(path, 0, blob, 1.0);
    ADD_FAILURE() << "stale file accepted";
  } catch (const Error& e) {
    EXPECT_EQ(ErrorCode::kConfig, e.code());
  }
  std::filesystem::remove(path);
  EXPECT_THROW(detail::file_broadcast(path, 1, "", 0.1), Error);
}

}  // namespace
}  // namespace zero::test
