// The control plane: the small messages of negotiation (which collectives
// each rank has submitted, and what all ranks run next). Rank 0 coordinates.
// Kept apart from the data plane so tensors can move over another transport
// (shared memory, NCCL) while negotiation stays on one that every rank reaches.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "common/status.h"
#include "transports/topology.h"

namespace smdist {

// How a negotiation round waits for its peers: polls without pause (peers that are there answer
// within microseconds), then with yields, then with sleeps between polls. Every rank of a job
// waits alike.
struct NegotiationWait {
  std::chrono::microseconds busy_poll;    // polls without pause this long into the round,
  std::chrono::microseconds yield_until;  // then with yields up to this long, then with sleeps.
  // While peers keep coming late, and in an idle rank's rounds, rounds poll only briefly, then sleep.
  bool brief_while_late;

  // Each rank has a core: polling long keeps a round as fast as a blocking call.
  static constexpr NegotiationWait OwnCores() {
    return {std::chrono::microseconds(2000), std::chrono::microseconds(3000), true};
  }
  // Ranks outnumber cores on some host: a polling rank takes the core a peer needs.
  static constexpr NegotiationWait SharedCores() {
    return {std::chrono::microseconds(100), std::chrono::microseconds(1000), false};
  }
};

class ControlPlane {
 public:
  virtual ~ControlPlane() = default;

  virtual const Topology& topology() const = 0;
  // Rank 0 receives every rank's bytes in `gathered` (indexed by rank).
  virtual Status GatherToRoot(const std::vector<uint8_t>& mine,
                              std::vector<std::vector<uint8_t>>* gathered) = 0;
  // Rank 0's `bytes` replace every other rank's.
  virtual Status BroadcastFromRoot(std::vector<uint8_t>* bytes) = 0;
  // Bitwise AND (or OR) of every rank's words, in place: cached negotiation.
  virtual Status AllreduceBits(std::vector<uint64_t>* words, bool bitwise_and) = 0;
};

}  // namespace smdist
