// The control plane: the small messages of negotiation (which collectives
// each rank has submitted, and what all ranks run next). Rank 0 coordinates.
// Kept apart from the data plane so tensors can move over another transport
// (shared memory, NCCL) while negotiation stays on one that every rank reaches.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "transports/topology.h"

namespace smdist {

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
