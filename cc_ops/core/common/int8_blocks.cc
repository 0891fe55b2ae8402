#include "common/int8_blocks.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

// The loops below are inlined into each clone, so each is compiled for its CPU.
#if defined(__x86_64__) && defined(__GNUC__)
#define SMDIST_INT8_CLONES __attribute__((target_clones("avx2", "default")))
#define SMDIST_INT8_INLINE inline __attribute__((always_inline))
#else
#define SMDIST_INT8_CLONES
#define SMDIST_INT8_INLINE inline
#endif

namespace smdist {
namespace {

SMDIST_INT8_INLINE int64_t Blocks(int64_t count) { return (count + kInt8BlockElements - 1) / kInt8BlockElements; }

// The largest |x[i]| as the bits of a float: for non-negative floats the bit
// patterns order like the values, so an integer max finds it (and vectorizes,
// where a float max must keep NaN's semantics and does not). Bits at or above
// those of infinity mean an infinity or a NaN.
SMDIST_INT8_INLINE uint32_t LargestMagnitudeBits(const float* x, int64_t n) {
  uint32_t largest = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, sizeof(bits));
    bits &= 0x7fffffffu;
    largest = bits > largest ? bits : largest;
  }
  return largest;
}

// One block's scale, and its int8 values in `q`.
SMDIST_INT8_INLINE float QuantizeBlock(const float* x, int64_t n, int8_t* q) {
  constexpr uint32_t kInfinityBits = 0x7f800000u;
  const uint32_t bits = LargestMagnitudeBits(x, n);
  if (bits == 0 || bits >= kInfinityBits) {
    for (int64_t i = 0; i < n; ++i) q[i] = 0;
    return bits == 0 ? 0.0f : std::numeric_limits<float>::quiet_NaN();
  }
  float largest;
  std::memcpy(&largest, &bits, sizeof(largest));
  const float inv = 127.0f / largest;
  if (!std::isfinite(inv)) {
    // A block of denormals: 127 / largest overflows fp32, so divide in double.
    const double d = 127.0 / static_cast<double>(largest);
    for (int64_t i = 0; i < n; ++i) q[i] = static_cast<int8_t>(std::lround(static_cast<double>(x[i]) * d));
  } else {
    // Rounds half away from zero by truncation, which vectorizes; |v| <= 127
    // (up to fp32 rounding), so v + 0.5 truncates into int8's range.
    for (int64_t i = 0; i < n; ++i) {
      const float v = x[i] * inv;
      q[i] = static_cast<int8_t>(static_cast<int32_t>(v + std::copysign(0.5f, v)));
    }
  }
  return largest / 127.0f;
}

}  // namespace

int64_t Int8WireBytes(int64_t count) {
  return Blocks(count) * static_cast<int64_t>(sizeof(float)) + count;
}

// Cloned for AVX2 (chosen at load time where the CPU has it): the build targets
// baseline x86-64, and these loops are most of the ring's time.
SMDIST_INT8_CLONES void QuantizeInt8Blocks(const float* in, int64_t count, uint8_t* wire) {
  const int64_t blocks = Blocks(count);
  auto* q = reinterpret_cast<int8_t*>(wire + blocks * sizeof(float));
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t at = b * kInt8BlockElements;
    const int64_t n = std::min(count - at, kInt8BlockElements);
    const float scale = QuantizeBlock(in + at, n, q + at);
    std::memcpy(wire + b * sizeof(float), &scale, sizeof(float));
  }
}

SMDIST_INT8_CLONES void DequantizeInt8Blocks(const uint8_t* wire, int64_t count, float* out, bool accumulate) {
  const int64_t blocks = Blocks(count);
  const auto* q = reinterpret_cast<const int8_t*>(wire + blocks * sizeof(float));
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t at = b * kInt8BlockElements;
    const int64_t n = std::min(count - at, kInt8BlockElements);
    float scale;
    std::memcpy(&scale, wire + b * sizeof(float), sizeof(float));
    float* o = out + at;
    const int8_t* v = q + at;
    if (accumulate) {
      for (int64_t i = 0; i < n; ++i) o[i] += static_cast<float>(v[i]) * scale;
    } else {
      for (int64_t i = 0; i < n; ++i) o[i] = static_cast<float>(v[i]) * scale;
    }
  }
}

}  // namespace smdist
