// GPU tensors through host memory, for collectives no device transport runs
// (no NCCL, SMDIST_GPU_OPERATIONS=MPI, compression, ranks inside join()):
// inputs are copied device -> host, the host transports run on the copies,
// and results are copied host -> device, all on the tensor's stream.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/cuda_runtime.h"
#include "common/tensor_entry.h"
#include "common/zeroed_buffers.h"

namespace smdist {

class HostStaging {
 public:
  // Points `entries` (GPU tensors of one response) at host copies of their
  // data; outputs sized later (allgather, alltoall) get host buffers too.
  // `group_size`, `group_rank`: the group's, which size a reducescatter's output.
  // On failure the entries still point at host memory (zeros where a copy
  // failed), so this rank can take part before it reports the error.
  Status StageIn(std::vector<TensorEntry>* entries, int group_size, int group_rank);
  // Copies the host results to the device outputs. Call once the collective has run.
  Status StageOut();

 private:
  struct Output {
    void* device = nullptr;
    const uint8_t* host = nullptr;
    int64_t bytes = 0;
    int device_id = -1;
    void* stream = nullptr;
  };
  const CudaRuntime* cuda_ = nullptr;
  ZeroedBuffers buffers_;
  // Shared with the entries' allocate_output, which may run after StageIn returns.
  std::shared_ptr<std::vector<Output>> outputs_ = std::make_shared<std::vector<Output>>();
};

}  // namespace smdist
