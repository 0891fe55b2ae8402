#include "common/int8_blocks.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace smdist {
namespace {

int64_t Blocks(int64_t count) { return (count + kInt8BlockElements - 1) / kInt8BlockElements; }

// One block's scale, and its int8 values in `q`.
float QuantizeBlock(const float* x, int64_t n, int8_t* q) {
  float largest = 0.0f;
  float non_finite = 0.0f;  // becomes NaN if any x is infinite or NaN
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    largest = a > largest ? a : largest;
    non_finite += x[i] * 0.0f;
  }
  if (largest == 0.0f || non_finite != 0.0f || !(largest <= std::numeric_limits<float>::max())) {
    std::memset(q, 0, static_cast<size_t>(n));
    return largest == 0.0f && non_finite == 0.0f ? 0.0f : std::numeric_limits<float>::quiet_NaN();
  }
  const float inv = 127.0f / largest;
  if (!std::isfinite(inv)) {
    // A block of denormals: 127 / largest overflows fp32, so divide in double.
    const double d = 127.0 / static_cast<double>(largest);
    for (int64_t i = 0; i < n; ++i) q[i] = static_cast<int8_t>(std::lround(static_cast<double>(x[i]) * d));
  } else {
    // Rounds half away from zero by truncation, which the compiler vectorizes;
    // |v| <= 127 (up to fp32 rounding), so v + 0.5 truncates into int8's range.
    for (int64_t i = 0; i < n; ++i) {
      const float v = x[i] * inv;
      q[i] = static_cast<int8_t>(static_cast<int32_t>(v + (v >= 0.0f ? 0.5f : -0.5f)));
    }
  }
  return largest / 127.0f;
}

}  // namespace

int64_t Int8WireBytes(int64_t count) {
  return Blocks(count) * static_cast<int64_t>(sizeof(float)) + count;
}

void QuantizeInt8Blocks(const float* in, int64_t count, uint8_t* wire) {
  const int64_t blocks = Blocks(count);
  auto* q = reinterpret_cast<int8_t*>(wire + blocks * sizeof(float));
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t at = b * kInt8BlockElements;
    const int64_t n = count - at < kInt8BlockElements ? count - at : kInt8BlockElements;
    const float scale = QuantizeBlock(in + at, n, q + at);
    std::memcpy(wire + b * sizeof(float), &scale, sizeof(float));
  }
}

void DequantizeInt8Blocks(const uint8_t* wire, int64_t count, float* out, bool accumulate) {
  const int64_t blocks = Blocks(count);
  const auto* q = reinterpret_cast<const int8_t*>(wire + blocks * sizeof(float));
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t at = b * kInt8BlockElements;
    const int64_t n = count - at < kInt8BlockElements ? count - at : kInt8BlockElements;
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
