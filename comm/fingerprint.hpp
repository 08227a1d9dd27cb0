// comm/fingerprint.hpp — what one rank says a collective is, and the one rule by which the
// ranks of a group must agree on it.
//
// Every backend checks it: the in-process backend on the arguments each rank posts (always: the
// ranks share memory, it costs nothing); MPI and NCCL by all-gathering each rank's 48-byte
// Fingerprint before the collective when CommOptions::debug is kDetail (config comm_debug).
// Either way every rank of the group sees every rank's fingerprint, so every rank throws the
// same error, naming both calls and their units, at the collective where the ranks diverged.
// The flight recorder (flight_recorder.hpp) keeps the same fingerprints.
//
// Thread safety: plain values and functions of their arguments.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zero/comm/comm.hpp"

namespace zero::detail {

// Fixed layout: it travels as bytes between processes of one build (MPI_BYTE, ncclUint8).
struct Fingerprint {
  std::uint64_t seq = 0;    // CollectiveEvent::seq: the collective's place on its communicator
  std::uint64_t count = 0;  // CollectiveArgs::count
  std::int64_t tag = -1;    // the unit (Communicator::tag_next); -1: none
  // What the tagged units are on this rank (TagLayout): elements before padding
  // and a digest of their parameters' shapes; 0: not said.
  std::uint64_t tag_elements = 0;
  std::uint64_t tag_digest = 0;
  std::int32_t root = 0;   // broadcast only
  std::uint8_t kind = 0;   // Collective
  std::uint8_t dtype = 0;  // DType
  std::uint8_t op = 0;     // ReduceOp, reductions only
  std::uint8_t valid = 0;  // 1: a fingerprint; 0: an empty slot
};
static_assert(sizeof(Fingerprint) == 48, "Fingerprint travels as 48 bytes");

Fingerprint fingerprint_of(const CollectiveArgs& args);

// The rule: same seq, kind, count, dtype and tag, and the same layout of the tagged units (a
// model that differs by less than the padding moves the same count); same op for a reduction;
// same root for a broadcast. Fields a collective does not use are not compared.
bool same_call(const Fingerprint& a, const Fingerprint& b);

// "seq 42 reduce_scatter(1000 x f32, sum) unit 6" ("no unit" when untagged).
std::string to_string(const Fingerprint& f);

// Throws zero::Error(kInvalidArgument) when the fingerprints of the group (all[q]: rank q's,
// world_ranks[q] its world rank) break the rule: "<what>: ranks disagree on the collective: rank
// 0 issued seq 3 all_gather(8 x f32) unit 7, rank 2 issued seq 3 reduce_scatter(4 x f32, sum)
// unit 6". Names rank 0 and the first rank that differs from it. When only the tagged units'
// layout differs: "...: the ranks' models differ: at seq 3 all_gather(64 x f32) unit 2: rank 0
// moves 1000 parameter elements (before padding), rank 1 moves 1010".
void check_same_call(const std::vector<Fingerprint>& all, const std::vector<int>& world_ranks,
                     const std::string& what);

}  // namespace zero::detail
