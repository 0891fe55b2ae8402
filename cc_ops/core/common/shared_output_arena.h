// Memory for allreduce outputs that every rank of the host maps. The rank
// that reduces a shard stores it straight into each peer's output with plain
// stores, instead of handing it to process_vm_writev, which pins and copies
// the peer's pages one by one (on an AMD EPYC VM: 115-150 us for 2 MiB, the
// largest part of a 4 MiB allreduce; see docs/architecture.md).
//
// Each rank owns one arena, a memfd its peers open through /proc/<pid>/fd.
// Only the owner allocates and frees in it; peers write into a block only
// while a collective that has it as an output runs. Blocks keep the arena
// alive, so a tensor TensorFlow holds after shutdown() stays valid.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include "common/status.h"

namespace smdist {

class SharedOutputArena;

// One allocation; returns its pages to the arena when destroyed.
class SharedOutputBlock {
 public:
  SharedOutputBlock(std::shared_ptr<SharedOutputArena> arena, int64_t offset, int64_t bytes);
  ~SharedOutputBlock();
  SharedOutputBlock(const SharedOutputBlock&) = delete;
  SharedOutputBlock& operator=(const SharedOutputBlock&) = delete;

  void* data() const { return data_; }
  int64_t bytes() const { return bytes_; }

 private:
  std::shared_ptr<SharedOutputArena> arena_;
  int64_t offset_;
  int64_t bytes_;
  void* data_;
};

class SharedOutputArena : public std::enable_shared_from_this<SharedOutputArena> {
 public:
  // Blocks are whole pages: page-aligned for TensorFlow and for peers' stores.
  static constexpr int64_t kGranule = 4096;

  // A memfd of `capacity` bytes, mapped here. Pages are committed when first
  // written, so an arena that is never filled costs little memory.
  static Status Create(int64_t capacity, std::shared_ptr<SharedOutputArena>* out);
  SharedOutputArena() = default;  // use Create(); public for std::make_shared
  ~SharedOutputArena();
  SharedOutputArena(const SharedOutputArena&) = delete;
  SharedOutputArena& operator=(const SharedOutputArena&) = delete;

  // At least `bytes` (> 0), or null when no free range is large enough.
  // Thread-safe: TensorFlow frees tensors from any thread.
  std::unique_ptr<SharedOutputBlock> Allocate(int64_t bytes);

  int fd() const { return fd_; }
  uint8_t* base() const { return base_; }
  int64_t capacity() const { return capacity_; }
  int64_t bytes_in_use() const;

 private:
  friend class SharedOutputBlock;
  void Free(int64_t offset, int64_t bytes);

  int fd_ = -1;
  uint8_t* base_ = nullptr;
  int64_t capacity_ = 0;
  mutable std::mutex mu_;
  std::map<int64_t, int64_t> free_;  // offset -> bytes, coalesced
  int64_t in_use_ = 0;
};

// A peer's arena mapped into this process; unmapped when destroyed.
class PeerArenaMapping {
 public:
  // Opens the memfd `fd` of process `pid` through /proc and maps `bytes` of it.
  static Status Map(pid_t pid, int fd, int64_t bytes, std::unique_ptr<PeerArenaMapping>* out);
  PeerArenaMapping() = default;  // use Map(); public for std::make_unique
  ~PeerArenaMapping();
  PeerArenaMapping(const PeerArenaMapping&) = delete;
  PeerArenaMapping& operator=(const PeerArenaMapping&) = delete;

  uint8_t* data() const { return data_; }
  int64_t bytes() const { return bytes_; }

 private:
  uint8_t* data_ = nullptr;
  int64_t bytes_ = 0;
};

}  // namespace smdist
