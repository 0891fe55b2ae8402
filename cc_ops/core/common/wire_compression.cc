#include "common/wire_compression.h"

#include "common/half.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace smdist {
namespace {

template <typename T>
float LoadAsFloat(const void* p, int64_t i) {
  return static_cast<float>(static_cast<const T*>(p)[i]);
}

float LoadAny(DataType dtype, const void* p, int64_t i) {
  switch (dtype) {
    case DataType::kFloat16: return HalfToFloat(static_cast<const uint16_t*>(p)[i]);
    case DataType::kBFloat16: return BFloat16ToFloat(static_cast<const uint16_t*>(p)[i]);
    case DataType::kFloat64: return LoadAsFloat<double>(p, i);
    default: return LoadAsFloat<float>(p, i);
  }
}

void StoreAny(DataType dtype, void* p, int64_t i, float v) {
  switch (dtype) {
    case DataType::kFloat16: static_cast<uint16_t*>(p)[i] = FloatToHalf(v); break;
    case DataType::kBFloat16: static_cast<uint16_t*>(p)[i] = FloatToBFloat16(v); break;
    case DataType::kFloat64: static_cast<double*>(p)[i] = v; break;
    default: static_cast<float*>(p)[i] = v; break;
  }
}

#if defined(__x86_64__)
// float32 <-> float16 eight lanes at a time; returns the elements done.
__attribute__((target("avx,f16c"))) int64_t NarrowFloatToHalfF16c(const float* in, uint16_t* out,
                                                                  int64_t count, float scale) {
  const __m256 s = _mm256_set1_ps(scale);
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    __m256 v = _mm256_loadu_ps(in + i);
    if (scale != 1.0f) v = _mm256_mul_ps(v, s);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  return i;
}

__attribute__((target("avx,f16c"))) int64_t WidenHalfToFloatF16c(const uint16_t* in, float* out,
                                                                 int64_t count, float scale) {
  const __m256 s = _mm256_set1_ps(scale);
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
    if (scale != 1.0f) v = _mm256_mul_ps(v, s);
    _mm256_storeu_ps(out + i, v);
  }
  return i;
}
#endif

}  // namespace

void NarrowToWire(DataType dtype, const void* in, DataType wire, void* out, int64_t count,
                  double scale) {
  const float s = static_cast<float>(scale);
  int64_t i = 0;
#if defined(__x86_64__)
  if (dtype == DataType::kFloat32 && wire == DataType::kFloat16 && CpuHasF16c()) {
    i = NarrowFloatToHalfF16c(static_cast<const float*>(in), static_cast<uint16_t*>(out), count, s);
  }
#endif
  if (dtype == DataType::kFloat32 && wire == DataType::kBFloat16) {
    const float* src = static_cast<const float*>(in);
    uint16_t* dst = static_cast<uint16_t*>(out);
    for (; i < count; ++i) dst[i] = FloatToBFloat16(s == 1.0f ? src[i] : src[i] * s);
    return;
  }
  for (; i < count; ++i) {
    // Doubles scale in double before narrowing, as a cast after scaling would.
    const float v = dtype == DataType::kFloat64
                        ? static_cast<float>(static_cast<const double*>(in)[i] * scale)
                        : LoadAny(dtype, in, i) * s;
    StoreAny(wire, out, i, v);
  }
}

void WidenFromWire(DataType wire, const void* in, DataType dtype, void* out, int64_t count,
                   double scale) {
  const float s = static_cast<float>(scale);
  int64_t i = 0;
#if defined(__x86_64__)
  if (wire == DataType::kFloat16 && dtype == DataType::kFloat32 && CpuHasF16c()) {
    i = WidenHalfToFloatF16c(static_cast<const uint16_t*>(in), static_cast<float*>(out), count, s);
  }
#endif
  if (wire == DataType::kBFloat16 && dtype == DataType::kFloat32) {
    const uint16_t* src = static_cast<const uint16_t*>(in);
    float* dst = static_cast<float*>(out);
    for (; i < count; ++i) dst[i] = BFloat16ToFloat(src[i]) * s;
    return;
  }
  for (; i < count; ++i) {
    if (dtype == DataType::kFloat64) {
      static_cast<double*>(out)[i] = static_cast<double>(LoadAny(wire, in, i)) * scale;
    } else {
      StoreAny(dtype, out, i, LoadAny(wire, in, i) * s);
    }
  }
}

}  // namespace smdist
