// An MPI shared-memory window over the ranks of one host: each rank owns a
// part and every rank maps every part. Both intra-host allreduce paths sit on
// one (the copy path's staging segments, the cross-memory path's control slots).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"

namespace smdist {

class SharedWindow {
 public:
  // Collective over `local`: allocates `bytes` per rank and maps every part.
  static Status Create(MPI_Comm local, int64_t bytes, std::unique_ptr<SharedWindow>* out);
  SharedWindow() = default;  // use Create()
  // Collective: frees the window, unless MPI is already finalized.
  ~SharedWindow();
  SharedWindow(const SharedWindow&) = delete;
  SharedWindow& operator=(const SharedWindow&) = delete;

  // Local rank `rank`'s part, mapped into this process.
  void* part(int rank) const { return parts_[rank]; }
  // Barrier over the host's ranks, with memory ordered on both sides of it.
  Status Barrier();

 private:
  MPI_Comm local_ = MPI_COMM_NULL;
  MPI_Win window_ = MPI_WIN_NULL;
  std::vector<void*> parts_;
};

}  // namespace smdist
