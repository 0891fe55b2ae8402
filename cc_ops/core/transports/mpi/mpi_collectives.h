// The data plane's fallback: every collective as one MPI call (in pieces when
// counts pass MPI's int range) on the engine's world communicator. Allreduce
// takes one tensor read where it lies; fused tensors come packed in a fusion
// buffer (the executor's plan).
#pragma once

#include <memory>

#include "transports/data_transport.h"
#include "transports/mpi/mpi_communicators.h"

namespace smdist {

// MPI_Bcast of `count` elements, in pieces MPI's int counts can hold.
Status MpiBroadcast(MPI_Comm comm, void* buffer, int64_t count, DataType dtype, int root);

class MpiCollectives : public DataTransport {
 public:
  explicit MpiCollectives(std::shared_ptr<MpiCommunicators> comms) : comms_(std::move(comms)) {}

  std::string name() const override { return "mpi"; }
  bool Enabled(const CollectiveWork& work) const override;
  Status Allreduce(const SpanStaging& staging, ReduceOp op) override;
  Status Allgatherv(const void* send, void* recv, const std::vector<int64_t>& counts,
                    DataType dtype) override;
  Status Broadcast(const void* input, void* output, int64_t count, DataType dtype, int root) override;
  Status Alltoallv(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                   const std::vector<int64_t>& recv_counts, DataType dtype) override;
  Status ReduceScatter(const void* send, void* recv, const std::vector<int64_t>& recv_counts,
                       DataType dtype, ReduceOp op) override;

 private:
  std::shared_ptr<MpiCommunicators> comms_;
};

}  // namespace smdist
