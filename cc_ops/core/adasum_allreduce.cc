#include "adasum_allreduce.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "common/half.h"
#include "common/span_staging.h"
#include "transports/transport_choice.h"

namespace smdist {
namespace {

// How one floating-point type is read, accumulated in and written back.
struct Float32Elements {
  using Storage = float;
  using Acc = double;
  static Acc Load(Storage v) { return v; }
  static Storage Store(Acc v) { return static_cast<Storage>(v); }
};
struct Float64Elements {
  using Storage = double;
  using Acc = double;
  static Acc Load(Storage v) { return v; }
  static Storage Store(Acc v) { return v; }
};
struct Float16Elements {
  using Storage = uint16_t;
  using Acc = float;
  static Acc Load(Storage v) { return HalfToFloat(v); }
  static Storage Store(Acc v) { return FloatToHalf(v); }
};
struct BFloat16Elements {
  using Storage = uint16_t;
  using Acc = float;
  static Acc Load(Storage v) { return BFloat16ToFloat(v); }
  static Storage Store(Acc v) { return FloatToBFloat16(v); }
};

// Calls f with the element description of `dtype` (a floating-point type).
template <typename F>
void WithElements(DataType dtype, F&& f) {
  switch (dtype) {
    case DataType::kFloat16: f(Float16Elements{}); break;
    case DataType::kBFloat16: f(BFloat16Elements{}); break;
    case DataType::kFloat64: f(Float64Elements{}); break;
    default: f(Float32Elements{}); break;
  }
}

// Adds a.b, |a|^2 and |b|^2 over `n` elements to out[0], out[1], out[2].
template <typename E>
void AddPartialDots(const void* a, const void* b, int64_t n, double* out) {
  using Acc = typename E::Acc;
  const auto* x = static_cast<const typename E::Storage*>(a);
  const auto* y = static_cast<const typename E::Storage*>(b);
  // Four independent sums each, so the additions need not wait on one another
  // (one chain made the dots cost more than the transfers at 1 MiB).
  constexpr int kLanes = 4;
  Acc ab[kLanes] = {}, aa[kLanes] = {}, bb[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int k = 0; k < kLanes; ++k) {
      const Acc u = E::Load(x[i + k]);
      const Acc v = E::Load(y[i + k]);
      ab[k] += u * v;
      aa[k] += u * u;
      bb[k] += v * v;
    }
  }
  for (; i < n; ++i) {
    const Acc u = E::Load(x[i]);
    const Acc v = E::Load(y[i]);
    ab[0] += u * v;
    aa[0] += u * u;
    bb[0] += v * v;
  }
  out[0] += (ab[0] + ab[1]) + (ab[2] + ab[3]);
  out[1] += (aa[0] + aa[1]) + (aa[2] + aa[3]);
  out[2] += (bb[0] + bb[1]) + (bb[2] + bb[3]);
}

// out[i] = ca * a[i] + cb * b[i]; `out` may be `a` or `b`.
template <typename E>
void Combine(const void* a, const void* b, double ca, double cb, void* out, int64_t n) {
  const auto* x = static_cast<const typename E::Storage*>(a);
  const auto* y = static_cast<const typename E::Storage*>(b);
  auto* o = static_cast<typename E::Storage*>(out);
  const auto ka = static_cast<typename E::Acc>(ca);
  const auto kb = static_cast<typename E::Acc>(cb);
  for (int64_t i = 0; i < n; ++i) o[i] = E::Store(ka * E::Load(x[i]) + kb * E::Load(y[i]));
}

// The coefficient of the vector with squared norm `own_norm_sq`: its dot with the
// other vector takes away from it, unless it is zero (then it has no direction).
double Coefficient(double dot, double own_norm_sq) { return own_norm_sq > 0 ? 1.0 - dot / (2.0 * own_norm_sq) : 1.0; }

CollectiveWork HostWork(CollectiveType type, DataType dtype, int64_t bytes) {
  CollectiveWork work;
  work.type = type;
  work.device = Device::Cpu();  // GPU tensors arrive staged in host memory
  work.dtype = dtype;
  work.wire = dtype;
  work.wire_bytes = bytes;
  return work;
}

}  // namespace

std::string AdasumAllreduce::Refusal(DataType dtype, WireCompression compression) const {
  if (!IsFloatingPoint(dtype)) {
    return std::string("Adasum reduces floating-point tensors (float16, bfloat16, float32, float64), not ") +
           DataTypeName(dtype);
  }
  if (compression != WireCompression::kNone) {
    return std::string("Adasum does not combine with wire compression (") + WireCompressionName(compression) +
           "); use Compression.none";
  }
  const int size = topology_.size;
  if ((size & (size - 1)) != 0) {
    return "Adasum needs a power-of-two number of ranks (1, 2, 4, 8, ...); this process set has " +
           std::to_string(size);
  }
  for (CollectiveType type : {CollectiveType::kAlltoall, CollectiveType::kAllgather, CollectiveType::kAllreduce}) {
    if (FirstEnabled(data_plane_, HostWork(type, DataType::kFloat64, 8)) == nullptr) {
      return std::string("no host transport in this build runs the ") + CollectiveTypeName(type) + " Adasum needs";
    }
  }
  return "";
}

Status AdasumAllreduce::Reduce(DataType dtype, const std::vector<int64_t>& counts, void* data) {
  const int rank = topology_.rank;
  const int size = topology_.size;
  const int64_t elem = static_cast<int64_t>(DataTypeSize(dtype));
  auto* bytes = static_cast<uint8_t*>(data);
  const size_t tensors = counts.size();
  std::vector<int64_t> starts(tensors + 1, 0);
  for (size_t t = 0; t < tensors; ++t) starts[t + 1] = starts[t] + counts[t];
  int64_t lo = 0, hi = starts.back();  // this rank's segment of the packed tensors
  for (int distance = 1; distance < size; distance *= 2) {
    // The lower rank of the pair keeps the first half and holds the lower side's vector, a.
    const bool lower = (rank & distance) == 0;
    const int64_t mid = lo + (hi - lo) / 2;
    const int64_t keep_lo = lower ? lo : mid, keep_hi = lower ? mid : hi;
    const int64_t give_lo = lower ? mid : lo, give_hi = lower ? hi : mid;
    SMDIST_RETURN_IF_ERROR(
        Exchange(rank ^ distance, bytes + give_lo * elem, give_hi - give_lo, keep_hi - keep_lo, dtype));
    uint8_t* kept = bytes + keep_lo * elem;
    const uint8_t* a = lower ? kept : received_.data();
    const uint8_t* b = lower ? received_.data() : kept;
    // The 2 * distance ranks of this rank's group hold the pieces of the two vectors
    // combined at this level; each group sums its partial dots in its own slots.
    const size_t slot = static_cast<size_t>(rank / (2 * distance)) * 3 * tensors;
    dots_.assign(static_cast<size_t>(size / (2 * distance)) * 3 * tensors, 0.0);
    WithElements(dtype, [&](auto elements) {
      using E = decltype(elements);
      for (size_t t = 0; t < tensors; ++t) {
        const int64_t from = std::max(starts[t], keep_lo), to = std::min(starts[t + 1], keep_hi);
        if (from < to) AddPartialDots<E>(a + (from - keep_lo) * elem, b + (from - keep_lo) * elem, to - from,
                                         &dots_[slot + 3 * t]);
      }
    });
    SMDIST_RETURN_IF_ERROR(SumDots());
    WithElements(dtype, [&](auto elements) {
      using E = decltype(elements);
      for (size_t t = 0; t < tensors; ++t) {
        const int64_t from = std::max(starts[t], keep_lo), to = std::min(starts[t + 1], keep_hi);
        if (from >= to) continue;
        const double* d = &dots_[slot + 3 * t];
        const int64_t at = (from - keep_lo) * elem;
        Combine<E>(a + at, b + at, Coefficient(d[0], d[1]), Coefficient(d[0], d[2]), kept + at, to - from);
      }
    });
    lo = keep_lo;
    hi = keep_hi;
  }
  return Gather(dtype, starts.back(), lo, data);
}

Status AdasumAllreduce::Exchange(int peer, const void* send, int64_t give, int64_t keep, DataType dtype) {
  // Never empty: transports may take the address even of zero elements.
  received_.resize(static_cast<size_t>(std::max<int64_t>(keep, 1)) * DataTypeSize(dtype));
  std::vector<int64_t> send_counts(topology_.size, 0), recv_counts(topology_.size, 0);
  send_counts[peer] = give;
  recv_counts[peer] = keep;
  const int64_t bytes = give * static_cast<int64_t>(DataTypeSize(dtype));
  DataTransport* transport = FirstEnabled(data_plane_, HostWork(CollectiveType::kAlltoall, dtype, bytes));
  return transport->Alltoallv(send, send_counts, received_.data(), recv_counts, dtype);
}

Status AdasumAllreduce::SumDots() {
  const int64_t count = static_cast<int64_t>(dots_.size());
  CollectiveWork work = HostWork(CollectiveType::kAllreduce, DataType::kFloat64, count * 8);
  DataTransport* transport = FirstEnabled(data_plane_, work);
  return transport->Allreduce(
      SpanStaging({{dots_.data(), dots_.data(), count}}, DataType::kFloat64, DataType::kFloat64, 1.0, 1.0),
      ReduceOp::kSum);
}

Status AdasumAllreduce::Gather(DataType dtype, int64_t total, int64_t lo, void* data) {
  const int size = topology_.size;
  if (size == 1) return Status::OK();
  const size_t elem = DataTypeSize(dtype);
  // Each rank's final segment, by replaying its halving: bit k of the rank picked
  // the half at level k, so the segments lie in bit-reversed rank order.
  std::vector<int64_t> starts(size), counts(size);
  for (int r = 0; r < size; ++r) {
    int64_t l = 0, h = total;
    for (int distance = 1; distance < size; distance *= 2) {
      const int64_t m = l + (h - l) / 2;
      if ((r & distance) == 0) h = m;
      else l = m;
    }
    starts[r] = l;
    counts[r] = h - l;
  }
  gathered_.resize(static_cast<size_t>(std::max<int64_t>(total, 1)) * elem);
  auto* bytes = static_cast<uint8_t*>(data);
  const int64_t wire_bytes = total * static_cast<int64_t>(elem);
  DataTransport* transport = FirstEnabled(data_plane_, HostWork(CollectiveType::kAllgather, dtype, wire_bytes));
  SMDIST_RETURN_IF_ERROR(transport->Allgatherv(bytes + lo * elem, gathered_.data(), counts, dtype));
  int64_t offset = 0;
  for (int r = 0; r < size; ++r) {
    if (r != topology_.rank) std::memcpy(bytes + starts[r] * elem, gathered_.data() + offset * elem, counts[r] * elem);
    offset += counts[r];
  }
  return Status::OK();
}

}  // namespace smdist
