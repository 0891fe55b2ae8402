#include "transports/mpi/mpi_communicators.h"

#include <cstring>
#include <vector>

#include "transports/mpi/mpi_types.h"

namespace smdist {

Status MpiCommunicators::Create(MPI_Comm group, const std::string& hostname,
                                std::shared_ptr<MpiCommunicators>* out) {
  auto c = std::make_shared<MpiCommunicators>();
  int rc = MPI_Comm_dup(group, &c->world_);
  if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Comm_dup");
  MPI_Comm_set_errhandler(c->world_, MPI_ERRORS_RETURN);
  Topology& topo = c->topology_;
  MPI_Comm_rank(c->world_, &topo.rank);
  MPI_Comm_size(c->world_, &topo.size);

  // Ranks on one host are those reporting the same host name.
  constexpr int kNameLen = 256;
  std::vector<char> names(static_cast<size_t>(kNameLen) * topo.size, 0);
  char mine[kNameLen] = {0};
  std::strncpy(mine, hostname.c_str(), kNameLen - 1);
  rc = MPI_Allgather(mine, kNameLen, MPI_CHAR, names.data(), kNameLen, MPI_CHAR, c->world_);
  if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Allgather(hostnames)");
  int color = topo.rank;
  for (int r = 0; r < topo.size; ++r) {
    if (std::strncmp(&names[static_cast<size_t>(r) * kNameLen], mine, kNameLen) == 0) {
      color = r;
      break;
    }
  }
  MPI_Comm_split(c->world_, color, topo.rank, &c->local_);
  MPI_Comm_rank(c->local_, &topo.local_rank);
  MPI_Comm_size(c->local_, &topo.local_size);
  MPI_Comm_split(c->world_, topo.local_rank, topo.rank, &c->cross_);
  MPI_Comm_rank(c->cross_, &topo.cross_rank);
  MPI_Comm_size(c->cross_, &topo.cross_size);

  std::vector<int> local_sizes(topo.size);
  MPI_Allgather(&topo.local_size, 1, MPI_INT, local_sizes.data(), 1, MPI_INT, c->world_);
  topo.is_homogeneous = true;
  for (int s : local_sizes) topo.is_homogeneous &= (s == local_sizes[0]);
  *out = std::move(c);
  return Status::OK();
}

MpiCommunicators::~MpiCommunicators() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  for (MPI_Comm* c : {&cross_, &local_, &world_}) {
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
  }
}

}  // namespace smdist
