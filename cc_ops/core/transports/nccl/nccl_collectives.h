// The data plane for GPU tensors: NCCL collectives queued on the framework's
// stream. One communicator per GPU this rank uses, made on first use and
// bootstrapped over the group's control plane (rank 0's unique id, broadcast),
// so a process set's transports get a communicator of their own. Many
// tensors of one allreduce are packed into a fusion buffer on the GPU and
// reduced with one call. Nothing here waits on the host: results are ready
// when the stream reaches them.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "common/cuda_runtime.h"
#include "transports/control_plane.h"
#include "transports/data_transport.h"
#include "transports/nccl/nccl_library.h"

namespace smdist {

class NcclCollectives : public DataTransport {
 public:
  // `control`: the group's negotiation channel, which outlives this;
  // `hostname`: this host, to tell ranks that share one GPU.
  NcclCollectives(const NcclLibrary* nccl, const CudaRuntime* cuda, ControlPlane* control, std::string hostname);
  ~NcclCollectives() override;

  std::string name() const override { return "nccl"; }
  bool Enabled(const CollectiveWork& work) const override;
  Status UseDevice(const Device& device, void* stream) override;
  Status Allreduce(const SpanStaging& staging, ReduceOp op) override;
  Status Allgatherv(const void* send, void* recv, const std::vector<int64_t>& counts, DataType dtype) override;
  Status Broadcast(const void* input, void* output, int64_t count, DataType dtype, int root) override;
  Status Alltoallv(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                   const std::vector<int64_t>& recv_counts, DataType dtype) override;
  Status ReduceScatter(const void* send, void* recv, const std::vector<int64_t>& recv_counts, DataType dtype,
                       ReduceOp op) override;
  // ReduceScatter of inputs multiplied by `factor` first (Sum only, unless 1).
  Status ScaledReduceScatter(const void* send, void* recv, const std::vector<int64_t>& recv_counts, DataType dtype,
                             ReduceOp op, double factor);
  // The device buffer for packing many tensors, at least `bytes`, on the current device.
  Status FusionBuffer(size_t bytes, void** out);
  int device() const { return device_; }
  void* stream() const { return stream_; }

 private:
  struct OnDevice {
    NcclComm comm = nullptr;
    DeviceBuffer fusion;
  };
  // The current device's communicator and buffer (UseDevice made them).
  Status Current(OnDevice** out);
  // Collective over the group. PreconditionFailed: every rank was refused
  // alike (two ranks on one GPU, no GPU, no unique id).
  Status CreateCommunicator(NcclComm* out);
  // Runs f(op) with NCCL's op for `op`, scaled by `factor` (a PreMulSum op
  // made and released around the call) unless it is 1.
  template <typename F>
  Status WithOp(ReduceOp op, DataType dtype, double factor, NcclComm comm, F&& f);

  const NcclLibrary* nccl_;
  const CudaRuntime* cuda_;
  ControlPlane* control_;
  std::string hostname_;
  std::map<int, OnDevice> devices_;
  int device_ = -1;
  void* stream_ = nullptr;
};

}  // namespace smdist
