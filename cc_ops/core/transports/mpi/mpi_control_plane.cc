#include "transports/mpi/mpi_control_plane.h"

#include "transports/mpi/mpi_collectives.h"
#include "transports/mpi/mpi_types.h"

namespace smdist {

Status MpiControlPlane::GatherToRoot(const std::vector<uint8_t>& mine,
                                     std::vector<std::vector<uint8_t>>* gathered) {
  const Topology& topo = comms_->topology();
  const int n = topo.size;
  int my_size = static_cast<int>(mine.size());
  std::vector<int> sizes(topo.rank == 0 ? n : 0);
  int rc = MPI_Gather(&my_size, 1, MPI_INT, sizes.data(), 1, MPI_INT, 0, comms_->world());
  if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Gather");
  std::vector<int> displs;
  std::vector<uint8_t> all;
  if (topo.rank == 0) {
    displs.resize(n);
    int total = 0;
    for (int r = 0; r < n; ++r) {
      displs[r] = total;
      total += sizes[r];
    }
    all.resize(total);
  }
  rc = MPI_Gatherv(mine.data(), my_size, MPI_BYTE, all.data(), sizes.data(), displs.data(),
                   MPI_BYTE, 0, comms_->world());
  if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Gatherv");
  if (topo.rank == 0) {
    gathered->assign(n, {});
    for (int r = 0; r < n; ++r) {
      (*gathered)[r].assign(all.begin() + displs[r], all.begin() + displs[r] + sizes[r]);
    }
  }
  return Status::OK();
}

Status MpiControlPlane::BroadcastFromRoot(std::vector<uint8_t>* bytes) {
  int64_t size = static_cast<int64_t>(bytes->size());
  int rc = MPI_Bcast(&size, 1, MPI_INT64_T, 0, comms_->world());
  if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Bcast");
  bytes->resize(size);
  return MpiBroadcast(comms_->world(), bytes->data(), size, DataType::kUInt8, 0);
}

Status MpiControlPlane::AllreduceBits(std::vector<uint64_t>* words, bool bitwise_and) {
  int rc = MPI_Allreduce(MPI_IN_PLACE, words->data(), static_cast<int>(words->size()),
                         MPI_UINT64_T, bitwise_and ? MPI_BAND : MPI_BOR, comms_->world());
  return MpiError(rc, "MPI_Allreduce(bits)");
}

}  // namespace smdist
