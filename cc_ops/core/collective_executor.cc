#include "collective_executor.h"

#include <initializer_list>
#include <string>

#include "common/cuda_runtime.h"
#include "common/reducescatter_rows.h"
#include "common/reduction.h"
#include "common/span_staging.h"
#include "transports/transport_choice.h"

namespace smdist {
namespace {

ReduceOp WireOp(ReduceOp op) { return op == ReduceOp::kAverage ? ReduceOp::kSum : op; }

int64_t RowElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

// The first failure among `statuses`, or OK.
Status FirstFailure(std::initializer_list<Status> statuses) {
  for (const Status& s : statuses) {
    if (!s.ok()) return s;
  }
  return Status::OK();
}

}  // namespace

void CollectiveExecutor::Trace(const char* phase, Timeline::Clock::time_point begin,
                               const char* extra_args) {
  if (tracing()) {
    timeline_->Record(tracing_, phase, begin, Timeline::Clock::now(), extra_args, process_set_id_);
  }
}

Status CollectiveExecutor::Execute(const Response& response, std::vector<TensorEntry>* entries) {
  const auto start = Timeline::Clock::now();
  Begin(response, *entries, start);
  // Data on a device is read only once the work that produces it has run. A
  // tensor that never becomes ready still takes part (the peers are already
  // in the collective) and then fails.
  Status ready;
  for (const TensorEntry& e : *entries) {
    if (e.ready_event && ready.ok()) ready = e.ready_event->Wait();
  }
  Status outcome;           // what every entry reports
  Status transport_failure;  // leaves the ranks out of step
  if (response.response_type == ResponseType::kError) {
    outcome = response.invalid_input ? Status::InvalidArgument(response.error)
                                     : Status::PreconditionFailed(response.error);
    Trace("ERROR", start);
  } else {
    transport_failure = RunCollective(response, entries, ready, &outcome);
    if (response.type != CollectiveType::kAllreduce) Trace(CollectiveTypeName(response.type), start);
  }
  for (TensorEntry& e : *entries) {
    if (e.done) e.done(outcome);
  }
  // Allocation failures leave the ranks in step; a transport failure does not.
  return transport_failure;
}

void CollectiveExecutor::Begin(const Response& response, const std::vector<TensorEntry>& entries,
                               Timeline::Clock::time_point start) {
  entry_status_ = Status::OK();
  on_device_ = false;
  contributors_ = topology_.size - static_cast<int>(response.joined.size());
  if (!tracing()) return;
  tracing_ = response.names;
  for (const TensorEntry& e : entries) {
    // Whether TensorFlow let the op reuse its input as its output (it
    // forwards a buffer nothing else holds): in place, no second buffer.
    const char* in_place = e.output == nullptr    ? nullptr
                           : e.output == e.input ? "\"in_place\":true"
                                                  : "\"in_place\":false";
    timeline_->Record({e.name}, "NEGOTIATE", e.enqueued_at, start, in_place, process_set_id_);
  }
}

Status CollectiveExecutor::RunCollective(const Response& response, std::vector<TensorEntry>* entries,
                                         const Status& ready, Status* outcome) {
  // GPU tensors go to a device transport when one takes the whole response;
  // otherwise through host memory, for the host transports.
  Status staged;
  bool staged_in = false;  // this response's GPU tensors went to host memory
  const bool moves_data = response.type != CollectiveType::kBarrier && response.type != CollectiveType::kJoin;
  if (moves_data && !(*entries)[0].device.is_cpu()) {
    DataTransport* device_transport = response.joined.empty() ? FirstEnabled(data_plane_, WorkOf(*entries)) : nullptr;
    if (device_transport != nullptr) {
      on_device_ = true;
      device_ = (*entries)[0].device.id;
      const Status used = device_transport->UseDevice((*entries)[0].device, (*entries)[0].stream);
      if (!used.ok()) {
        *outcome = used;
        // PreconditionFailed is the same on every rank: fail the collective, keep going.
        return used.code() == StatusCode::kPreconditionFailed ? Status::OK() : used;
      }
    } else {
      const auto t0 = Timeline::Clock::now();
      staged = staging_.StageIn(entries, topology_.size, topology_.rank);
      staged_in = true;
      Trace("MEMCPY_IN_HOST_BUFFER", t0);
    }
  }
  const Status transport_failure = Dispatch(response, entries);
  if (staged_in && staged.ok() && transport_failure.ok()) {
    const auto t0 = Timeline::Clock::now();
    staged = staging_.StageOut();
    Trace("MEMCPY_OUT_HOST_BUFFER", t0);
  }
  *outcome = FirstFailure({transport_failure, ready, staged, entry_status_});
  return transport_failure;
}

Status CollectiveExecutor::Dispatch(const Response& response, std::vector<TensorEntry>* entries) {
  TensorEntry* first = &(*entries)[0];
  switch (response.type) {
    case CollectiveType::kAllreduce:
      return Allreduce(entries);
    case CollectiveType::kAllgather:
      return Allgather(first, response.sizes);
    case CollectiveType::kBroadcast:
      return Broadcast(first);
    case CollectiveType::kAlltoall:
      return Alltoall(first, response.sizes);
    case CollectiveType::kReducescatter:
      return Reducescatter(first);
    case CollectiveType::kBarrier:
      return Status::OK();  // negotiation completing means every rank has arrived
    case CollectiveType::kJoin:
      return Join(first, response.last_joined);
  }
  return Status::OK();
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

bool CollectiveExecutor::FoldedPostscale(const TensorEntry& first, double* postscale) const {
  if (!IsFloatingPoint(first.dtype) && first.reduce_op == ReduceOp::kAverage) {
    *postscale = 1.0;
    return false;
  }
  *postscale = first.postscale;
  if (first.reduce_op == ReduceOp::kAverage) *postscale /= contributors_;
  return true;
}

Status CollectiveExecutor::Scratch(int64_t bytes, void** out) {
  if (!on_device_) {
    scratch_.resize(static_cast<size_t>(bytes));
    *out = scratch_.data();
    return Status::OK();
  }
  Status why;
  const CudaRuntime* cuda = CudaRuntime::Get(&why);
  if (cuda == nullptr) return why;
  SMDIST_RETURN_IF_ERROR(device_scratch_.Reserve(cuda, device_, static_cast<size_t>(bytes)));
  *out = device_scratch_.data();
  return Status::OK();
}

uint8_t* CollectiveExecutor::FusionBuffer(int64_t bytes) {
  if (fusion_buffer_.size() < static_cast<size_t>(bytes)) fusion_buffer_.resize(static_cast<size_t>(bytes));
  return fusion_buffer_.data();
}

Status CollectiveExecutor::Allreduce(std::vector<TensorEntry>* entries) {
  const TensorEntry& first = (*entries)[0];
  if (first.reduce_op == ReduceOp::kAdasum) return Adasum(entries);
  for (const smdist::AllreduceStep& step : planner_->PlanAllreduce(*entries, data_plane_)) {
    std::vector<TensorSpan> spans;
    for (size_t i : step.members) {
      const TensorEntry& e = (*entries)[i];
      const int64_t count = NumElements(e.shape);
      if (count > 0) spans.push_back({e.input, e.output, count});
    }
    if (spans.empty()) continue;
    if (step.transport == nullptr) {
      entry_status_ = Status::PreconditionFailed("no transport in this build reduces tensors on " +
                                                 step.device.ToString());
      continue;
    }
    SMDIST_RETURN_IF_ERROR(AllreduceStep(step, first, std::move(spans)));
  }
  return Status::OK();
}

Status CollectiveExecutor::AllreduceStep(const smdist::AllreduceStep& step, const TensorEntry& first,
                                         std::vector<TensorSpan> spans) {
  const DataType dtype = first.dtype;
  const DataType wire = WireDataType(dtype, first.compression);
  const ReduceOp op = WireOp(first.reduce_op);
  double postscale = 1.0;
  const bool folded = FoldedPostscale(first, &postscale);
  double prescale = first.prescale;
  if (step.scale_first) {  // scale a copy: the input belongs to the caller
    ScaleInto(dtype, spans[0].input, spans[0].output, spans[0].count, prescale);
    spans[0].input = spans[0].output;
    prescale = 1.0;
  }
  // Which transport ran shows in the timeline.
  const std::string path = tracing() ? "\"path\":\"" + step.transport->name() + "\"" : "";
  const SpanStaging tensors(spans, dtype, wire, prescale, postscale);
  auto t0 = Timeline::Clock::now();
  if (!step.packed) {
    SMDIST_RETURN_IF_ERROR(step.transport->Allreduce(tensors, op));
    Trace("ALLREDUCE", t0, path.c_str());
  } else {
    // Packed in the wire type, converted and scaled on the way in and out.
    uint8_t* buffer = FusionBuffer(tensors.wire_bytes());
    tensors.StageIn(0, tensors.count(), buffer);
    Trace("COPY_IN_FUSION_BUFFER", t0);
    t0 = Timeline::Clock::now();
    SMDIST_RETURN_IF_ERROR(
        step.transport->Allreduce(SpanStaging({{buffer, buffer, tensors.count()}}, wire, wire, 1.0, 1.0), op));
    Trace("ALLREDUCE", t0, path.c_str());
    t0 = Timeline::Clock::now();
    tensors.StageOut(0, tensors.count(), buffer);
    Trace("COPY_OUT_FUSION_BUFFER", t0);
  }
  if (!folded) {  // integer average: divide like TF does, tensor by tensor
    for (const TensorSpan& s : spans) FinishReduction(dtype, first.reduce_op, first.postscale, s.output, s.count);
  }
  return Status::OK();
}

Status CollectiveExecutor::Adasum(std::vector<TensorEntry>* entries) {
  const TensorEntry& first = (*entries)[0];
  const std::string refusal = adasum_.Refusal(first.dtype, first.compression);
  if (!refusal.empty()) {  // every rank refuses alike
    entry_status_ = Status::InvalidArgument(refusal);
    return Status::OK();
  }
  std::vector<TensorSpan> spans;
  std::vector<int64_t> counts;
  for (const TensorEntry& e : *entries) {
    const int64_t count = NumElements(e.shape);
    if (count == 0) continue;
    spans.push_back({e.input, e.output, count});
    counts.push_back(count);
  }
  if (spans.empty()) return Status::OK();
  // Inputs stay the caller's, so the tensors are combined in the fusion buffer.
  const SpanStaging tensors(std::move(spans), first.dtype, first.dtype, first.prescale, first.postscale);
  uint8_t* buffer = FusionBuffer(tensors.wire_bytes());
  auto t0 = Timeline::Clock::now();
  tensors.StageIn(0, tensors.count(), buffer);
  Trace("COPY_IN_FUSION_BUFFER", t0);
  t0 = Timeline::Clock::now();
  SMDIST_RETURN_IF_ERROR(adasum_.Reduce(first.dtype, counts, buffer));
  Trace("ADASUM", t0);
  t0 = Timeline::Clock::now();
  tensors.StageOut(0, tensors.count(), buffer);
  Trace("COPY_OUT_FUSION_BUFFER", t0);
  return Status::OK();
}

DataTransport* CollectiveExecutor::TransportFor(const TensorEntry& entry) {
  DataTransport* transport = FirstEnabled(data_plane_, WorkOf(entry));
  if (transport == nullptr) {
    entry_status_ = Status::PreconditionFailed(std::string("no transport in this build runs ") +
                                               CollectiveTypeName(entry.type) + " on " + entry.device.ToString());
  }
  return transport;
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
  entry_status_ = e->allocate_output(out_shape, &out);
  // An allocation failure on one rank must not leave the others inside the
  // collective: take part with a scratch buffer, then report the failure.
  if (!entry_status_.ok()) SMDIST_RETURN_IF_ERROR(Scratch(NumElements(out_shape) * DataTypeSize(e->dtype), &out));
  if (rows * row == 0) return Status::OK();
  DataTransport* transport = TransportFor(*e);
  if (transport == nullptr) return Status::OK();
  return transport->Allgatherv(e->input, out, counts, e->dtype);
}

Status CollectiveExecutor::Broadcast(TensorEntry* e) {
  const int64_t count = NumElements(e->shape);
  if (count == 0) return Status::OK();
  DataTransport* transport = TransportFor(*e);
  if (transport == nullptr) return Status::OK();
  return transport->Broadcast(e->input, e->output, count, e->dtype, e->root_rank);
}

Status CollectiveExecutor::Alltoall(TensorEntry* e, const std::vector<int64_t>& matrix) {
  const int size = topology_.size;
  const int me = topology_.rank;
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
  entry_status_ = e->allocate_output(out_shape, &out);
  if (!entry_status_.ok()) SMDIST_RETURN_IF_ERROR(Scratch(NumElements(out_shape) * DataTypeSize(e->dtype), &out));
  if (e->set_received_splits) e->set_received_splits(received);
  DataTransport* transport = TransportFor(*e);
  if (transport == nullptr) return Status::OK();
  return transport->Alltoallv(e->input, send_counts, out, recv_counts, e->dtype);
}

Status CollectiveExecutor::Join(TensorEntry* e, int32_t last_joined) {
  *static_cast<int32_t*>(e->output) = last_joined;  // what every rank's join() returns
  return Status::OK();
}

Status CollectiveExecutor::Reducescatter(TensorEntry* e) {
  const int size = topology_.size;
  const int64_t row = RowElements(e->shape);
  const size_t elem = DataTypeSize(e->dtype);
  if (e->reduce_op == ReduceOp::kAdasum) {  // every rank refuses alike
    entry_status_ = Status::InvalidArgument("reducescatter does not take Adasum; it is an allreduce op");
    return Status::OK();
  }
  std::vector<int64_t> counts(size);
  int64_t total = 0;
  for (int r = 0; r < size; ++r) {
    counts[r] = ReducescatterRows(e->shape[0], size, r) * row;
    total += counts[r];
  }
  if (total == 0) return Status::OK();
  DataTransport* transport = TransportFor(*e);
  if (transport == nullptr) return Status::OK();
  if (on_device_) {  // the device transport finishes Average itself; no scaling (Enabled)
    return transport->ReduceScatter(e->input, e->output, counts, e->dtype, e->reduce_op);
  }
  const void* send = e->input;
  if (e->prescale != 1.0) {
    scratch_.resize(total * elem);
    ScaleInto(e->dtype, e->input, scratch_.data(), total, e->prescale);
    send = scratch_.data();
  }
  const int me = topology_.rank;
  SMDIST_RETURN_IF_ERROR(
      transport->ReduceScatter(send, e->output, counts, e->dtype, WireOp(e->reduce_op)));
  FinishReduction(e->dtype, e->reduce_op, e->postscale, e->output, counts[me]);
  return Status::OK();
}

}  // namespace smdist
