// Negotiation messages over MPI collectives on one group's communicator.
#pragma once

#include <chrono>
#include <functional>
#include <memory>

#include "transports/control_plane.h"
#include "transports/mpi/mpi_communicators.h"

namespace smdist {

class MpiControlPlane : public ControlPlane {
 public:
  MpiControlPlane(std::shared_ptr<MpiCommunicators> comms, NegotiationWait wait)
      : comms_(std::move(comms)), wait_(wait) {}

  const Topology& topology() const override { return comms_->topology(); }
  Status GatherToRoot(const std::vector<uint8_t>& mine,
                      std::vector<std::vector<uint8_t>>* gathered) override;
  Status BroadcastFromRoot(std::vector<uint8_t>* bytes) override;
  Status AllreduceBits(std::vector<uint64_t>* words, bool bitwise_and) override;
  const MpiCommunicators& communicators() const { return *comms_; }

 private:
  // The nonblocking collective started by `start`, waited for sparing the core.
  Status Round(const char* what, const std::function<int(MPI_Request*)>& start);
  Status Wait(MPI_Request* request, const char* what);

  std::shared_ptr<MpiCommunicators> comms_;
  const NegotiationWait wait_;
  // How many more rounds poll only briefly, since one outlasted the polls and yields.
  int brief_rounds_left_ = 0;
  std::chrono::steady_clock::time_point last_round_end_;
};

}  // namespace smdist
