#include "common/copy_bytes.h"

#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#include <emmintrin.h>
#endif

namespace smdist {
namespace {
// Below this glibc copies with vector moves anyway.
constexpr size_t kVectorLoopMinBytes = 1024;
}  // namespace

bool CpuHasSlowMovsbWindow() {
#if defined(__x86_64__)
  static const bool amd = [] {
    unsigned int eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid(0, &eax, &ebx, &ecx, &edx)) return false;
    char vendor[13] = {0};
    std::memcpy(vendor, &ebx, 4);
    std::memcpy(vendor + 4, &edx, 4);
    std::memcpy(vendor + 8, &ecx, 4);
    return std::strcmp(vendor, "AuthenticAMD") == 0;
  }();
  return amd;
#else
  return false;
#endif
}

void CopyBytesVectorLoop(void* dst, const void* src, size_t bytes) {
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  size_t i = 0;
#if defined(__x86_64__)
  // Intrinsics, not a plain loop: the compiler would turn a loop back into memcpy.
  for (; i + 64 <= bytes; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
#endif
  std::memcpy(d + i, s + i, bytes - i);  // under 64 bytes: no rep movsb
}

void CopyBytes(void* dst, const void* src, size_t bytes) {
  if (bytes >= kVectorLoopMinBytes && SlowForRepMovsb(dst, src) && CpuHasSlowMovsbWindow()) {
    CopyBytesVectorLoop(dst, src, bytes);
    return;
  }
  std::memcpy(dst, src, bytes);
}

}  // namespace smdist
