#include "common/huge_pages.h"

#include <sys/mman.h>

namespace smdist {
namespace {
constexpr uintptr_t kHugePageBytes = uintptr_t{2} << 20;
// Bounds what is remembered; forgetting only costs a repeated (cheap) madvise.
constexpr size_t kMaxRemembered = size_t{1} << 16;
#ifndef MADV_COLLAPSE
constexpr int MADV_COLLAPSE = 25;  // Linux 6.1; older headers lack it
#endif

void AdviseRange(uintptr_t begin, uintptr_t end) {
  void* at = reinterpret_cast<void*>(begin);
  const size_t length = end - begin;
  // Pages faulted in from now on are huge; the collapse converts those already there.
  madvise(at, length, MADV_HUGEPAGE);
  madvise(at, length, MADV_COLLAPSE);
}
}  // namespace

void HugePageAdvisor::Advise(const void* data, size_t bytes) {
  if (bytes < kMinBytes) return;
  const auto begin = reinterpret_cast<uintptr_t>(data);
  // The edges too: a 4 MiB tensor that is not 2 MiB-aligned has only one
  // whole huge page inside it.
  const uintptr_t first = begin & ~(kHugePageBytes - 1);
  const uintptr_t last = (begin + bytes + kHugePageBytes - 1) & ~(kHugePageBytes - 1);
  if (advised_.size() > kMaxRemembered) advised_.clear();
  uintptr_t run = 0;  // start of the current run of pages not yet advised
  for (uintptr_t page = first; page <= last; page += kHugePageBytes) {
    const bool fresh = page < last && advised_.insert(page).second;
    if (fresh && run == 0) run = page;
    if (!fresh && run != 0) {
      AdviseRange(run, page);
      run = 0;
    }
  }
}

}  // namespace smdist
