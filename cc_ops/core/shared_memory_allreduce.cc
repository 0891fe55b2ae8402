#include "shared_memory_allreduce.h"

#include <algorithm>
#include <cstring>

#include "mpi_types.h"
#include "reduction.h"
#include "shard_range.h"

namespace smdist {
namespace {
// The segment is a whole number of cache lines.
constexpr int64_t kAlignBytes = 64;
}  // namespace

Status SharedMemoryAllreduce::Create(MPI_Comm local, MPI_Comm cross, int64_t segment_bytes,
                                     std::unique_ptr<SharedMemoryAllreduce>* out) {
  auto s = std::make_unique<SharedMemoryAllreduce>();
  s->local_ = local;
  s->cross_ = cross;
  s->segment_bytes_ = segment_bytes / kAlignBytes * kAlignBytes;
  MPI_Comm_rank(local, &s->local_rank_);
  MPI_Comm_size(local, &s->local_size_);
  SMDIST_RETURN_IF_ERROR(SharedWindow::Create(local, s->segment_bytes_, &s->window_));
  for (int r = 0; r < s->local_size_; ++r) {
    s->segments_.push_back(static_cast<uint8_t*>(s->window_->part(r)));
  }
  *out = std::move(s);
  return Status::OK();
}

Status SharedMemoryAllreduce::LocalBarrier() { return window_->Barrier(); }

Status SharedMemoryAllreduce::Run(const void* input, void* output, int64_t count, DataType dtype,
                                  ReduceOp op) {
  const size_t elem = DataTypeSize(dtype);
  const int64_t chunk = segment_bytes_ / static_cast<int64_t>(elem);
  const auto* in = static_cast<const uint8_t*>(input);
  auto* out = static_cast<uint8_t*>(output);
  std::vector<const void*> sources(local_size_);
  for (int64_t offset = 0; offset < count; offset += chunk) {
    const int64_t n = std::min(chunk, count - offset);
    std::memcpy(segments_[local_rank_], in + offset * elem, n * elem);
    SMDIST_RETURN_IF_ERROR(LocalBarrier());

    // Reduce my shard from every peer's segment into my own segment.
    int64_t begin = 0, end = 0;
    ShardRange(n, elem, local_size_, local_rank_, &begin, &end);
    if (end > begin) {
      sources[0] = segments_[local_rank_] + begin * elem;
      int k = 1;
      for (int r = 0; r < local_size_; ++r) {
        if (r != local_rank_) sources[k++] = segments_[r] + begin * elem;
      }
      ReduceMany(dtype, op, sources.data(), local_size_, segments_[local_rank_] + begin * elem,
                 end - begin);
    }
    if (cross_ != MPI_COMM_NULL) {
      // Hierarchical: same-shard owners on other hosts combine their partial results.
      int rc = MPI_Allreduce(MPI_IN_PLACE, segments_[local_rank_] + begin * elem,
                             static_cast<int>(end - begin), MpiType(dtype), MpiOp(dtype, op), cross_);
      if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Allreduce(cross)");
    }
    SMDIST_RETURN_IF_ERROR(LocalBarrier());

    for (int r = 0; r < local_size_; ++r) {
      ShardRange(n, elem, local_size_, r, &begin, &end);
      if (end > begin) {
        std::memcpy(out + (offset + begin) * elem, segments_[r] + begin * elem, (end - begin) * elem);
      }
    }
    // Nobody may restage its segment until every peer has copied out of it.
    SMDIST_RETURN_IF_ERROR(LocalBarrier());
  }
  return Status::OK();
}

}  // namespace smdist
