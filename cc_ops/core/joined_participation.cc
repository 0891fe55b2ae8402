#include "joined_participation.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "common/reduction.h"

namespace smdist {

void* JoinedParticipation::NewBuffer(int64_t bytes) {
  // Never empty: transports may take the address even of zero elements.
  const size_t size = static_cast<size_t>(std::max<int64_t>(bytes, 8));
  buffers_.push_back(std::make_unique<uint8_t[]>(size));
  std::memset(buffers_.back().get(), 0, size);
  return buffers_.back().get();
}

TensorEntry JoinedParticipation::Entry(const Request& params) {
  TensorEntry e;
  e.name = params.name;
  e.type = params.type;
  e.dtype = params.dtype;
  e.shape = params.shape;
  e.root_rank = params.root_rank;
  e.reduce_op = params.reduce_op;
  e.prescale = params.prescale;
  e.postscale = params.postscale;
  e.compression = params.compression;
  e.enqueued_at = std::chrono::steady_clock::now();
  if (e.type == CollectiveType::kAllgather && !e.shape.empty()) e.shape[0] = 0;  // no rows
  const size_t elem = DataTypeSize(e.dtype);
  const int64_t count = NumElements(e.shape);
  void* input = NewBuffer(count * static_cast<int64_t>(elem));
  // Zeros are Sum's and Average's identity; a prescale factor keeps them zero
  // (the coordinator refuses a factor with the other ops while ranks are joined).
  if (e.type == CollectiveType::kAllreduce) FillIdentity(e.dtype, e.reduce_op, input, count);
  e.input = input;
  if (e.type == CollectiveType::kAllreduce || e.type == CollectiveType::kBroadcast) {
    e.output = NewBuffer(count * static_cast<int64_t>(elem));
  }
  e.allocate_output = [this, elem](const std::vector<int64_t>& shape, void** data) {
    *data = NewBuffer(NumElements(shape) * static_cast<int64_t>(elem));
    return Status::OK();
  };
  return e;
}

}  // namespace smdist
