// The interface collectives are written against. MPI implements it today; a
// NCCL transport can implement the data-plane half later without touching
// negotiation or the executor.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "status.h"
#include "types.h"

namespace smdist {

class SpanStaging;

struct Topology {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  int cross_rank = 0;
  int cross_size = 1;
  bool is_homogeneous = true;
};

// One tensor of a fused allreduce, reduced where it lies (input may equal output).
struct TensorSpan {
  const void* input;
  void* output;
  int64_t count;
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual const Topology& topology() const = 0;
  virtual std::string name() const = 0;
  // How large allreduces travel between ranks of one host (for introspection).
  virtual std::string intra_host_allreduce() const { return name(); }

  // Control plane (coordinator is rank 0).
  // Rank 0 receives every rank's bytes in `gathered` (indexed by rank).
  virtual Status GatherToRoot(const std::vector<uint8_t>& mine,
                              std::vector<std::vector<uint8_t>>* gathered) = 0;
  // Rank 0's `bytes` replace every other rank's.
  virtual Status BroadcastFromRoot(std::vector<uint8_t>* bytes) = 0;

  // Bitwise AND (or OR) of every rank's words, in place: cached negotiation.
  virtual Status AllreduceBits(std::vector<uint64_t>* words, bool bitwise_and) = 0;

  // Data plane. Counts are in elements of `dtype`.
  // `op` is Sum, Min, Max or Product (Average is done by the caller).
  // `input` may equal `output` (in place).
  virtual Status Allreduce(const void* input, void* output, int64_t count, DataType dtype,
                           ReduceOp op) = 0;
  // Fused allreduce without a fusion buffer, for transports that can read the
  // tensors in place. Result multiplied by `postscale`. Only called when
  // CanAllreduceSpans() said yes for this size and number of tensors (many
  // small tensors may be cheaper to stage than to read in place).
  virtual bool CanAllreduceSpans(int64_t total_bytes, size_t num_spans) const { return false; }
  virtual Status AllreduceSpans(const std::vector<TensorSpan>& spans, DataType dtype, ReduceOp op,
                                double postscale) {
    return Status::Unknown("this transport cannot reduce tensors in place");
  }
  // Allreduce for transports that stage the data themselves: `staging` copies
  // (and converts and scales) the tensors in and out, so no fusion buffer is
  // needed. Only called when CanAllreduceStaged() said yes for this many wire bytes.
  virtual bool CanAllreduceStaged(int64_t wire_bytes) const { return false; }
  virtual Status AllreduceStaged(const SpanStaging& staging, ReduceOp op) {
    return Status::Unknown("this transport cannot stage allreduces");
  }
  // Concatenates every rank's `send` into `recv` in rank order.
  virtual Status Allgatherv(const void* send, void* recv, const std::vector<int64_t>& counts,
                            DataType dtype) = 0;
  virtual Status Broadcast(void* buffer, int64_t count, DataType dtype, int root) = 0;
  virtual Status Alltoallv(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                           const std::vector<int64_t>& recv_counts, DataType dtype) = 0;
  // Reduces `send` (sum of recv_counts elements) across ranks; rank r keeps
  // block r, recv_counts[r] elements long.
  virtual Status ReduceScatter(const void* send, void* recv,
                               const std::vector<int64_t>& recv_counts, DataType dtype,
                               ReduceOp op) = 0;
  virtual Status Barrier() = 0;
};

}  // namespace smdist
