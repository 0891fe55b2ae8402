// Negotiation messages over MPI collectives on one group's communicator.
#pragma once

#include <memory>

#include "transports/control_plane.h"
#include "transports/mpi/mpi_communicators.h"

namespace smdist {

class MpiControlPlane : public ControlPlane {
 public:
  explicit MpiControlPlane(std::shared_ptr<MpiCommunicators> comms) : comms_(std::move(comms)) {}

  const Topology& topology() const override { return comms_->topology(); }
  Status GatherToRoot(const std::vector<uint8_t>& mine,
                      std::vector<std::vector<uint8_t>>* gathered) override;
  Status BroadcastFromRoot(std::vector<uint8_t>* bytes) override;
  Status AllreduceBits(std::vector<uint64_t>* words, bool bitwise_and) override;
  const MpiCommunicators& communicators() const { return *comms_; }

 private:
  std::shared_ptr<MpiCommunicators> comms_;
};

}  // namespace smdist
