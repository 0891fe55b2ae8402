// Allreduce (and, on a single host, reduce-scatter) among the ranks of one host
// through a shared-memory window: each
// rank stages its data in its own segment (straight from its tensors, through
// a SpanStaging that also converts and scales), reduces one shard straight from
// every peer's segment (no MPI copies), optionally allreduces that shard with
// the same-shard owners on other hosts (hierarchical), and copies every
// reduced shard back out. Each rank does 1/local_size of the arithmetic.
//
// Rounds are double-buffered and ordered by per-rank counters in the window
// (staged / reduced / copied), not MPI barriers: a rank waits only for the
// peers whose data it is about to read or overwrite, and returns as soon as
// it has its result (the segments, not the callers' tensors, are shared).
#pragma once

#include <mpi.h>

#include <memory>
#include <vector>

#include "common/span_staging.h"
#include "common/status.h"
#include "common/types.h"
#include "transports/data_transport.h"
#include "transports/shm/shared_window.h"

namespace smdist {

class SharedMemoryAllreduce : public DataTransport {
 public:
  // Collective over `local`. `cross` (may be MPI_COMM_NULL) links ranks with
  // the same local rank on other hosts. Takes allreduces of at least
  // `min_bytes` on the wire.
  static Status Create(MPI_Comm local, MPI_Comm cross, int64_t segment_bytes, int64_t min_bytes,
                       std::unique_ptr<SharedMemoryAllreduce>* out);
  SharedMemoryAllreduce() = default;  // use Create()
  SharedMemoryAllreduce(const SharedMemoryAllreduce&) = delete;
  SharedMemoryAllreduce& operator=(const SharedMemoryAllreduce&) = delete;

  std::string name() const override { return "shared_memory"; }
  void set_min_bytes(int64_t min_bytes) { min_bytes_ = min_bytes; }
  // Host allreduces of at least min_bytes: it converts and scales as it
  // stages, so compressed and prescaled ones too. Reduce-scatters of at least
  // min_bytes when the whole group is this host (no cross communicator).
  bool Enabled(const CollectiveWork& work) const override;
  // Reduces `staging`'s elements (its wire type) across the host's ranks and
  // writes the result through it. Every local rank passes the same count.
  Status Allreduce(const SpanStaging& staging, ReduceOp op) override;
  // Each round stages, from every rank, a slice of every rank's block; each rank
  // reduces its own block's slice from all slots straight into `recv`. So the
  // arithmetic is shared evenly, nothing is copied out of the window, and no
  // buffer beyond the window is needed.
  Status ReduceScatter(const void* send, void* recv, const std::vector<int64_t>& recv_counts, DataType dtype,
                       ReduceOp op) override;

  // Bytes staged per rank per round on a single host: rounds that stay in
  // cache, and the next round is staged while peers copy out the last.
  static constexpr int64_t kSingleHostRoundBytes = 1 << 20;

 private:
  struct Header;
  enum class Stage { kStaged, kReduced, kCopied };
  // Waits until `peer`'s (or every peer's) `stage` counter reaches `round`.
  void WaitForPeer(int peer, Stage stage, uint64_t round) const;
  void WaitForPeers(Stage stage, uint64_t round) const;
  uint8_t* Slot(int rank, uint64_t round) const;

  MPI_Comm local_ = MPI_COMM_NULL;
  MPI_Comm cross_ = MPI_COMM_NULL;
  std::unique_ptr<SharedWindow> window_;  // freed before the communicators
  int local_rank_ = 0;
  int local_size_ = 1;
  int64_t round_bytes_ = 0;        // per rank per round
  std::vector<Header*> headers_;   // every local rank's counters, mapped here
  std::vector<uint8_t*> slots_;    // every local rank's two round buffers
  uint64_t rounds_done_ = 0;       // same on every local rank: Allreduce is collective
  int64_t min_bytes_ = 0;  // set_min_bytes: autotuning
};

}  // namespace smdist
