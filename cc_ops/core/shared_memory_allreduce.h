// Allreduce among the ranks of one host through a shared-memory window: each
// rank stages its data in its own segment, reduces one shard straight from
// every peer's segment (no MPI copies), optionally allreduces that shard with
// the same-shard owners on other hosts (hierarchical), and copies every
// reduced shard back out. Each rank does 1/local_size of the arithmetic.
#pragma once

#include <mpi.h>

#include <memory>
#include <vector>

#include "shared_window.h"
#include "status.h"
#include "types.h"

namespace smdist {

class SharedMemoryAllreduce {
 public:
  // Collective over `local`. `cross` (may be MPI_COMM_NULL) links ranks with
  // the same local rank on other hosts.
  static Status Create(MPI_Comm local, MPI_Comm cross, int64_t segment_bytes,
                       std::unique_ptr<SharedMemoryAllreduce>* out);
  SharedMemoryAllreduce() = default;  // use Create()
  SharedMemoryAllreduce(const SharedMemoryAllreduce&) = delete;
  SharedMemoryAllreduce& operator=(const SharedMemoryAllreduce&) = delete;

  Status Run(const void* input, void* output, int64_t count, DataType dtype, ReduceOp op);

 private:
  Status LocalBarrier();

  MPI_Comm local_ = MPI_COMM_NULL;
  MPI_Comm cross_ = MPI_COMM_NULL;
  std::unique_ptr<SharedWindow> window_;  // freed before the communicators
  int local_rank_ = 0;
  int local_size_ = 1;
  int64_t segment_bytes_ = 0;
  std::vector<uint8_t*> segments_;  // every local rank's segment, mapped here
};

}  // namespace smdist
