// Adasum (Maleki et al., "Adasum: Adaptive Summation of Gradients for Deep
// Learning", MLSys 2021): the scale-invariant combination of two gradients
//   adasum(a, b) = (1 - a.b / (2|a|^2)) a + (1 - a.b / (2|b|^2)) b,
// a coefficient term taken as 0 where its vector is zero, applied pairwise up
// a binary tree of the ranks: rank pairs at distance 1, then the pairs' results
// at distance 2, and so on, which needs a power-of-two number of ranks.
//
// It runs by vector halving, distance doubling: at each level a rank swaps half
// of its current segment with its partner, so it holds both sides of one
// quarter, half, ... of the vectors; dot products and norms are per tensor over
// the whole tensor (each rank's partial sums added up across the ranks that
// hold the pieces); each rank then combines its piece, and an allgather
// assembles the result. Dots accumulate in float64 for float32/float64 tensors
// and in float32 for float16/bfloat16 ones. Only the data-plane interface is
// used (alltoallv for the pairwise swap, allreduce for the dots, allgatherv
// at the end), on host memory, so it runs on whatever host transports the
// process set has.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/types.h"
#include "transports/data_transport.h"
#include "transports/topology.h"

namespace smdist {

class AdasumAllreduce {
 public:
  AdasumAllreduce(const Topology& topology, const std::vector<DataTransport*>& data_plane)
      : topology_(topology), data_plane_(data_plane) {}

  // Why `dtype`, `compression` or this set's size cannot be reduced with
  // Adasum ("" if they can): every rank answers alike for one response.
  std::string Refusal(DataType dtype, WireCompression compression) const;

  // Replaces `data` (the tensors of one response packed end to end, host
  // memory, `counts[t]` elements of tensor t) by their Adasum over the ranks,
  // tensor by tensor. Returns a transport failure.
  Status Reduce(DataType dtype, const std::vector<int64_t>& counts, void* data);

 private:
  // Swaps `give` elements at `send` for the partner's `keep` elements (into received_).
  Status Exchange(int peer, const void* send, int64_t give, int64_t keep, DataType dtype);
  // Sums dots_ over all ranks (each group of ranks fills only its own slots).
  Status SumDots();
  // Every rank's final segment (this rank's starts at `lo`) into `data`, `total` elements.
  Status Gather(DataType dtype, int64_t total, int64_t lo, void* data);

  Topology topology_;
  std::vector<DataTransport*> data_plane_;
  std::vector<uint8_t> received_;  // the partner's half, reused across responses
  std::vector<uint8_t> gathered_;
  std::vector<double> dots_;
};

}  // namespace smdist
