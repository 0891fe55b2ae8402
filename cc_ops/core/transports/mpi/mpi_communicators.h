// The engine's own MPI communicators: all ranks (duplicated from COMM_WORLD so
// user MPI traffic, e.g. mpi4py, never interleaves with the engine's), the
// ranks of this host (local) and one rank per host (cross), and the topology
// they give. Shared by every MPI-backed transport.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "common/status.h"
#include "transports/topology.h"

namespace smdist {

class MpiCommunicators {
 public:
  // Collective over COMM_WORLD. Ranks reporting the same `hostname` share a host.
  static Status Create(const std::string& hostname, std::shared_ptr<MpiCommunicators>* out);
  MpiCommunicators() = default;  // use Create(); public for std::make_shared
  ~MpiCommunicators();
  MpiCommunicators(const MpiCommunicators&) = delete;
  MpiCommunicators& operator=(const MpiCommunicators&) = delete;

  const Topology& topology() const { return topology_; }
  MPI_Comm world() const { return world_; }
  MPI_Comm local() const { return local_; }
  MPI_Comm cross() const { return cross_; }

 private:
  Topology topology_;
  MPI_Comm world_ = MPI_COMM_NULL;
  MPI_Comm local_ = MPI_COMM_NULL;
  MPI_Comm cross_ = MPI_COMM_NULL;
};

}  // namespace smdist
