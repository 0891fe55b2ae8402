// Negotiation messages over MPI collectives on one group's communicator.
#pragma once

#include <functional>
#include <memory>

#include "transports/control_plane.h"
#include "transports/mpi/mpi_communicators.h"

namespace smdist {

class MpiControlPlane : public ControlPlane {
 public:
  // spare_cores: wait for a round with nonblocking calls that sleep between polls (every rank of the
  // communicator must choose alike: a nonblocking collective does not match a blocking one).
  MpiControlPlane(std::shared_ptr<MpiCommunicators> comms, bool spare_cores)
      : comms_(std::move(comms)), spare_cores_(spare_cores) {}

  const Topology& topology() const override { return comms_->topology(); }
  Status GatherToRoot(const std::vector<uint8_t>& mine,
                      std::vector<std::vector<uint8_t>>* gathered) override;
  Status BroadcastFromRoot(std::vector<uint8_t>* bytes) override;
  Status AllreduceBits(std::vector<uint64_t>* words, bool bitwise_and) override;
  const MpiCommunicators& communicators() const { return *comms_; }

 private:
  // The blocking call, or the nonblocking one started by `start` and waited for sparing the core.
  Status Round(const char* what, const std::function<int()>& blocking,
               const std::function<int(MPI_Request*)>& start) const;

  std::shared_ptr<MpiCommunicators> comms_;
  bool spare_cores_;
};

}  // namespace smdist
