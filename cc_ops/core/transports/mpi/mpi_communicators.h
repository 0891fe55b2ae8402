// The engine's own MPI communicators for one group of ranks (all of them, or
// a process set's): the group (duplicated from its parent so user MPI
// traffic, e.g. mpi4py, never interleaves with the engine's), its ranks on
// this host (local) and one of its ranks per host (cross), and the topology
// they give. Shared by every MPI-backed transport of the group.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "common/status.h"
#include "transports/topology.h"

namespace smdist {

class MpiCommunicators {
 public:
  // Collective over `group`. Ranks reporting the same `hostname` share a host.
  static Status Create(MPI_Comm group, const std::string& hostname, std::shared_ptr<MpiCommunicators>* out);
  MpiCommunicators() = default;  // use Create(); public for std::make_shared
  ~MpiCommunicators();
  MpiCommunicators(const MpiCommunicators&) = delete;
  MpiCommunicators& operator=(const MpiCommunicators&) = delete;

  const Topology& topology() const { return topology_; }
  // The whole group (every rank, or a process set's members).
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
