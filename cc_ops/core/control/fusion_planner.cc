#include "control/fusion_planner.h"

#include <cstring>
#include <unordered_map>

#include "transports/transport_choice.h"

namespace smdist {

std::pair<std::string, int64_t> FusionInfo(const Request& r) {
  const DataType wire = WireDataType(r.dtype, r.compression);
  // Exact bytes of every field: scale factors that differ only in their last
  // bit must not share a fusion buffer (and this runs every cycle, so no printf).
  std::string key(3 + sizeof(int32_t) + 2 * sizeof(double), '\0');
  key[0] = static_cast<char>(r.dtype);
  key[1] = static_cast<char>(wire);
  key[2] = static_cast<char>(r.reduce_op);
  std::memcpy(&key[3], &r.device.id, sizeof(int32_t));
  std::memcpy(&key[3 + sizeof(int32_t)], &r.prescale, sizeof(double));
  std::memcpy(&key[3 + sizeof(int32_t) + sizeof(double)], &r.postscale, sizeof(double));
  // The threshold bounds the fusion buffer, which holds the wire type.
  return {key, NumElements(r.shape) * static_cast<int64_t>(DataTypeSize(wire))};
}

void FusionPlanner::Fuse(std::vector<Response>* responses,
                         const std::function<const Request&(const std::string&)>& params) const {
  if (threshold_bytes_ <= 0) return;
  std::vector<Response> fused;
  // Index into `fused` of the open (still growing) response for each key.
  std::unordered_map<std::string, std::pair<size_t, int64_t>> open;
  for (Response& r : *responses) {
    // A response with joined ranks travels alone: its members' parameters
    // differ from the others' in who takes part.
    const bool fusable = r.response_type == ResponseType::kCollective &&
                         r.type == CollectiveType::kAllreduce && r.joined.empty();
    if (!fusable) {
      fused.push_back(std::move(r));
      continue;
    }
    const auto key_and_bytes = FusionInfo(params(r.names[0]));
    auto it = open.find(key_and_bytes.first);
    if (it != open.end() && it->second.second + key_and_bytes.second <= threshold_bytes_) {
      fused[it->second.first].names.push_back(r.names[0]);
      it->second.second += key_and_bytes.second;
      continue;
    }
    open[key_and_bytes.first] = {fused.size(), key_and_bytes.second};
    fused.push_back(std::move(r));
  }
  *responses = std::move(fused);
}

std::vector<AllreduceStep> FusionPlanner::PlanAllreduce(const std::vector<TensorEntry>& entries,
                                                        const std::vector<DataTransport*>& transports) const {
  const TensorEntry& first = entries[0];
  const DataType wire = WireDataType(first.dtype, first.compression);
  const int64_t elem = static_cast<int64_t>(DataTypeSize(first.dtype));
  const int64_t wire_elem = static_cast<int64_t>(DataTypeSize(wire));
  const CollectiveWork work = WorkOf(entries);

  std::vector<AllreduceStep> steps;
  AllreduceStep all;
  all.device = first.device;
  if ((all.transport = FirstEnabled(transports, work)) != nullptr) {
    for (size_t i = 0; i < entries.size(); ++i) all.members.push_back(i);
    steps.push_back(std::move(all));
    return steps;
  }
  // No transport takes them as they lie. A lone tensor, and tensors large
  // enough to travel alone, are reduced where they lie (scaled into their
  // outputs first); the rest share the fusion buffer. Converted (compressed)
  // tensors always go through the buffer, which holds the wire type.
  AllreduceStep packed;
  packed.packed = true;
  packed.device = first.device;
  CollectiveWork buffer = work;
  buffer.dtype = wire;
  buffer.num_tensors = 1;
  buffer.prescaled = false;
  buffer.wire_bytes = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const int64_t bytes = NumElements(entries[i].shape) * elem;
    if (wire == first.dtype && (entries.size() == 1 || bytes >= kUnfusedTensorBytes)) {
      CollectiveWork one = work;
      one.num_tensors = 1;
      one.prescaled = false;
      one.wire_bytes = bytes;
      AllreduceStep alone;
      alone.members = {i};
      alone.device = first.device;
      alone.scale_first = work.prescaled;
      alone.transport = FirstEnabled(transports, one);
      steps.push_back(std::move(alone));
    } else {
      packed.members.push_back(i);
      buffer.wire_bytes += NumElements(entries[i].shape) * wire_elem;
    }
  }
  if (!packed.members.empty()) {
    packed.transport = FirstEnabled(transports, buffer);
    steps.push_back(std::move(packed));
  }
  return steps;
}

}  // namespace smdist
