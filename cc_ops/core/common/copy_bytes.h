// memcpy for the engine's bulk copies, minus one slow case of `rep movsb`.
//
// glibc copies blocks from a few KiB up to its non-temporal threshold with
// `rep movsb`. On AMD Zen 3 (this project's 2-core development VM) that instruction runs
// 5-9x slower when the destination sits a few bytes after the source modulo
// 4 KiB: a 256 KiB copy took 100 us instead of 11 (benchmarks/copy_alias.py).
// Fused tensors are staged at arbitrary 4-byte offsets, so some copies land in
// that window by chance; those go through a vector loop here, which has no
// such case. Only on AMD CPUs: on an Intel Xeon VM the window costs memcpy
// 5-10% while the loop is 35% slower at 256 KiB, so there memcpy stays.
#pragma once

#include <cstddef>
#include <cstdint>

namespace smdist {

// Bytes between source and destination, modulo 4 KiB, for which `rep movsb`
// is slow: (dst - src) mod 4096 in [1, kSlowMovsbWindow]. Measured slow from
// 4 to 28, normal from 32; the window is doubled for margin.
constexpr uintptr_t kSlowMovsbWindow = 63;

// True when copying from `src` to `dst` would hit the slow case.
inline bool SlowForRepMovsb(const void* dst, const void* src) {
  const uintptr_t delta = (reinterpret_cast<uintptr_t>(dst) - reinterpret_cast<uintptr_t>(src)) & 4095;
  return delta != 0 && delta <= kSlowMovsbWindow;
}

// True on CPUs where the slow case was measured (AMD); decided once.
bool CpuHasSlowMovsbWindow();

// Same contract as std::memcpy: the ranges must not overlap.
void CopyBytes(void* dst, const void* src, size_t bytes);

// The vector loop CopyBytes takes in the slow case, whatever the CPU: for tests
// and benchmarks/copy_alias.py. Same contract as std::memcpy.
void CopyBytesVectorLoop(void* dst, const void* src, size_t bytes);

}  // namespace smdist
