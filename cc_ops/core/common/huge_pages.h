// Backs large tensor buffers with transparent huge pages, as numpy does for its
// arrays of 4 MiB and more. TensorFlow's CPU allocator never asks for them, and
// the cross-memory path pays per 4 KiB page: every process_vm_readv / writev
// pins the peer's pages one at a time, and small pages mean more TLB misses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_set>

namespace smdist {

class HugePageAdvisor {
 public:
  // Smaller buffers are left alone (numpy's threshold).
  static constexpr size_t kMinBytes = size_t{4} << 20;

  // Marks every huge page that [data, data + bytes) touches MADV_HUGEPAGE and
  // collapses it into one huge page now (MADV_COLLAPSE, Linux 6.1+), once per
  // huge page: TensorFlow reuses its buffers, so each is collapsed once. The
  // contents do not change; pages shared with neighbouring allocations of this
  // process are merged too. Best effort: the kernel may refuse (THP disabled,
  // an older kernel, no free huge page), and then nothing changes.
  void Advise(const void* data, size_t bytes);

 private:
  std::unordered_set<uintptr_t> advised_;  // huge-page-aligned addresses
};

}  // namespace smdist
