#include "host_staging.h"

#include <algorithm>

#include "control/coordinator.h"

namespace smdist {

Status HostStaging::StageIn(std::vector<TensorEntry>* entries, int group_size, int group_rank) {
  Status why;
  cuda_ = CudaRuntime::Get(&why);
  Status result = cuda_ == nullptr ? Status::PreconditionFailed(
                                         "GPU tensors without a device transport are staged through host memory, "
                                         "which needs the CUDA runtime: " + why.message())
                                   : Status::OK();
  for (TensorEntry& e : *entries) {
    const int64_t bytes = NumElements(e.shape) * static_cast<int64_t>(DataTypeSize(e.dtype));
    const Device device = e.device;
    void* stream = e.stream;
    uint8_t* input = buffers_.New(bytes);
    if (result.ok() && e.input != nullptr) {
      result = cuda_->SetDevice(device.id);
      if (result.ok()) result = cuda_->CopyAsync(input, e.input, bytes, stream);
      if (result.ok()) result = cuda_->Synchronize(stream);
    }
    uint8_t* output = nullptr;
    if (e.output != nullptr) {
      int64_t out_bytes = bytes;  // allreduce, broadcast: the input's shape
      if (e.type == CollectiveType::kReducescatter && !e.shape.empty()) {
        out_bytes = bytes / std::max<int64_t>(e.shape[0], 1) * ReducescatterRows(e.shape[0], group_size, group_rank);
      }
      output = e.output == e.input ? input : buffers_.New(out_bytes);
      outputs_->push_back({e.output, output, out_bytes, device.id, stream});
    }
    e.input = input;
    e.output = output;
    e.device = Device::Cpu();
    e.ready_event.reset();
    e.stream = nullptr;
    if (e.allocate_output) {
      auto allocate_device = std::move(e.allocate_output);
      auto outputs = outputs_;
      e.allocate_output = [this, allocate_device, outputs, device, stream, dtype = e.dtype](
                              const std::vector<int64_t>& shape, void** data) {
        const int64_t out_bytes = NumElements(shape) * static_cast<int64_t>(DataTypeSize(dtype));
        void* on_device = nullptr;
        Status s = allocate_device(shape, &on_device);
        *data = buffers_.New(out_bytes);
        if (s.ok()) outputs->push_back({on_device, static_cast<uint8_t*>(*data), out_bytes, device.id, stream});
        return s;
      };
    }
  }
  return result;
}

Status HostStaging::StageOut() {
  Status result;
  for (const Output& o : *outputs_) {
    if (!result.ok() || cuda_ == nullptr) break;
    result = cuda_->SetDevice(o.device_id);
    // From pageable memory the copy has read the host buffer when it returns,
    // so the buffer can go; the device sees the data in stream order.
    if (result.ok()) result = cuda_->CopyAsync(o.device, o.host, o.bytes, o.stream);
  }
  return result;
}

}  // namespace smdist
