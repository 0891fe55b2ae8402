#include "transports/transport_choice.h"

namespace smdist {

CollectiveWork WorkOf(const TensorEntry& first) {
  CollectiveWork work;
  work.type = first.type;
  work.device = first.device;
  work.dtype = first.dtype;
  work.wire = first.type == CollectiveType::kAllreduce ? WireDataType(first.dtype, first.compression) : first.dtype;
  work.prescaled = first.prescale != 1.0;
  work.postscaled = first.postscale != 1.0;
  work.op = first.reduce_op;
  work.wire_bytes = NumElements(first.shape) * static_cast<int64_t>(DataTypeSize(work.wire));
  return work;
}

CollectiveWork WorkOf(const std::vector<TensorEntry>& entries) {
  CollectiveWork work = WorkOf(entries[0]);
  work.num_tensors = entries.size();
  for (size_t i = 1; i < entries.size(); ++i) {
    work.wire_bytes += NumElements(entries[i].shape) * static_cast<int64_t>(DataTypeSize(work.wire));
  }
  return work;
}

DataTransport* FirstEnabled(const std::vector<DataTransport*>& transports, const CollectiveWork& work) {
  for (DataTransport* t : transports) {
    if (t->Enabled(work)) return t;
  }
  return nullptr;
}

}  // namespace smdist
