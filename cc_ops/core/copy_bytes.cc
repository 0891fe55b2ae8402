#include "copy_bytes.h"

#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace smdist {
namespace {
// Below this glibc copies with vector moves anyway.
constexpr size_t kVectorLoopMinBytes = 1024;
}  // namespace

void CopyBytes(void* dst, const void* src, size_t bytes) {
#if defined(__x86_64__)
  if (bytes >= kVectorLoopMinBytes && SlowForRepMovsb(dst, src)) {
    auto* d = static_cast<uint8_t*>(dst);
    const auto* s = static_cast<const uint8_t*>(src);
    size_t i = 0;
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
    std::memcpy(d + i, s + i, bytes - i);  // under 64 bytes: no rep movsb
    return;
  }
#endif
  std::memcpy(dst, src, bytes);
}

}  // namespace smdist
