// comm/rendezvous.hpp — hands a small blob (the NCCL unique id) from rank 0 to every rank
// without MPI: over TCP (torchrun's MASTER_ADDR:MASTER_PORT) or through a shared file.
//
// Both wait at most `timeout_s` for the other side and throw zero::Error(kTimeout) naming the
// address or path and the ranks still missing; kCommunication on a socket error, kIO on a file
// error, kCorruption when the peer is not a zero rendezvous (wrong magic, short message).
//
// Thread safety: independent calls may run concurrently (tests run all ranks as threads).
#pragma once

#include <string>

namespace zero::detail {

// Rank 0 listens (all interfaces) on the first free port of [port, port + 16) — under torchrun
// the agent's own store holds MASTER_PORT — and greets every connection with a magic, `token`
// and `blob`, until each of the size - 1 ranks has acknowledged. The others scan the same ports
// (a silent listener is left after 300 ms, one that answers something else or another job's
// token is skipped) until rank 0 answers, and return its blob. `token` names the job (the
// launcher's run id), so no rank takes another job's rank 0 for its own. Rank 0 returns `blob`.
// REQUIRES: 0 <= rank < size, 0 < port < 65536.
std::string tcp_broadcast(const std::string& host, int port, int rank, int size,
                          const std::string& blob, double timeout_s, const std::string& token = "");

// Rank 0 writes `blob` to `path` atomically (a temporary file, then rename); the others wait for
// the file and read it. The path must not exist when rank 0 starts (a stale file from an earlier
// job would hand out a stale id): rank 0 then throws kConfig naming it. Nobody removes the file.
std::string file_broadcast(const std::string& path, int rank, const std::string& blob,
                           double timeout_s);

}  // namespace zero::detail
