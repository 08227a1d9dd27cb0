// tests/common/mpi_world.hpp — what the MPI tests share: the world communicator (MPI is
// initialised once per process; 120 s per collective wait) and one test directory for all the
// processes of the world.
//
// Thread safety: mpi_world() is made once (a function-local static); the communicator is used by
// the test's thread. A WorldTempDir is made and destroyed by every process together (collective).
#pragma once

#include <algorithm>
#include <array>
#include <cstdio>
#include <exception>
#include <memory>
#include <optional>
#include <string>

#include "common/temp_dir.hpp"
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

// A TempDir every process of `comm` shares (the processes write their shards into one checkpoint
// directory): rank 0 makes it and broadcasts its path; at scope end every process waits for the
// others (a barrier), then rank 0 removes it. Collective: every rank makes and destroys it.
class WorldTempDir {
 public:
  WorldTempDir(Communicator& comm, const std::string& tag = "") : comm_(comm) {
    std::array<char, 4096> name{};
    if (comm.rank() == 0) {
      dir_.emplace(tag);
      const std::string& p = dir_->path();
      std::copy_n(p.begin(), std::min(p.size(), name.size() - 1), name.begin());
    }
    // Bytes travel unchanged through broadcast: 2-byte elements.
    comm.broadcast(name.data(), name.data(), name.size() / 2, DType::kF16, 0);
    path_ = name.data();
  }
  ~WorldTempDir() {
    try {
      comm_.barrier();  // nobody is still writing into it
    } catch (const std::exception& e) {
      std::fprintf(stderr, "WorldTempDir %s: barrier before removal failed: %s\n", path_.c_str(),
                   e.what());
    }
  }
  WorldTempDir(const WorldTempDir&) = delete;
  WorldTempDir& operator=(const WorldTempDir&) = delete;

  const std::string& path() const { return path_; }

 private:
  Communicator& comm_;
  std::optional<TempDir> dir_;  // rank 0's; removed after the destructor's barrier
  std::string path_;
};

}  // namespace zero::testing
