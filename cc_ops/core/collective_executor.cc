#include "collective_executor.h"

#include "coordinator.h"
#include "copy_bytes.h"
#include "reduction.h"
#include "span_staging.h"
#include "wire_compression.h"

namespace smdist {
namespace {

ReduceOp WireOp(ReduceOp op) { return op == ReduceOp::kAverage ? ReduceOp::kSum : op; }

int64_t RowElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

}  // namespace

void CollectiveExecutor::Trace(const char* phase, Timeline::Clock::time_point begin,
                               const char* extra_args) {
  if (timeline_->active()) timeline_->Record(tracing_, phase, begin, Timeline::Clock::now(), extra_args);
}

Status CollectiveExecutor::Execute(const Response& response, std::vector<TensorEntry>* entries) {
  Status transport_status;
  Status result;
  alloc_status_ = Status::OK();
  contributors_ = transport_->topology().size - static_cast<int>(response.joined.size());
  const auto start = Timeline::Clock::now();
  if (timeline_->active()) {
    tracing_ = response.names;
    for (const TensorEntry& e : *entries) {
      // Whether TensorFlow let the op reuse its input as its output (it
      // forwards a buffer nothing else holds): in place, no second buffer.
      const char* in_place = e.output == nullptr    ? nullptr
                             : e.output == e.input ? "\"in_place\":true"
                                                    : "\"in_place\":false";
      timeline_->Record({e.name}, "NEGOTIATE", e.enqueued_at, start, in_place);
    }
  }
  if (response.response_type == ResponseType::kError) {
    result = response.invalid_input ? Status::InvalidArgument(response.error)
                                    : Status::PreconditionFailed(response.error);
  } else {
    switch (response.type) {
      case CollectiveType::kAllreduce:
        transport_status = Allreduce(entries);
        break;
      case CollectiveType::kAllgather:
        transport_status = Allgather(&(*entries)[0], response.sizes);
        break;
      case CollectiveType::kBroadcast:
        transport_status = Broadcast(&(*entries)[0]);
        break;
      case CollectiveType::kAlltoall:
        transport_status = Alltoall(&(*entries)[0], response.sizes);
        break;
      case CollectiveType::kReducescatter:
        transport_status = Reducescatter(&(*entries)[0]);
        break;
      case CollectiveType::kBarrier:
        // Negotiation completing means every rank has arrived.
        break;
      case CollectiveType::kJoin:
        *static_cast<int32_t*>((*entries)[0].output) = response.last_joined;
        break;
    }
    result = transport_status.ok() ? alloc_status_ : transport_status;
  }
  if (response.response_type == ResponseType::kError) {
    Trace("ERROR", start);
  } else if (response.type != CollectiveType::kAllreduce) {
    Trace(CollectiveTypeName(response.type), start);
  }
  for (TensorEntry& e : *entries) {
    if (e.done) e.done(result);
  }
  // Allocation failures leave the ranks in step; a transport failure does not.
  return transport_status;
}

void CollectiveExecutor::FinishReduction(DataType dtype, ReduceOp op, double postscale,
                                         void* data, int64_t count) const {
  if (op == ReduceOp::kAverage) {
    if (IsFloatingPoint(dtype)) {
      postscale /= contributors_;  // one pass instead of two
    } else {
      DivideInPlace(dtype, data, count, contributors_);
    }
  }
  ScaleInPlace(dtype, data, count, postscale);
}

Status CollectiveExecutor::Allreduce(std::vector<TensorEntry>* entries) {
  const TensorEntry& first = (*entries)[0];
  const DataType dtype = first.dtype;
  const size_t elem = DataTypeSize(dtype);
  const DataType wire = WireDataType(dtype, first.compression);
  int64_t total = 0;
  for (const TensorEntry& e : *entries) total += NumElements(e.shape);
  const int64_t wire_bytes = total * static_cast<int64_t>(DataTypeSize(wire));
  // Large uncompressed allreduces read peers' tensors in place (cross-memory
  // attach); the rest, compressed ones included, are staged through shared
  // memory, which converts and scales on the way in and out.
  const bool in_place = wire == dtype && transport_->CanAllreduceSpans(wire_bytes, entries->size());
  if (!in_place && transport_->CanAllreduceStaged(wire_bytes)) return AllreduceStaged(*entries, wire);
  if (wire != dtype) return AllreduceCompressed(entries, wire);
  if (entries->size() == 1) return AllreduceSingle(&(*entries)[0]);
  if (first.prescale == 1.0 && in_place) {
    std::vector<const TensorEntry*> all;
    for (const TensorEntry& e : *entries) all.push_back(&e);
    return AllreduceInPlace(all);
  }
  // Large tensors gain nothing from the fusion buffer but two copies (their
  // transfer dwarfs one call's latency): reduce them where they lie. Every
  // rank sees the same sizes, so every rank makes the same calls.
  std::vector<TensorEntry*> packed;
  total = 0;
  for (TensorEntry& e : *entries) {
    const int64_t count = NumElements(e.shape);
    if (count * static_cast<int64_t>(elem) >= kUnfusedTensorBytes) {
      SMDIST_RETURN_IF_ERROR(AllreduceSingle(&e));
    } else {
      packed.push_back(&e);
      total += count;
    }
  }
  if (packed.empty()) return Status::OK();
  // Fused: pack, reduce once, unpack.
  if (fusion_buffer_.size() < static_cast<size_t>(total) * elem) {
    fusion_buffer_.resize(static_cast<size_t>(total) * elem);
  }
  uint8_t* buf = fusion_buffer_.data();
  auto t0 = Timeline::Clock::now();
  int64_t offset = 0;
  for (const TensorEntry* e : packed) {
    const int64_t bytes = NumElements(e->shape) * elem;
    if (bytes > 0) CopyBytes(buf + offset, e->input, bytes);
    offset += bytes;
  }
  ScaleInPlace(dtype, buf, total, first.prescale);
  Trace("COPY_IN_FUSION_BUFFER", t0);
  t0 = Timeline::Clock::now();
  if (total > 0) {
    SMDIST_RETURN_IF_ERROR(transport_->Allreduce(buf, buf, total, dtype, WireOp(first.reduce_op)));
  }
  FinishReduction(dtype, first.reduce_op, first.postscale, buf, total);
  Trace("ALLREDUCE", t0);
  t0 = Timeline::Clock::now();
  offset = 0;
  for (TensorEntry* e : packed) {
    const int64_t bytes = NumElements(e->shape) * elem;
    if (bytes > 0) CopyBytes(e->output, buf + offset, bytes);
    offset += bytes;
  }
  Trace("COPY_OUT_FUSION_BUFFER", t0);
  return Status::OK();
}

bool CollectiveExecutor::FoldedPostscale(const TensorEntry& first, double* postscale) const {
  if (!IsFloatingPoint(first.dtype) && first.reduce_op == ReduceOp::kAverage) {
    *postscale = 1.0;
    return false;
  }
  *postscale = first.postscale;
  if (first.reduce_op == ReduceOp::kAverage) *postscale /= contributors_;
  return true;
}

Status CollectiveExecutor::AllreduceStaged(const std::vector<TensorEntry>& entries, DataType wire) {
  const TensorEntry& first = entries[0];
  double postscale = 1.0;
  const bool folded = FoldedPostscale(first, &postscale);
  std::vector<TensorSpan> spans;
  spans.reserve(entries.size());
  for (const TensorEntry& e : entries) {
    const int64_t count = NumElements(e.shape);
    if (count > 0) spans.push_back({e.input, e.output, count});
  }
  const auto t0 = Timeline::Clock::now();
  SMDIST_RETURN_IF_ERROR(transport_->AllreduceStaged(
      SpanStaging(spans, first.dtype, wire, first.prescale, postscale), WireOp(first.reduce_op)));
  if (!folded) {
    for (const TensorSpan& s : spans) FinishReduction(first.dtype, first.reduce_op, first.postscale, s.output, s.count);
  }
  // Which single-host path ran shows in the timeline (the spans are read in place, or staged).
  Trace("ALLREDUCE", t0, "\"path\":\"shared_memory\"");
  return Status::OK();
}

Status CollectiveExecutor::AllreduceCompressed(std::vector<TensorEntry>* entries, DataType wire) {
  const TensorEntry& first = (*entries)[0];
  const size_t wire_elem = DataTypeSize(wire);
  int64_t total = 0;
  for (const TensorEntry& e : *entries) total += NumElements(e.shape);
  if (total == 0) return Status::OK();
  if (fusion_buffer_.size() < static_cast<size_t>(total) * wire_elem) {
    fusion_buffer_.resize(static_cast<size_t>(total) * wire_elem);
  }
  uint8_t* buf = fusion_buffer_.data();
  auto t0 = Timeline::Clock::now();
  int64_t offset = 0;
  for (const TensorEntry& e : *entries) {
    const int64_t count = NumElements(e.shape);
    NarrowToWire(e.dtype, e.input, wire, buf + offset * wire_elem, count, e.prescale);
    offset += count;
  }
  Trace("COPY_IN_FUSION_BUFFER", t0);
  t0 = Timeline::Clock::now();
  const ReduceOp op = WireOp(first.reduce_op);
  if (transport_->CanAllreduceSpans(total * static_cast<int64_t>(wire_elem), 1)) {
    SMDIST_RETURN_IF_ERROR(transport_->AllreduceSpans({TensorSpan{buf, buf, total}}, wire, op, 1.0));
  } else {
    SMDIST_RETURN_IF_ERROR(transport_->Allreduce(buf, buf, total, wire, op));
  }
  Trace("ALLREDUCE", t0);
  // Average and postscale are applied while widening, in float32.
  double scale = first.postscale;
  if (first.reduce_op == ReduceOp::kAverage) scale /= contributors_;
  t0 = Timeline::Clock::now();
  offset = 0;
  for (TensorEntry& e : *entries) {
    const int64_t count = NumElements(e.shape);
    WidenFromWire(wire, buf + offset * wire_elem, e.dtype, e.output, count, scale);
    offset += count;
  }
  Trace("COPY_OUT_FUSION_BUFFER", t0);
  return Status::OK();
}

Status CollectiveExecutor::AllreduceSingle(TensorEntry* e) {
  const DataType dtype = e->dtype;
  const size_t elem = DataTypeSize(dtype);
  const int64_t count = NumElements(e->shape);
  if (count == 0) return Status::OK();
  const void* send = e->input;
  if (e->prescale != 1.0) {  // scale a copy: the input belongs to the caller
    ScaleInto(dtype, e->input, e->output, count, e->prescale);
    send = e->output;
  }
  if (e->prescale == 1.0 && transport_->CanAllreduceSpans(count * static_cast<int64_t>(elem), 1)) {
    return AllreduceInPlace({e});
  }
  const auto t0 = Timeline::Clock::now();
  SMDIST_RETURN_IF_ERROR(transport_->Allreduce(send, e->output, count, dtype, WireOp(e->reduce_op)));
  FinishReduction(dtype, e->reduce_op, e->postscale, e->output, count);
  Trace("ALLREDUCE", t0);
  return Status::OK();
}

Status CollectiveExecutor::AllreduceInPlace(const std::vector<const TensorEntry*>& entries) {
  // The transport reads every tensor where it lies: no fusion-buffer copies,
  // and the final scaling happens while each shard is still in cache.
  const TensorEntry& first = *entries[0];
  double postscale = 1.0;
  const bool fold_scaling = FoldedPostscale(first, &postscale);
  std::vector<TensorSpan> spans;
  spans.reserve(entries.size());
  for (const TensorEntry* e : entries) {
    const int64_t count = NumElements(e->shape);
    if (count > 0) spans.push_back({e->input, e->output, count});
  }
  const auto t0 = Timeline::Clock::now();
  SMDIST_RETURN_IF_ERROR(transport_->AllreduceSpans(spans, first.dtype, WireOp(first.reduce_op), postscale));
  if (!fold_scaling) {  // integer average: divide like TF does, tensor by tensor
    for (const TensorSpan& s : spans) {
      FinishReduction(first.dtype, first.reduce_op, first.postscale, s.output, s.count);
    }
  }
  Trace("ALLREDUCE", t0, "\"path\":\"cross_memory\"");
  return Status::OK();
}

Status CollectiveExecutor::Allgather(TensorEntry* e, const std::vector<int64_t>& first_dims) {
  const int64_t row = RowElements(e->shape);
  std::vector<int64_t> counts;
  int64_t rows = 0;
  for (int64_t d : first_dims) {
    counts.push_back(d * row);
    rows += d;
  }
  std::vector<int64_t> out_shape = e->shape;
  if (out_shape.empty()) out_shape.push_back(rows);
  else out_shape[0] = rows;
  void* out = nullptr;
  alloc_status_ = e->allocate_output(out_shape, &out);
  // An allocation failure on one rank must not leave the others inside MPI:
  // take part with a scratch buffer, then report the failure.
  if (!alloc_status_.ok()) {
    scratch_.resize(NumElements(out_shape) * DataTypeSize(e->dtype));
    out = scratch_.data();
  }
  if (rows * row > 0) {
    return transport_->Allgatherv(e->input, out, counts, e->dtype);
  }
  return Status::OK();
}

Status CollectiveExecutor::Broadcast(TensorEntry* e) {
  const int64_t count = NumElements(e->shape);
  const size_t elem = DataTypeSize(e->dtype);
  if (count == 0) return Status::OK();
  if (transport_->topology().rank == e->root_rank && e->output != e->input) {
    CopyBytes(e->output, e->input, count * elem);
  }
  return transport_->Broadcast(e->output, count, e->dtype, e->root_rank);
}

Status CollectiveExecutor::Alltoall(TensorEntry* e, const std::vector<int64_t>& matrix) {
  const int size = transport_->topology().size;
  const int me = transport_->topology().rank;
  const int64_t row = RowElements(e->shape);
  std::vector<int64_t> send_counts(size), recv_counts(size), received(size);
  int64_t rows = 0;
  for (int r = 0; r < size; ++r) {
    send_counts[r] = matrix[static_cast<size_t>(me) * size + r] * row;
    received[r] = matrix[static_cast<size_t>(r) * size + me];
    recv_counts[r] = received[r] * row;
    rows += received[r];
  }
  std::vector<int64_t> out_shape = e->shape;
  out_shape[0] = rows;
  void* out = nullptr;
  alloc_status_ = e->allocate_output(out_shape, &out);
  if (!alloc_status_.ok()) {
    scratch_.resize(NumElements(out_shape) * DataTypeSize(e->dtype));
    out = scratch_.data();
  }
  if (e->set_received_splits) e->set_received_splits(received);
  return transport_->Alltoallv(e->input, send_counts, out, recv_counts, e->dtype);
}

Status CollectiveExecutor::Reducescatter(TensorEntry* e) {
  const int size = transport_->topology().size;
  const int64_t row = RowElements(e->shape);
  const size_t elem = DataTypeSize(e->dtype);
  std::vector<int64_t> counts(size);
  int64_t total = 0;
  for (int r = 0; r < size; ++r) {
    counts[r] = ReducescatterRows(e->shape[0], size, r) * row;
    total += counts[r];
  }
  if (total == 0) return Status::OK();
  const void* send = e->input;
  if (e->prescale != 1.0) {
    scratch_.resize(total * elem);
    ScaleInto(e->dtype, e->input, scratch_.data(), total, e->prescale);
    send = scratch_.data();
  }
  const int me = transport_->topology().rank;
  SMDIST_RETURN_IF_ERROR(
      transport_->ReduceScatter(send, e->output, counts, e->dtype, WireOp(e->reduce_op)));
  FinishReduction(e->dtype, e->reduce_op, e->postscale, e->output, counts[me]);
  return Status::OK();
}

}  // namespace smdist
