#include "host_staging.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "common/reducescatter_rows.h"

namespace smdist {

HostStaging::~HostStaging() {
  for (Block& b : blocks_) Release(&b);
}

void HostStaging::Release(Block* block) {
  if (block->page_locked) {
    cuda_->FreeHost(block->data);
  } else {
    delete[] block->data;
  }
  *block = Block();
}

uint8_t* HostStaging::NextBuffer(int64_t bytes, bool zero) {
  const size_t size = static_cast<size_t>(std::max<int64_t>(bytes, 8));
  if (used_ == blocks_.size()) blocks_.emplace_back();
  Block& b = blocks_[used_++];
  if (b.bytes < size) {
    Release(&b);
    void* locked = nullptr;
    if (cuda_ != nullptr && cuda_->MallocHost(&locked, size).ok()) {
      b.data = static_cast<uint8_t*>(locked);
      b.page_locked = true;
    } else {  // no runtime, or no page-locked memory left: ordinary memory, slower copies
      b.data = new uint8_t[size];
    }
    b.bytes = size;
  }
  if (zero) std::memset(b.data, 0, size);
  return b.data;
}

Status HostStaging::StageIn(std::vector<TensorEntry>* entries, int group_size, int group_rank) {
  Status why;
  cuda_ = CudaRuntime::Get(&why);
  used_ = 0;
  outputs_.clear();
  Status result = cuda_ == nullptr ? Status::PreconditionFailed(
                                         "GPU tensors without a device transport are staged through host memory, "
                                         "which needs the CUDA runtime: " + why.message())
                                   : Status::OK();
  for (TensorEntry& e : *entries) {
    const int64_t bytes = NumElements(e.shape) * static_cast<int64_t>(DataTypeSize(e.dtype));
    const Device device = e.device;
    void* stream = e.stream;
    const bool copy_in = result.ok() && e.input != nullptr;
    uint8_t* input = NextBuffer(bytes, /*zero=*/!copy_in);
    if (copy_in) {
      result = cuda_->SetDevice(device.id);
      if (result.ok()) result = cuda_->CopyAsync(input, e.input, bytes, stream);
      if (result.ok()) result = cuda_->Synchronize(stream);
      if (!result.ok()) std::memset(input, 0, static_cast<size_t>(bytes));
    }
    uint8_t* output = nullptr;
    if (e.output != nullptr) {
      int64_t out_bytes = bytes;  // allreduce, broadcast: the input's shape
      if (e.type == CollectiveType::kReducescatter && !e.shape.empty()) {
        out_bytes = bytes / std::max<int64_t>(e.shape[0], 1) * ReducescatterRows(e.shape[0], group_size, group_rank);
      }
      // Collectives write every element of their output: no zeros needed.
      output = e.output == e.input ? input : NextBuffer(out_bytes, /*zero=*/false);
      outputs_.push_back({e.output, output, out_bytes, device.id, stream});
    }
    e.input = input;
    e.output = output;
    e.device = Device::Cpu();
    e.ready_event.reset();
    e.stream = nullptr;
    if (e.allocate_output) {
      auto allocate_device = std::move(e.allocate_output);
      e.allocate_output = [this, allocate_device, device, stream, dtype = e.dtype](const std::vector<int64_t>& shape,
                                                                                  void** data) {
        const int64_t out_bytes = NumElements(shape) * static_cast<int64_t>(DataTypeSize(dtype));
        void* on_device = nullptr;
        Status s = allocate_device(shape, &on_device);
        *data = NextBuffer(out_bytes, /*zero=*/false);
        if (s.ok()) outputs_.push_back({on_device, static_cast<uint8_t*>(*data), out_bytes, device.id, stream});
        return s;
      };
    }
  }
  return result;
}

Status HostStaging::StageOut() {
  if (cuda_ == nullptr) return Status::OK();
  Status result;
  std::set<void*> streams;
  for (const Output& o : outputs_) {
    if (!result.ok()) break;
    result = cuda_->SetDevice(o.device_id);
    if (result.ok()) result = cuda_->CopyAsync(o.device, o.host, o.bytes, o.stream);
    streams.insert(o.stream);
  }
  // The buffers serve the next response: the copies out of them must be done.
  for (void* stream : streams) {
    Status waited = cuda_->Synchronize(stream);
    if (result.ok()) result = waited;
  }
  outputs_.clear();  // copied once: a later call must not copy stale data again
  return result;
}

}  // namespace smdist
