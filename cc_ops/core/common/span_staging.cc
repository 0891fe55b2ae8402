#include "common/span_staging.h"

#include <algorithm>
#include <utility>

#include "common/reduction.h"
#include "common/wire_compression.h"

namespace smdist {

SpanStaging::SpanStaging(std::vector<TensorSpan> spans, DataType dtype, DataType wire, double prescale,
                         double postscale)
    : spans_(std::move(spans)),
      starts_(spans_.size() + 1, 0),
      dtype_(dtype),
      wire_(wire),
      elem_(static_cast<int64_t>(DataTypeSize(dtype))),
      wire_elem_(static_cast<int64_t>(DataTypeSize(wire))),
      prescale_(prescale),
      postscale_(postscale) {
  for (size_t s = 0; s < spans_.size(); ++s) starts_[s + 1] = starts_[s] + spans_[s].count;
}

template <typename F>
void SpanStaging::ForEachPiece(int64_t offset, int64_t n, F&& f) const {
  const int64_t begin = offset;
  const int64_t end = std::min(offset + n, count());
  // The last span starting at or before `offset`: empty spans before it are skipped.
  size_t s = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), offset) - starts_.begin()) - 1;
  for (; s < spans_.size() && offset < end; ++s) {
    const int64_t lo = offset - starts_[s];
    const int64_t hi = std::min(end, starts_[s + 1]) - starts_[s];
    if (hi <= lo) continue;
    f(spans_[s], lo, hi - lo, offset - begin);
    offset = starts_[s] + hi;
  }
}

void SpanStaging::StageIn(int64_t offset, int64_t n, void* dst) const {
  auto* out = static_cast<uint8_t*>(dst);
  ForEachPiece(offset, n, [&](const TensorSpan& span, int64_t at, int64_t k, int64_t done) {
    const auto* in = static_cast<const uint8_t*>(span.input) + at * elem_;
    uint8_t* to = out + done * wire_elem_;
    if (wire_ != dtype_) {
      NarrowToWire(dtype_, in, wire_, to, k, prescale_);
      return;
    }
    ScaleInto(dtype_, in, to, k, prescale_);  // scaled as it is copied, not in a second pass
  });
}

void SpanStaging::StageOut(int64_t offset, int64_t n, const void* src) const {
  const auto* in = static_cast<const uint8_t*>(src);
  ForEachPiece(offset, n, [&](const TensorSpan& span, int64_t at, int64_t k, int64_t done) {
    uint8_t* to = static_cast<uint8_t*>(span.output) + at * elem_;
    const uint8_t* from = in + done * wire_elem_;
    if (wire_ != dtype_) {
      WidenFromWire(wire_, from, dtype_, to, k, postscale_);
      return;
    }
    ScaleInto(dtype_, from, to, k, postscale_);
  });
}

}  // namespace smdist
