// Compression.int8 on the host transports: a ring allreduce whose messages are
// int8 blocks with an fp32 scale each (common/int8_blocks.h), accumulated in
// fp32. Reduce-scatter: at each of the n-1 steps a rank quantizes the chunk it
// holds, sends it to the next rank, and adds the previous rank's chunk,
// dequantized, to its own fp32 values. Allgather: each rank quantizes its
// fully reduced chunk once, and the n-1 steps forward those bytes unchanged,
// so every rank (the owner too) ends with the same dequantized values. Each
// element is quantized n times; docs/compression.md derives the error bound.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "transports/data_transport.h"
#include "transports/mpi/mpi_communicators.h"

namespace smdist {

class Int8RingAllreduce : public DataTransport {
 public:
  explicit Int8RingAllreduce(std::shared_ptr<MpiCommunicators> comms) : comms_(std::move(comms)) {}

  std::string name() const override { return "int8_ring"; }
  // Allreduces of floating-point host tensors under Compression.int8 (their wire type is int8).
  bool Enabled(const CollectiveWork& work) const override;
  // `op` is Sum (Average arrives as Sum and a postscale; the engine refuses
  // other ops with int8 compression before they reach a transport).
  Status Allreduce(const SpanStaging& staging, ReduceOp op) override;

 private:
  // The ring over elements [offset, offset + count) of `tensors` (staged as fp32).
  Status ReduceSegment(const SpanStaging& tensors, int64_t offset, int64_t count);

  std::shared_ptr<MpiCommunicators> comms_;
  std::vector<float> values_;  // the segment, accumulated in fp32
  std::vector<uint8_t> send_;
  std::vector<uint8_t> recv_;
};

}  // namespace smdist
