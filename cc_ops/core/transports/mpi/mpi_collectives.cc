#include "transports/mpi/mpi_collectives.h"

#include <algorithm>
#include <climits>

#include "common/copy_bytes.h"
#include "common/reduction.h"
#include "transports/mpi/mpi_types.h"

namespace smdist {
namespace {

// Large buffers go through MPI in pieces because MPI counts are ints.
constexpr int64_t kMaxChunk = INT_MAX / 2;

Status ToIntCounts(const std::vector<int64_t>& counts, std::vector<int>* out,
                   std::vector<int>* displs) {
  out->resize(counts.size());
  displs->resize(counts.size());
  int64_t offset = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] > INT_MAX || offset > INT_MAX) {
      return Status::InvalidArgument("tensor too large for one MPI call (more than 2^31 elements)");
    }
    (*out)[i] = static_cast<int>(counts[i]);
    (*displs)[i] = static_cast<int>(offset);
    offset += counts[i];
  }
  return Status::OK();
}

}  // namespace

Status MpiBroadcast(MPI_Comm comm, void* buffer, int64_t count, DataType dtype, int root) {
  auto* p = static_cast<uint8_t*>(buffer);
  const size_t elem = DataTypeSize(dtype);
  for (int64_t done = 0; done < count; done += kMaxChunk) {
    int n = static_cast<int>(std::min(kMaxChunk, count - done));
    int rc = MPI_Bcast(p + done * elem, n, MpiType(dtype), root, comm);
    if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Bcast");
  }
  return Status::OK();
}

bool MpiCollectives::Enabled(const CollectiveWork& work) const {
  if (!work.device.is_cpu()) return false;
  // One tensor as it lies; several come packed in a fusion buffer.
  return work.type != CollectiveType::kAllreduce || (work.num_tensors == 1 && work.readable_in_place());
}

Status MpiCollectives::Allreduce(const SpanStaging& staging, ReduceOp op) {
  const TensorSpan& span = staging.spans()[0];
  const DataType dtype = staging.dtype();
  const size_t elem = DataTypeSize(dtype);
  const auto* in = static_cast<const uint8_t*>(span.input);
  auto* out = static_cast<uint8_t*>(span.output);
  for (int64_t done = 0; done < span.count; done += kMaxChunk) {
    int n = static_cast<int>(std::min(kMaxChunk, span.count - done));
    const void* send = in == out ? MPI_IN_PLACE : in + done * elem;
    int rc = MPI_Allreduce(send, out + done * elem, n, MpiType(dtype), MpiOp(dtype, op), comms_->world());
    if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Allreduce");
  }
  ScaleInPlace(dtype, out, span.count, staging.postscale());
  return Status::OK();
}

Status MpiCollectives::Allgatherv(const void* send, void* recv, const std::vector<int64_t>& counts,
                                  DataType dtype) {
  std::vector<int> icounts, displs;
  SMDIST_RETURN_IF_ERROR(ToIntCounts(counts, &icounts, &displs));
  int rc = MPI_Allgatherv(send, icounts[comms_->topology().rank], MpiType(dtype), recv, icounts.data(),
                          displs.data(), MpiType(dtype), comms_->world());
  return MpiError(rc, "MPI_Allgatherv");
}

Status MpiCollectives::Broadcast(const void* input, void* output, int64_t count, DataType dtype, int root) {
  if (comms_->topology().rank == root && input != output) CopyBytes(output, input, count * DataTypeSize(dtype));
  return MpiBroadcast(comms_->world(), output, count, dtype, root);
}

Status MpiCollectives::Alltoallv(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                                 const std::vector<int64_t>& recv_counts, DataType dtype) {
  std::vector<int> scounts, sdispls, rcounts, rdispls;
  SMDIST_RETURN_IF_ERROR(ToIntCounts(send_counts, &scounts, &sdispls));
  SMDIST_RETURN_IF_ERROR(ToIntCounts(recv_counts, &rcounts, &rdispls));
  int rc = MPI_Alltoallv(send, scounts.data(), sdispls.data(), MpiType(dtype), recv,
                         rcounts.data(), rdispls.data(), MpiType(dtype), comms_->world());
  return MpiError(rc, "MPI_Alltoallv");
}

Status MpiCollectives::ReduceScatter(const void* send, void* recv, const std::vector<int64_t>& recv_counts,
                                     DataType dtype, ReduceOp op) {
  std::vector<int> counts, displs;
  SMDIST_RETURN_IF_ERROR(ToIntCounts(recv_counts, &counts, &displs));
  int rc = MPI_Reduce_scatter(send, recv, counts.data(), MpiType(dtype), MpiOp(dtype, op), comms_->world());
  return MpiError(rc, "MPI_Reduce_scatter");
}

}  // namespace smdist
