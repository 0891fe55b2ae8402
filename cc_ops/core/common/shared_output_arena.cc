#include "common/shared_output_arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace smdist {
namespace {
Status Errno(const std::string& what) { return Status::Unknown(what + ": " + std::strerror(errno)); }
}  // namespace

SharedOutputBlock::SharedOutputBlock(std::shared_ptr<SharedOutputArena> arena, int64_t offset,
                                     int64_t bytes)
    : arena_(std::move(arena)), offset_(offset), bytes_(bytes), data_(arena_->base() + offset) {}

SharedOutputBlock::~SharedOutputBlock() { arena_->Free(offset_, bytes_); }

Status SharedOutputArena::Create(int64_t capacity, std::shared_ptr<SharedOutputArena>* out) {
  out->reset();
  capacity = (capacity / kGranule) * kGranule;
  if (capacity <= 0) return Status::InvalidArgument("shared output arena: capacity below one page");
  auto a = std::make_shared<SharedOutputArena>();
  a->fd_ = memfd_create("smdist-output-arena", MFD_CLOEXEC);
  if (a->fd_ < 0) return Errno("memfd_create");
  if (ftruncate(a->fd_, capacity) != 0) return Errno("ftruncate(shared output arena)");
  void* p = mmap(nullptr, static_cast<size_t>(capacity), PROT_READ | PROT_WRITE, MAP_SHARED, a->fd_, 0);
  if (p == MAP_FAILED) return Errno("mmap(shared output arena)");
  a->base_ = static_cast<uint8_t*>(p);
  a->capacity_ = capacity;
  a->free_[0] = capacity;
  *out = std::move(a);
  return Status::OK();
}

SharedOutputArena::~SharedOutputArena() {
  if (base_ != nullptr) munmap(base_, static_cast<size_t>(capacity_));
  if (fd_ >= 0) close(fd_);
}

std::unique_ptr<SharedOutputBlock> SharedOutputArena::Allocate(int64_t bytes) {
  if (bytes <= 0) return nullptr;
  const int64_t want = (bytes + kGranule - 1) / kGranule * kGranule;
  int64_t offset = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // First fit: blocks come and go in the same sizes step after step.
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < want) continue;
      offset = it->first;
      const int64_t left = it->second - want;
      free_.erase(it);
      if (left > 0) free_[offset + want] = left;
      in_use_ += want;
      break;
    }
  }
  if (offset < 0) return nullptr;
  return std::make_unique<SharedOutputBlock>(shared_from_this(), offset, want);
}

void SharedOutputArena::Free(int64_t offset, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  in_use_ -= bytes;
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && offset + bytes == next->first) {
    bytes += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += bytes;
      return;
    }
  }
  free_[offset] = bytes;
}

int64_t SharedOutputArena::bytes_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_use_;
}

Status PeerArenaMapping::Map(pid_t pid, int fd, int64_t bytes, std::unique_ptr<PeerArenaMapping>* out) {
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  const int opened = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (opened < 0) return Errno("open " + path);
  void* p = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, opened, 0);
  close(opened);  // the mapping keeps the memfd alive
  if (p == MAP_FAILED) return Errno("mmap " + path);
  auto m = std::make_unique<PeerArenaMapping>();
  m->data_ = static_cast<uint8_t*>(p);
  m->bytes_ = bytes;
  *out = std::move(m);
  return Status::OK();
}

PeerArenaMapping::~PeerArenaMapping() {
  if (data_ != nullptr) munmap(data_, static_cast<size_t>(bytes_));
}

}  // namespace smdist
