#include "common/reduction.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "common/copy_bytes.h"
#include "common/half.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace smdist {
namespace {

template <typename T>
inline T ApplyOp(ReduceOp op, T a, T b) {
  switch (op) {
    case ReduceOp::kMin:
      if constexpr (std::is_floating_point<T>::value) {
        if (std::isnan(a) || std::isnan(b)) return std::isnan(a) ? a : b;
      }
      return a < b ? a : b;
    case ReduceOp::kMax:
      if constexpr (std::is_floating_point<T>::value) {
        if (std::isnan(a) || std::isnan(b)) return std::isnan(a) ? a : b;
      }
      return a > b ? a : b;
    case ReduceOp::kProduct:
      return static_cast<T>(a * b);
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
    default:
      return static_cast<T>(a + b);
  }
}

template <typename T>
void ReduceTyped(ReduceOp op, const void* in, void* inout, int64_t n) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  // The common case gets a plain loop the compiler can vectorise.
  if (op == ReduceOp::kSum || op == ReduceOp::kAverage) {
    for (int64_t i = 0; i < n; ++i) b[i] = static_cast<T>(b[i] + a[i]);
    return;
  }
  for (int64_t i = 0; i < n; ++i) b[i] = ApplyOp<T>(op, a[i], b[i]);
}

// out[i] = a[i] + b[i]: the first two inputs of a sum in one pass, instead of
// a copy followed by an accumulate.
template <typename T>
bool SumTwoTyped(const void* a, const void* b, void* out, int64_t n) {
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  T* o = static_cast<T*>(out);
  for (int64_t i = 0; i < n; ++i) o[i] = static_cast<T>(x[i] + y[i]);
  return true;
}

bool SumTwo(DataType dtype, const void* a, const void* b, void* out, int64_t n) {
  switch (dtype) {
    case DataType::kFloat32: return SumTwoTyped<float>(a, b, out, n);
    case DataType::kFloat64: return SumTwoTyped<double>(a, b, out, n);
    case DataType::kInt32: return SumTwoTyped<int32_t>(a, b, out, n);
    case DataType::kInt64: return SumTwoTyped<int64_t>(a, b, out, n);
    default: return false;
  }
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void ReduceHalfLike(ReduceOp op, const void* in, void* inout, int64_t n) {
  const uint16_t* a = static_cast<const uint16_t*>(in);
  uint16_t* b = static_cast<uint16_t*>(inout);
  for (int64_t i = 0; i < n; ++i) {
    b[i] = FromFloat(ApplyOp<float>(op, ToFloat(a[i]), ToFloat(b[i])));
  }
}

// out may alias in (ScaleInPlace).
template <typename T>
void ScaleTyped(const void* in, void* out, int64_t n, double factor) {
  const T* p = static_cast<const T*>(in);
  T* o = static_cast<T*>(out);
  if constexpr (std::is_floating_point<T>::value) {
    const T f = static_cast<T>(factor);
    for (int64_t i = 0; i < n; ++i) o[i] = p[i] * f;
  } else {
    for (int64_t i = 0; i < n; ++i) o[i] = static_cast<T>(std::trunc(p[i] * factor));
  }
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void ScaleHalfLike(const void* in, void* out, int64_t n, double factor) {
  const uint16_t* p = static_cast<const uint16_t*>(in);
  uint16_t* o = static_cast<uint16_t*>(out);
  const float f = static_cast<float>(factor);
  for (int64_t i = 0; i < n; ++i) o[i] = FromFloat(ToFloat(p[i]) * f);
}

// inout[i] = (inout[i] + in[i]) * f: the last input of a scaled sum and the
// scaling in one pass. Rounds exactly as a sum followed by ScaleInPlace.
template <typename T>
void AddThenScaleTyped(const void* in, void* inout, int64_t n, double factor) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  const T f = static_cast<T>(factor);
  for (int64_t i = 0; i < n; ++i) b[i] = static_cast<T>(b[i] + a[i]) * f;
}

// out[i] = (a[i] + b[i]) * f, rounding as SumTwo followed by ScaleInPlace.
template <typename T>
void SumTwoThenScaleTyped(const void* a, const void* b, void* out, int64_t n, double factor) {
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  T* o = static_cast<T*>(out);
  const T f = static_cast<T>(factor);
  for (int64_t i = 0; i < n; ++i) o[i] = static_cast<T>(x[i] + y[i]) * f;
}

template <typename T>
void ReduceManyThenScaleTyped(const void* const* inputs, int n, void* out, int64_t count, double factor) {
  if (n == 2) return SumTwoThenScaleTyped<T>(inputs[0], inputs[1], out, count, factor);
  SumTwoTyped<T>(inputs[0], inputs[1], out, count);
  for (int k = 2; k + 1 < n; ++k) ReduceTyped<T>(ReduceOp::kSum, inputs[k], out, count);
  AddThenScaleTyped<T>(inputs[n - 1], out, count, factor);
}

template <typename T>
T IdentityOf(ReduceOp op) {
  constexpr bool kInf = std::numeric_limits<T>::has_infinity;
  switch (op) {
    case ReduceOp::kProduct: return T(1);
    case ReduceOp::kMin: return kInf ? std::numeric_limits<T>::infinity() : std::numeric_limits<T>::max();
    case ReduceOp::kMax: return kInf ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::lowest();
    default: return T(0);
  }
}

template <typename T>
void FillTyped(void* data, int64_t n, T value) {
  std::fill_n(static_cast<T*>(data), n, value);
}

template <typename T>
void DivideTyped(void* buf, int64_t n, int64_t divisor) {
  T* p = static_cast<T*>(buf);
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(p[i] / static_cast<T>(divisor));
}

#if defined(__x86_64__)
// float16 sums with hardware conversion (F16C) eight lanes at a time; chosen
// at run time (CpuHasF16c) so the library still runs on CPUs without it.

__attribute__((target("avx,f16c"))) int64_t SumHalfF16c(const void* const* inputs, int n,
                                                         void* out, int64_t count) {
  uint16_t* o = static_cast<uint16_t*>(out);
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    __m256 acc = _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(inputs[0]) + i)));
    for (int k = 1; k < n; ++k) {
      const auto* in = static_cast<const uint16_t*>(inputs[k]) + i;
      acc = _mm256_add_ps(acc, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in))));
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o + i), _mm256_cvtps_ph(acc, _MM_FROUND_TO_NEAREST_INT));
  }
  return i;  // elements done; the caller finishes the tail
}
#endif

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void ReduceManyHalfLike(ReduceOp op, const void* const* inputs, int n, void* out, int64_t count) {
  // Blocked so the float accumulator stays in L1 while every input streams by.
  constexpr int64_t kBlock = 1024;
  float acc[kBlock];
  uint16_t* o = static_cast<uint16_t*>(out);
  for (int64_t base = 0; base < count; base += kBlock) {
    const int64_t len = std::min(kBlock, count - base);
    const uint16_t* first = static_cast<const uint16_t*>(inputs[0]) + base;
    for (int64_t i = 0; i < len; ++i) acc[i] = ToFloat(first[i]);
    for (int k = 1; k < n; ++k) {
      const uint16_t* in = static_cast<const uint16_t*>(inputs[k]) + base;
      if (op == ReduceOp::kSum || op == ReduceOp::kAverage) {
        for (int64_t i = 0; i < len; ++i) acc[i] += ToFloat(in[i]);
      } else {
        for (int64_t i = 0; i < len; ++i) acc[i] = ApplyOp<float>(op, ToFloat(in[i]), acc[i]);
      }
    }
    for (int64_t i = 0; i < len; ++i) o[base + i] = FromFloat(acc[i]);
  }
}

}  // namespace

void ReduceMany(DataType dtype, ReduceOp op, const void* const* inputs, int n, void* out,
                int64_t count) {
#if defined(__x86_64__)
  if (dtype == DataType::kFloat16 && (op == ReduceOp::kSum || op == ReduceOp::kAverage) &&
      CpuHasF16c()) {
    const int64_t done = SumHalfF16c(inputs, n, out, count);
    if (done == count) return;
    std::vector<const void*> rest(n);
    for (int k = 0; k < n; ++k) rest[k] = static_cast<const uint16_t*>(inputs[k]) + done;
    return ReduceManyHalfLike<HalfToFloat, FloatToHalf>(op, rest.data(), n,
                                                        static_cast<uint16_t*>(out) + done, count - done);
  }
#endif
  if (dtype == DataType::kFloat16) {
    return ReduceManyHalfLike<HalfToFloat, FloatToHalf>(op, inputs, n, out, count);
  }
  if (dtype == DataType::kBFloat16) {
    return ReduceManyHalfLike<BFloat16ToFloat, FloatToBFloat16>(op, inputs, n, out, count);
  }
  int k = 1;
  if (n >= 2 && (op == ReduceOp::kSum || op == ReduceOp::kAverage) &&
      SumTwo(dtype, inputs[0], inputs[1], out, count)) {
    k = 2;
  } else if (out != inputs[0]) {
    CopyBytes(out, inputs[0], static_cast<size_t>(count) * DataTypeSize(dtype));
  }
  for (; k < n; ++k) ReduceInto(dtype, op, inputs[k], out, count);
}

void ReduceManyThenScale(DataType dtype, ReduceOp op, const void* const* inputs, int n, void* out,
                         int64_t count, double scale) {
  const bool sum = op == ReduceOp::kSum || op == ReduceOp::kAverage;
  if (scale != 1.0 && sum && n >= 2) {
    if (dtype == DataType::kFloat32) return ReduceManyThenScaleTyped<float>(inputs, n, out, count, scale);
    if (dtype == DataType::kFloat64) return ReduceManyThenScaleTyped<double>(inputs, n, out, count, scale);
  }
  ReduceMany(dtype, op, inputs, n, out, count);
  ScaleInPlace(dtype, out, count, scale);
}

void ReduceInto(DataType dtype, ReduceOp op, const void* in, void* inout, int64_t count) {
  switch (dtype) {
    case DataType::kUInt8: return ReduceTyped<uint8_t>(op, in, inout, count);
    case DataType::kBool: return ReduceTyped<uint8_t>(op, in, inout, count);
    case DataType::kInt8: return ReduceTyped<int8_t>(op, in, inout, count);
    case DataType::kUInt16: return ReduceTyped<uint16_t>(op, in, inout, count);
    case DataType::kInt16: return ReduceTyped<int16_t>(op, in, inout, count);
    case DataType::kInt32: return ReduceTyped<int32_t>(op, in, inout, count);
    case DataType::kInt64: return ReduceTyped<int64_t>(op, in, inout, count);
    case DataType::kFloat32: return ReduceTyped<float>(op, in, inout, count);
    case DataType::kFloat64: return ReduceTyped<double>(op, in, inout, count);
    case DataType::kFloat16: {
      const void* inputs[2] = {inout, in};
      return ReduceMany(dtype, op, inputs, 2, inout, count);
    }
    case DataType::kBFloat16:
      return ReduceHalfLike<BFloat16ToFloat, FloatToBFloat16>(op, in, inout, count);
  }
}

void ScaleInPlace(DataType dtype, void* buf, int64_t count, double factor) {
  if (factor != 1.0) ScaleInto(dtype, buf, buf, count, factor);
}

void ScaleInto(DataType dtype, const void* in, void* out, int64_t count, double factor) {
  if (factor == 1.0) {
    if (out != in) CopyBytes(out, in, static_cast<size_t>(count) * DataTypeSize(dtype));
    return;
  }
  switch (dtype) {
    case DataType::kUInt8: return ScaleTyped<uint8_t>(in, out, count, factor);
    case DataType::kBool:  // logical values: scaling leaves them as they are
      if (out != in) CopyBytes(out, in, static_cast<size_t>(count));
      return;
    case DataType::kInt8: return ScaleTyped<int8_t>(in, out, count, factor);
    case DataType::kUInt16: return ScaleTyped<uint16_t>(in, out, count, factor);
    case DataType::kInt16: return ScaleTyped<int16_t>(in, out, count, factor);
    case DataType::kInt32: return ScaleTyped<int32_t>(in, out, count, factor);
    case DataType::kInt64: return ScaleTyped<int64_t>(in, out, count, factor);
    case DataType::kFloat32: return ScaleTyped<float>(in, out, count, factor);
    case DataType::kFloat64: return ScaleTyped<double>(in, out, count, factor);
    case DataType::kFloat16:
      return ScaleHalfLike<HalfToFloat, FloatToHalf>(in, out, count, factor);
    case DataType::kBFloat16:
      return ScaleHalfLike<BFloat16ToFloat, FloatToBFloat16>(in, out, count, factor);
  }
}

void DivideInPlace(DataType dtype, void* buf, int64_t count, int64_t divisor) {
  switch (dtype) {
    case DataType::kUInt8: return DivideTyped<uint8_t>(buf, count, divisor);
    case DataType::kInt8: return DivideTyped<int8_t>(buf, count, divisor);
    case DataType::kUInt16: return DivideTyped<uint16_t>(buf, count, divisor);
    case DataType::kInt16: return DivideTyped<int16_t>(buf, count, divisor);
    case DataType::kInt32: return DivideTyped<int32_t>(buf, count, divisor);
    case DataType::kInt64: return DivideTyped<int64_t>(buf, count, divisor);
    default: return ScaleInPlace(dtype, buf, count, 1.0 / static_cast<double>(divisor));
  }
}

void FillIdentity(DataType dtype, ReduceOp op, void* data, int64_t count) {
  switch (dtype) {
    case DataType::kUInt8: return FillTyped(data, count, IdentityOf<uint8_t>(op));
    case DataType::kBool:  // logical: Min is "and" (identity true), Max is "or"
      return FillTyped<uint8_t>(data, count, op == ReduceOp::kMin || op == ReduceOp::kProduct ? 1 : 0);
    case DataType::kInt8: return FillTyped(data, count, IdentityOf<int8_t>(op));
    case DataType::kUInt16: return FillTyped(data, count, IdentityOf<uint16_t>(op));
    case DataType::kInt16: return FillTyped(data, count, IdentityOf<int16_t>(op));
    case DataType::kInt32: return FillTyped(data, count, IdentityOf<int32_t>(op));
    case DataType::kInt64: return FillTyped(data, count, IdentityOf<int64_t>(op));
    case DataType::kFloat32: return FillTyped(data, count, IdentityOf<float>(op));
    case DataType::kFloat64: return FillTyped(data, count, IdentityOf<double>(op));
    case DataType::kFloat16: return FillTyped(data, count, FloatToHalf(IdentityOf<float>(op)));
    case DataType::kBFloat16: return FillTyped(data, count, FloatToBFloat16(IdentityOf<float>(op)));
  }
}

}  // namespace smdist
