// The tensors of one allreduce seen as a single run of wire elements, for a
// transport that stages data itself (the shared-memory rounds). Each piece is
// copied in straight from the callers' tensors and out straight into their
// outputs, narrowed or widened (Compression.fp16/bf16) and scaled in that same
// pass: no fusion buffer and no separate scaling pass over memory.
#pragma once

#include <cstdint>
#include <vector>

#include "common/types.h"

namespace smdist {

// One tensor of an allreduce, reduced where it lies (input may equal output).
struct TensorSpan {
  const void* input;
  void* output;
  int64_t count;
};

class SpanStaging {
 public:
  // `dtype` is the tensors' type and `wire` the type reduced (they differ only
  // under compression). Inputs are multiplied by `prescale` on the way in and
  // results by `postscale` on the way out.
  SpanStaging(std::vector<TensorSpan> spans, DataType dtype, DataType wire, double prescale,
              double postscale);

  // Wire elements in all spans together.
  int64_t count() const { return starts_.back(); }
  int64_t wire_bytes() const { return count() * wire_elem_; }
  DataType dtype() const { return dtype_; }
  DataType wire() const { return wire_; }
  double prescale() const { return prescale_; }
  double postscale() const { return postscale_; }
  // For transports that read the tensors where they lie (no conversion or prescaling).
  const std::vector<TensorSpan>& spans() const { return spans_; }

  // Writes elements [offset, offset + n) of the concatenated inputs to `dst`
  // as the wire type.
  void StageIn(int64_t offset, int64_t n, void* dst) const;
  // Writes `n` reduced wire elements from `src` to the concatenated outputs at `offset`.
  void StageOut(int64_t offset, int64_t n, const void* src) const;

 private:
  // Calls f(span, first element in the span, elements, elements of [offset, offset + n)
  // before this piece) for each span's part of [offset, offset + n).
  template <typename F>
  void ForEachPiece(int64_t offset, int64_t n, F&& f) const;

  std::vector<TensorSpan> spans_;
  std::vector<int64_t> starts_;  // element offset of each span; back() is the total
  DataType dtype_;
  DataType wire_;
  int64_t elem_;       // bytes per tensor element
  int64_t wire_elem_;  // bytes per wire element
  double prescale_;
  double postscale_;
};

}  // namespace smdist
