// GPU tensors through host memory, for collectives no device transport runs
// (no NCCL, SMDIST_GPU_OPERATIONS=MPI, compression, ranks inside join()):
// inputs are copied device -> host, the host transports run on the copies,
// and results are copied host -> device, all on the tensor's stream. The host
// buffers are page-locked where the CUDA runtime allows, and kept for the next
// response (one executor's staging holds its largest response's worth).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/cuda_runtime.h"
#include "common/tensor_entry.h"

namespace smdist {

class HostStaging {
 public:
  HostStaging() = default;
  ~HostStaging();
  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;

  // Points `entries` (GPU tensors of one response) at host copies of their
  // data; outputs sized later (allgather, alltoall) get host buffers too.
  // `group_size`, `group_rank`: the group's, which size a reducescatter's output.
  // On failure the entries still point at host memory (zeros where a copy
  // failed), so this rank can take part before it reports the error.
  Status StageIn(std::vector<TensorEntry>* entries, int group_size, int group_rank);
  // Copies the host results to the device outputs and waits for the copies
  // (the buffers serve the next response). Call once after each StageIn, once
  // the collective has run; later calls copy nothing.
  Status StageOut();

 private:
  struct Block {
    uint8_t* data = nullptr;
    size_t bytes = 0;
    bool page_locked = false;
  };
  struct Output {
    void* device = nullptr;
    const uint8_t* host = nullptr;
    int64_t bytes = 0;
    int device_id = -1;
    void* stream = nullptr;
  };
  // The response's next host buffer, at least `bytes` (never empty: transports
  // may take the address even of zero elements); zero-filled when `zero`.
  uint8_t* NextBuffer(int64_t bytes, bool zero);
  void Release(Block* block);

  const CudaRuntime* cuda_ = nullptr;
  std::vector<Block> blocks_;
  size_t used_ = 0;  // blocks handed out for the current response
  std::vector<Output> outputs_;
};

}  // namespace smdist
