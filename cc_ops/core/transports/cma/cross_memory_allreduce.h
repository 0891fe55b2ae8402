// Allreduce among the ranks of one host by cross-memory attach (Linux
// process_vm_readv/writev): each rank reads its shard of every peer's tensors
// straight out of the peer's address space, reduces it into its own output,
// and writes each reduced chunk into every peer's output while it is still in
// cache. Every byte crosses memory once, instead of being staged in and out of
// a shared segment, and fused tensors are read where they lie, so no
// fusion-buffer copies either.
// Ranks publish their tensor addresses in a small shared control window.
// Tensors that lie in a peer's SharedOutputArena are read and stored directly.
#pragma once

#include <mpi.h>
#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "common/huge_pages.h"
#include "common/shared_output_arena.h"
#include "common/span_staging.h"
#include "common/status.h"
#include "common/types.h"
#include "transports/data_transport.h"
#include "transports/shm/shared_window.h"

namespace smdist {

class CrossMemoryAllreduce : public DataTransport {
 public:
  // Most tensors one call can take (bounded by the control window's size).
  static constexpr int64_t kMaxSpans = 4096;
  // Smallest mean tensor size worth reading in place. Each span costs the
  // kernel a page walk per peer per direction; below this mean the copy path's
  // plain memcpy into the shared segment is cheaper (Intel VM, np=2: the copy
  // path 10-25 % faster at 1-4 KiB per tensor, even at 16 KiB, 5-50 % slower
  // from 32 KiB).
  static constexpr int64_t kMinMeanSpanBytes = 8 << 10;

  // Collective over `local`. Leaves `*out` empty (and returns OK) when some
  // rank of the host cannot read its peers' memory (ptrace restrictions,
  // separate PID namespaces), so every rank falls back together. With
  // `arena_bytes` > 0 every rank also gets an output arena all peers map;
  // if any rank cannot create or map one, none has one.
  static Status Create(MPI_Comm local, int64_t arena_bytes, std::unique_ptr<CrossMemoryAllreduce>* out);
  CrossMemoryAllreduce() = default;  // use Create()
  CrossMemoryAllreduce(const CrossMemoryAllreduce&) = delete;
  CrossMemoryAllreduce& operator=(const CrossMemoryAllreduce&) = delete;

  std::string name() const override { return "cross_memory"; }
  // Host allreduces of at least min_bytes whose tensors can be read where they
  // lie (no conversion or prescaling), not too many and not too small on average.
  bool Enabled(const CollectiveWork& work) const override;
  Status Allreduce(const SpanStaging& staging, ReduceOp op) override {
    return Run(staging.spans(), staging.dtype(), op, staging.postscale());
  }
  void set_min_bytes(int64_t min_bytes) { min_bytes_ = min_bytes; }

  // Reduces every span's input across the host's ranks into its output, then
  // multiplies by `postscale`. Every rank passes spans of the same counts in
  // the same order. `op` is Sum, Min, Max or Product.
  Status Run(const std::vector<TensorSpan>& spans, DataType dtype, ReduceOp op, double postscale);

  // This rank's output arena, or null.
  const std::shared_ptr<SharedOutputArena>& output_arena() const { return arena_; }

 private:
  // One per rank in the control window.
  struct Slot {
    int64_t pid;
    uint64_t probe_address;  // a word peers read once at start-up to prove access
    uint64_t probe_value;
    int64_t arena_fd;          // -1 without an arena
    uint64_t arena_address;    // where the owner maps it
    int64_t arena_bytes;
    int64_t num_spans;
    uint64_t addresses[2 * kMaxSpans];  // input, output of each span
  };
  // A contiguous run of elements [begin, end) inside span `span`.
  struct Piece {
    int64_t span;
    int64_t begin;
    int64_t end;
  };

  Status LocalBarrier();
  // Creates this rank's arena and maps every peer's; all ranks or none.
  Status ShareArenas(int64_t arena_bytes);
  // Where address `remote` of rank `peer` is mapped here, or null when
  // [remote, remote + bytes) is not inside the peer's arena.
  uint8_t* MappedPeerAddress(int peer, uint64_t remote, int64_t bytes) const;
  // Reads `bytes` at `remote` in rank `peer`'s memory into `local`.
  Status ReadPeer(int peer, void* local, uint64_t remote, int64_t bytes) const;
  // Writes `bytes` from `local` to `remote` in rank `peer`'s memory.
  Status WritePeer(int peer, uint64_t remote, const void* local, int64_t bytes) const;
  // Either direction, retrying short transfers.
  Status CopyPeer(int peer, void* local, uint64_t remote, int64_t bytes, bool to_peer) const;
  // Splits global elements [begin, end) of the concatenated spans into per-span pieces.
  void PiecesOf(const std::vector<int64_t>& starts, int64_t begin, int64_t end,
                std::vector<Piece>* pieces) const;
  Status ReduceMyShard(const std::vector<TensorSpan>& spans, const std::vector<Piece>& pieces,
                       DataType dtype, ReduceOp op, double postscale);

  MPI_Comm local_ = MPI_COMM_NULL;
  std::unique_ptr<SharedWindow> window_;  // freed before the communicators
  int local_rank_ = 0;
  int local_size_ = 1;
  std::vector<Slot*> slots_;          // every local rank's slot, mapped here
  std::vector<uint8_t> scratch_;      // one chunk per peer during the reduction
  HugePageAdvisor huge_pages_;        // for the tensors peers read and write
  std::shared_ptr<SharedOutputArena> arena_;
  std::vector<std::unique_ptr<PeerArenaMapping>> peer_arenas_;  // by local rank; null for this one
  uint64_t probe_ = 0;
  int64_t min_bytes_ = 0;
};

}  // namespace smdist
