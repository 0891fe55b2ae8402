#include "transports/shm/shared_memory_allreduce.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <new>

#include "common/reduction.h"
#include "common/shard_range.h"
#include "transports/mpi/mpi_types.h"

namespace smdist {
namespace {
// Slots are a whole number of cache lines.
constexpr int64_t kAlignBytes = 64;
// The widest element (float64, int64).
constexpr int64_t kMaxElementBytes = 8;
// Busy polls before yielding the core (ranks may outnumber cores).
constexpr int kSpinsBeforeYield = 256;

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}
}  // namespace

// Each counter on its own cache line: ranks poll them while their owner writes.
struct SharedMemoryAllreduce::Header {
  struct alignas(64) Counter {
    std::atomic<uint64_t> value;
  };
  Counter staged, reduced, copied;  // rounds this rank has finished each step of
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "counters are shared between processes");

Status SharedMemoryAllreduce::Create(MPI_Comm local, MPI_Comm cross, int64_t segment_bytes, int64_t min_bytes,
                                     std::unique_ptr<SharedMemoryAllreduce>* out) {
  auto s = std::make_unique<SharedMemoryAllreduce>();
  s->local_ = local;
  s->cross_ = cross;
  s->min_bytes_ = min_bytes;
  MPI_Comm_rank(local, &s->local_rank_);
  MPI_Comm_size(local, &s->local_size_);
  // Across hosts each round is also an MPI allreduce: big rounds amortise it.
  int64_t round = cross == MPI_COMM_NULL ? std::min(segment_bytes / 2, kSingleHostRoundBytes) : segment_bytes / 2;
  s->round_bytes_ = std::max<int64_t>(kAlignBytes, round / kAlignBytes * kAlignBytes);
  const int64_t header_bytes = (sizeof(Header) + kAlignBytes - 1) / kAlignBytes * kAlignBytes;
  SMDIST_RETURN_IF_ERROR(SharedWindow::Create(local, header_bytes + 2 * s->round_bytes_, &s->window_));
  for (int r = 0; r < s->local_size_; ++r) {
    auto* part = static_cast<uint8_t*>(s->window_->part(r));
    s->headers_.push_back(reinterpret_cast<Header*>(part));
    s->slots_.push_back(part + header_bytes);
  }
  // Constructed in place: the memory belongs to the window.
  new (s->headers_[s->local_rank_]) Header();
  SMDIST_RETURN_IF_ERROR(s->window_->Barrier());  // every header written before anyone polls
  *out = std::move(s);
  return Status::OK();
}

uint8_t* SharedMemoryAllreduce::Slot(int rank, uint64_t round) const {
  return slots_[rank] + static_cast<int64_t>(round % 2) * round_bytes_;
}

void SharedMemoryAllreduce::WaitForPeer(int peer, Stage stage, uint64_t round) const {
  // A peer that dies mid-round is the launcher's to handle (mpirun ends the
  // job), as it was when these waits were MPI barriers.
  Header* h = headers_[peer];
  const std::atomic<uint64_t>& counter =
      stage == Stage::kStaged ? h->staged.value : stage == Stage::kReduced ? h->reduced.value : h->copied.value;
  for (int spins = 0; counter.load(std::memory_order_acquire) < round; ++spins) {
    if (spins < kSpinsBeforeYield) {
      CpuRelax();
    } else {
      sched_yield();
    }
  }
}

void SharedMemoryAllreduce::WaitForPeers(Stage stage, uint64_t round) const {
  for (int r = 0; r < local_size_; ++r) {
    if (r != local_rank_) WaitForPeer(r, stage, round);
  }
}

bool SharedMemoryAllreduce::Enabled(const CollectiveWork& work) const {
  if (!work.device.is_cpu() || work.wire_bytes <= 0 || work.wire_bytes < min_bytes_) return false;
  // A reduce-scatter's blocks are those of the group's ranks: only where the host is the group,
  // and with room in a round for an element of every block.
  return work.type == CollectiveType::kAllreduce ||
         (work.type == CollectiveType::kReducescatter && cross_ == MPI_COMM_NULL &&
          round_bytes_ >= local_size_ * kMaxElementBytes);
}

Status SharedMemoryAllreduce::Allreduce(const SpanStaging& staging, ReduceOp op) {
  const DataType dtype = staging.wire();
  const int64_t count = staging.count();
  const size_t elem = DataTypeSize(dtype);
  const int64_t chunk = round_bytes_ / static_cast<int64_t>(elem);
  Header* mine = headers_[local_rank_];
  std::vector<const void*> sources(local_size_);
  for (int64_t offset = 0; offset < count; offset += chunk, ++rounds_done_) {
    const uint64_t round = rounds_done_;
    const int64_t n = std::min(chunk, count - offset);
    // This slot was last used two rounds ago: every peer must have read it.
    if (round >= 2) WaitForPeers(Stage::kCopied, round - 1);
    staging.StageIn(offset, n, Slot(local_rank_, round));
    mine->staged.value.store(round + 1, std::memory_order_release);
    WaitForPeers(Stage::kStaged, round + 1);

    // Reduce my shard from every peer's slot into my own slot.
    int64_t begin = 0, end = 0;
    ShardRange(n, elem, local_size_, local_rank_, &begin, &end);
    uint8_t* my_shard = Slot(local_rank_, round) + begin * elem;
    if (end > begin) {
      sources[0] = my_shard;
      int k = 1;
      for (int r = 0; r < local_size_; ++r) {
        if (r != local_rank_) sources[k++] = Slot(r, round) + begin * elem;
      }
      ReduceMany(dtype, op, sources.data(), local_size_, my_shard, end - begin);
    }
    if (cross_ != MPI_COMM_NULL) {
      // Hierarchical: same-shard owners on other hosts combine their partial results.
      int rc = MPI_Allreduce(MPI_IN_PLACE, my_shard, static_cast<int>(end - begin), MpiType(dtype),
                             MpiOp(dtype, op), cross_);
      if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Allreduce(cross)");
    }
    mine->reduced.value.store(round + 1, std::memory_order_release);

    if (end > begin) staging.StageOut(offset + begin, end - begin, my_shard);
    for (int r = 0; r < local_size_; ++r) {
      if (r == local_rank_) continue;
      ShardRange(n, elem, local_size_, r, &begin, &end);
      if (end <= begin) continue;
      WaitForPeer(r, Stage::kReduced, round + 1);
      staging.StageOut(offset + begin, end - begin, Slot(r, round) + begin * elem);
    }
    mine->copied.value.store(round + 1, std::memory_order_release);
  }
  return Status::OK();
}

Status SharedMemoryAllreduce::ReduceScatter(const void* send, void* recv, const std::vector<int64_t>& recv_counts,
                                            DataType dtype, ReduceOp op) {
  const int64_t elem = static_cast<int64_t>(DataTypeSize(dtype));
  // Per round, every rank stages up to `slice` elements of each block.
  const int64_t slice = std::max<int64_t>(1, round_bytes_ / elem / local_size_);
  std::vector<int64_t> starts(local_size_ + 1, 0);
  for (int r = 0; r < local_size_; ++r) starts[r + 1] = starts[r] + recv_counts[r];
  const int64_t longest = *std::max_element(recv_counts.begin(), recv_counts.end());
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  Header* mine = headers_[local_rank_];
  std::vector<const void*> sources(local_size_);
  for (int64_t offset = 0; offset < longest; offset += slice, ++rounds_done_) {
    const uint64_t round = rounds_done_;
    // This slot was last used two rounds ago: every peer must have read it.
    if (round >= 2) WaitForPeers(Stage::kCopied, round - 1);
    uint8_t* slot = Slot(local_rank_, round);
    for (int b = 0; b < local_size_; ++b) {
      const int64_t n = std::clamp<int64_t>(recv_counts[b] - offset, 0, slice);
      if (n > 0) std::memcpy(slot + b * slice * elem, in + (starts[b] + offset) * elem, n * elem);
    }
    mine->staged.value.store(round + 1, std::memory_order_release);
    WaitForPeers(Stage::kStaged, round + 1);
    const int64_t n = std::clamp<int64_t>(recv_counts[local_rank_] - offset, 0, slice);
    if (n > 0) {
      for (int r = 0; r < local_size_; ++r) sources[r] = Slot(r, round) + local_rank_ * slice * elem;
      ReduceMany(dtype, op, sources.data(), local_size_, out + offset * elem, n);
    }
    // Done reading the peers' slots of this round (nothing is reduced for others).
    mine->reduced.value.store(round + 1, std::memory_order_release);
    mine->copied.value.store(round + 1, std::memory_order_release);
  }
  return Status::OK();
}

}  // namespace smdist
