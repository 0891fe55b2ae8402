#include "transports/cma/cross_memory_allreduce.h"

#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "common/copy_bytes.h"
#include "common/logging.h"
#include "common/reduction.h"
#include "common/shard_range.h"
#include "transports/mpi/mpi_types.h"

namespace smdist {
namespace {
// Peers' data is pulled in chunks that stay in L2 while they are reduced.
constexpr int64_t kChunkBytes = 256 * 1024;
constexpr uintptr_t kLineBytes = 64;
}  // namespace

Status CrossMemoryAllreduce::Create(MPI_Comm local, int64_t arena_bytes,
                                    std::unique_ptr<CrossMemoryAllreduce>* out) {
  auto c = std::make_unique<CrossMemoryAllreduce>();
  c->local_ = local;
  MPI_Comm_rank(local, &c->local_rank_);
  MPI_Comm_size(local, &c->local_size_);
  SMDIST_RETURN_IF_ERROR(SharedWindow::Create(local, sizeof(Slot), &c->window_));
  for (int r = 0; r < c->local_size_; ++r) c->slots_.push_back(static_cast<Slot*>(c->window_->part(r)));

  // Prove every peer's memory is readable before anyone relies on it.
  Slot* mine = c->slots_[c->local_rank_];
  mine->pid = static_cast<int64_t>(getpid());
  c->probe_ = 0x5eedf00dULL ^ (static_cast<uint64_t>(getpid()) << 20) ^ c->local_rank_;
  mine->probe_address = reinterpret_cast<uint64_t>(&c->probe_);
  mine->probe_value = c->probe_;
  mine->arena_fd = -1;
  SMDIST_RETURN_IF_ERROR(c->LocalBarrier());
  int readable = 1;
  for (int r = 0; r < c->local_size_; ++r) {
    if (r == c->local_rank_) continue;
    uint64_t seen = 0;
    const Status s = c->ReadPeer(r, &seen, c->slots_[r]->probe_address, sizeof(seen));
    if (!s.ok() || seen != c->slots_[r]->probe_value) {
      readable = 0;
      continue;
    }
    // Writing back the same value proves results can be pushed too.
    if (!c->WritePeer(r, c->slots_[r]->probe_address, &seen, sizeof(seen)).ok()) readable = 0;
  }
  int everyone = 0;
  const int rc = MPI_Allreduce(&readable, &everyone, 1, MPI_INT, MPI_MIN, local);
  if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Allreduce(cross-memory probe)");
  if (!everyone) return Status::OK();  // the destructor frees the window on every rank
  if (arena_bytes > 0) SMDIST_RETURN_IF_ERROR(c->ShareArenas(arena_bytes));
  *out = std::move(c);
  return Status::OK();
}

Status CrossMemoryAllreduce::ShareArenas(int64_t arena_bytes) {
  Slot* mine = slots_[local_rank_];
  const Status created = SharedOutputArena::Create(arena_bytes, &arena_);
  if (created.ok()) {
    mine->arena_fd = arena_->fd();
    mine->arena_address = reinterpret_cast<uint64_t>(arena_->base());
    mine->arena_bytes = arena_->capacity();
  } else {
    LogWarning("no shared output arena: " + created.message());
  }
  SMDIST_RETURN_IF_ERROR(LocalBarrier());
  int mapped = created.ok() ? 1 : 0;
  peer_arenas_.resize(local_size_);
  for (int r = 0; r < local_size_ && mapped; ++r) {
    if (r == local_rank_) continue;
    if (slots_[r]->arena_fd < 0) {
      mapped = 0;
      break;
    }
    const Status s = PeerArenaMapping::Map(static_cast<pid_t>(slots_[r]->pid),
                                           static_cast<int>(slots_[r]->arena_fd), slots_[r]->arena_bytes,
                                           &peer_arenas_[r]);
    if (!s.ok()) {
      LogWarning("no shared output arena: " + s.message());
      mapped = 0;
    }
  }
  int everyone = 0;
  const int rc = MPI_Allreduce(&mapped, &everyone, 1, MPI_INT, MPI_MIN, local_);
  if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Allreduce(output arena)");
  if (!everyone) {
    // Nothing will be placed in the arenas; outputs go through process_vm_writev.
    peer_arenas_.clear();
    arena_.reset();
  }
  return Status::OK();
}

uint8_t* CrossMemoryAllreduce::MappedPeerAddress(int peer, uint64_t remote, int64_t bytes) const {
  if (peer_arenas_.empty()) return nullptr;
  const Slot* slot = slots_[peer];
  if (remote < slot->arena_address) return nullptr;
  const uint64_t offset = remote - slot->arena_address;
  if (offset + static_cast<uint64_t>(bytes) > static_cast<uint64_t>(slot->arena_bytes)) return nullptr;
  return peer_arenas_[peer]->data() + offset;
}

bool CrossMemoryAllreduce::Enabled(const CollectiveWork& work) const {
  const int64_t tensors = static_cast<int64_t>(work.num_tensors);
  return work.type == CollectiveType::kAllreduce && work.device.is_cpu() && work.readable_in_place() &&
         work.wire_bytes > 0 && work.wire_bytes >= min_bytes_ && tensors <= kMaxSpans &&
         work.wire_bytes >= tensors * kMinMeanSpanBytes;
}

Status CrossMemoryAllreduce::LocalBarrier() { return window_->Barrier(); }

Status CrossMemoryAllreduce::CopyPeer(int peer, void* local, uint64_t remote, int64_t bytes,
                                      bool to_peer) const {
  auto* at = static_cast<uint8_t*>(local);
  const pid_t pid = static_cast<pid_t>(slots_[peer]->pid);
  while (bytes > 0) {
    iovec here{at, static_cast<size_t>(bytes)};
    iovec there{reinterpret_cast<void*>(remote), static_cast<size_t>(bytes)};
    const ssize_t n = to_peer ? process_vm_writev(pid, &here, 1, &there, 1, 0)
                              : process_vm_readv(pid, &here, 1, &there, 1, 0);
    if (n <= 0) {
      return Status::Unknown(std::string(to_peer ? "process_vm_writev to" : "process_vm_readv from") +
                             " local rank " + std::to_string(peer) + " failed: " + std::strerror(errno));
    }
    at += n;
    remote += static_cast<uint64_t>(n);
    bytes -= n;
  }
  return Status::OK();
}

Status CrossMemoryAllreduce::ReadPeer(int peer, void* local, uint64_t remote, int64_t bytes) const {
  return CopyPeer(peer, local, remote, bytes, /*to_peer=*/false);
}

Status CrossMemoryAllreduce::WritePeer(int peer, uint64_t remote, const void* local, int64_t bytes) const {
  // process_vm_writev only reads the local side; iovec just has no const.
  return CopyPeer(peer, const_cast<void*>(local), remote, bytes, /*to_peer=*/true);
}

void CrossMemoryAllreduce::PiecesOf(const std::vector<int64_t>& starts, int64_t begin, int64_t end,
                                    std::vector<Piece>* pieces) const {
  pieces->clear();
  // First span whose range ends after `begin`.
  auto it = std::upper_bound(starts.begin(), starts.end(), begin);
  for (int64_t s = (it - starts.begin()) - 1; s + 1 < static_cast<int64_t>(starts.size()) && begin < end; ++s) {
    const int64_t lo = std::max(begin, starts[s]) - starts[s];
    const int64_t hi = std::min(end, starts[s + 1]) - starts[s];
    if (hi > lo) pieces->push_back({s, lo, hi});
    begin = starts[s + 1];
  }
}

Status CrossMemoryAllreduce::ReduceMyShard(const std::vector<TensorSpan>& spans,
                                           const std::vector<Piece>& pieces, DataType dtype,
                                           ReduceOp op, double postscale) {
  const int64_t elem = static_cast<int64_t>(DataTypeSize(dtype));
  const int64_t chunk = std::max<int64_t>(1, kChunkBytes / elem);
  // Room per peer to place its chunk anywhere within a cache line (below).
  const size_t stride = static_cast<size_t>(chunk * elem) + 2 * kLineBytes;
  scratch_.resize(stride * std::max(1, local_size_ - 1));
  std::vector<const void*> sources(local_size_);
  for (const Piece& p : pieces) {
    const auto* in = static_cast<const uint8_t*>(spans[p.span].input);
    auto* out = static_cast<uint8_t*>(spans[p.span].output);
    for (int64_t at = p.begin; at < p.end; at += chunk) {
      const int64_t n = std::min(chunk, p.end - at);
      sources[0] = in + at * elem;
      int k = 0;
      for (int r = 0; r < local_size_; ++r) {
        if (r == local_rank_) continue;
        const uint64_t remote = slots_[r]->addresses[2 * p.span] + at * elem;
        // An input in the peer's arena (an earlier allreduce's output) is read in place.
        if (const uint8_t* mapped = MappedPeerAddress(r, remote, n * elem)) {
          sources[++k] = mapped;
          continue;
        }
        // The kernel copies with rep movsb, slow when the destination lies just
        // past the source modulo 4 KiB (copy_bytes.h): same offset in a line as the source.
        const uintptr_t slack = reinterpret_cast<uintptr_t>(scratch_.data()) + static_cast<size_t>(k) * stride;
        const uintptr_t line = (slack + kLineBytes - 1) & ~(kLineBytes - 1);
        auto* into = reinterpret_cast<uint8_t*>(line + (remote & (kLineBytes - 1)));
        SMDIST_RETURN_IF_ERROR(ReadPeer(r, into, remote, n * elem));
        sources[++k] = into;
      }
      ReduceManyThenScale(dtype, op, sources.data(), local_size_, out + at * elem, n, postscale);
      // Pushed to every peer's output while still in cache, instead of each peer
      // reading it back later: a plain copy when the output is in the peer's arena.
      for (int r = 0; r < local_size_; ++r) {
        if (r == local_rank_) continue;
        const uint64_t remote = slots_[r]->addresses[2 * p.span + 1] + at * elem;
        if (uint8_t* mapped = MappedPeerAddress(r, remote, n * elem)) {
          CopyBytes(mapped, out + at * elem, static_cast<size_t>(n * elem));
        } else {
          SMDIST_RETURN_IF_ERROR(WritePeer(r, remote, out + at * elem, n * elem));
        }
      }
    }
  }
  return Status::OK();
}

Status CrossMemoryAllreduce::Run(const std::vector<TensorSpan>& spans, DataType dtype, ReduceOp op,
                                 double postscale) {
  const size_t elem = DataTypeSize(dtype);
  std::vector<int64_t> starts(spans.size() + 1, 0);
  for (size_t s = 0; s < spans.size(); ++s) starts[s + 1] = starts[s] + spans[s].count;
  const int64_t total = starts.back();

  Slot* mine = slots_[local_rank_];
  mine->num_spans = static_cast<int64_t>(spans.size());
  for (size_t s = 0; s < spans.size(); ++s) {
    mine->addresses[2 * s] = reinterpret_cast<uint64_t>(spans[s].input);
    mine->addresses[2 * s + 1] = reinterpret_cast<uint64_t>(spans[s].output);
    const size_t bytes = static_cast<size_t>(spans[s].count) * elem;
    huge_pages_.Advise(spans[s].input, bytes);
    huge_pages_.Advise(spans[s].output, bytes);
  }
  SMDIST_RETURN_IF_ERROR(LocalBarrier());

  // A failed read or write must not strand the peers inside a barrier:
  // finish the protocol, then fail on every rank together.
  std::vector<Piece> pieces;
  int64_t begin = 0, end = 0;
  ShardRange(total, elem, local_size_, local_rank_, &begin, &end);
  PiecesOf(starts, begin, end, &pieces);
  const Status failure = ReduceMyShard(spans, pieces, dtype, op, postscale);
  // Doubles as the only barrier after the reduction: nobody returns (and lets
  // TF free its tensors) while a peer may still read or write them.
  int failed = failure.ok() ? 0 : 1, any_failed = 0;
  int rc = MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, local_);
  if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Allreduce(cross-memory status)");
  if (!failure.ok()) return failure;
  if (any_failed) return Status::Unknown("a peer on this host failed to read or write shared tensors");
  return Status::OK();
}

}  // namespace smdist
