#include "transports/mpi/int8_ring_allreduce.h"

#include <algorithm>
#include <string>

#include "common/int8_blocks.h"
#include "transports/mpi/mpi_types.h"

namespace smdist {
namespace {

// Elements reduced per ring: bounds the fp32 copy (16 MiB) and keeps MPI's
// int byte counts in range. A whole number of blocks, so blocks are counted
// from the start of the fused tensors whatever the segment.
constexpr int64_t kSegmentElements = int64_t{1} << 22;
static_assert(kSegmentElements % kInt8BlockElements == 0, "segments hold whole blocks");
constexpr int kTag = 0x1188;

// Chunk c of a segment of `count` elements on a ring of `size`: whole blocks,
// spread as evenly as they go.
struct Chunk {
  int64_t begin;
  int64_t count;
};
Chunk ChunkOf(int c, int size, int64_t count) {
  const int64_t blocks = (count + kInt8BlockElements - 1) / kInt8BlockElements;
  const int64_t lo = std::min(count, blocks * c / size * kInt8BlockElements);
  const int64_t hi = std::min(count, blocks * (c + 1) / size * kInt8BlockElements);
  return {lo, hi - lo};
}

}  // namespace

bool Int8RingAllreduce::Enabled(const CollectiveWork& work) const {
  return work.type == CollectiveType::kAllreduce && work.device.is_cpu() && work.wire == DataType::kInt8 &&
         IsFloatingPoint(work.dtype);
}

Status Int8RingAllreduce::Allreduce(const SpanStaging& staging, ReduceOp op) {
  if (op != ReduceOp::kSum) {
    return Status::InvalidArgument(std::string("Compression.int8 reduces with Sum or Average, not ") +
                                   ReduceOpName(op));
  }
  // The same tensors seen as fp32: converted and prescaled on the way in,
  // converted back and postscaled on the way out.
  const SpanStaging tensors(staging.spans(), staging.dtype(), DataType::kFloat32, staging.prescale(),
                            staging.postscale());
  for (int64_t offset = 0; offset < tensors.count(); offset += kSegmentElements) {
    SMDIST_RETURN_IF_ERROR(ReduceSegment(tensors, offset, std::min(kSegmentElements, tensors.count() - offset)));
  }
  return Status::OK();
}

Status Int8RingAllreduce::ReduceSegment(const SpanStaging& tensors, int64_t offset, int64_t count) {
  const int size = comms_->topology().size;
  const int rank = comms_->topology().rank;
  values_.resize(static_cast<size_t>(count));
  tensors.StageIn(offset, count, values_.data());
  if (size > 1) {
    const int right = (rank + 1) % size;
    const int left = (rank + size - 1) % size;
    // Chunks differ by at most one block, so one block more than any chunk holds the largest.
    const int64_t most = Int8WireBytes(ChunkOf(size - 1, size, count).count + kInt8BlockElements);
    send_.resize(static_cast<size_t>(most));
    recv_.resize(static_cast<size_t>(most));
    auto exchange = [&](const Chunk& out, const Chunk& in) {
      const int rc = MPI_Sendrecv(send_.data(), static_cast<int>(Int8WireBytes(out.count)), MPI_BYTE, right, kTag,
                                  recv_.data(), static_cast<int>(Int8WireBytes(in.count)), MPI_BYTE, left, kTag,
                                  comms_->world(), MPI_STATUS_IGNORE);
      return MpiError(rc, "MPI_Sendrecv (int8 ring)");
    };
    // Reduce-scatter: after step s, this rank's chunk (rank - s - 1) holds s + 2 ranks' values.
    for (int s = 0; s < size - 1; ++s) {
      const Chunk out = ChunkOf((rank - s + size) % size, size, count);
      const Chunk in = ChunkOf((rank - s - 1 + size) % size, size, count);
      QuantizeInt8Blocks(values_.data() + out.begin, out.count, send_.data());
      SMDIST_RETURN_IF_ERROR(exchange(out, in));
      DequantizeInt8Blocks(recv_.data(), in.count, values_.data() + in.begin, /*accumulate=*/true);
    }
    // Allgather: chunk (rank + 1) is complete here; quantized once, its bytes go round the ring.
    const Chunk own = ChunkOf((rank + 1) % size, size, count);
    QuantizeInt8Blocks(values_.data() + own.begin, own.count, send_.data());
    DequantizeInt8Blocks(send_.data(), own.count, values_.data() + own.begin, /*accumulate=*/false);
    for (int s = 0; s < size - 1; ++s) {
      const Chunk out = ChunkOf((rank + 1 - s + size) % size, size, count);
      const Chunk in = ChunkOf((rank - s + size) % size, size, count);
      SMDIST_RETURN_IF_ERROR(exchange(out, in));
      DequantizeInt8Blocks(recv_.data(), in.count, values_.data() + in.begin, /*accumulate=*/false);
      send_.swap(recv_);
    }
  }
  tensors.StageOut(offset, count, values_.data());
  return Status::OK();
}

}  // namespace smdist
