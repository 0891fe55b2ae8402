// Allreduce of GPU tensors across hosts the way SageMaker's data-parallel
// library does it: NCCL reduce-scatter among the GPUs of a host, each rank's
// shard reduced across hosts by a host transport on a copy in host memory
// (the ranks of one local index, one per host), then NCCL allgather inside
// the host. Used with SMDIST_GPU_HIERARCHICAL_ALLREDUCE=1 when every host has
// the same number of ranks; otherwise NCCL spans the hosts itself.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/cuda_runtime.h"
#include "transports/control_plane.h"
#include "transports/data_transport.h"
#include "transports/nccl/nccl_collectives.h"

namespace smdist {

class HierarchicalNcclAllreduce : public DataTransport {
 public:
  // `local_control`: negotiation among this host's ranks (bootstraps the local
  // NCCL communicator); `cross`: a host transport among the ranks of this
  // rank's local index, one per host; `group`: the whole group's control plane,
  // on which ranks agree that every host could start NCCL. `group` outlives this.
  HierarchicalNcclAllreduce(const NcclLibrary* nccl, const CudaRuntime* cuda,
                            std::unique_ptr<ControlPlane> local_control, std::unique_ptr<DataTransport> cross,
                            ControlPlane* group, std::string hostname);
  ~HierarchicalNcclAllreduce() override;

  std::string name() const override { return "nccl_hierarchical"; }
  bool Enabled(const CollectiveWork& work) const override;
  Status UseDevice(const Device& device, void* stream) override;
  Status Allreduce(const SpanStaging& staging, ReduceOp op) override;

 private:
  const CudaRuntime* cuda_;
  std::unique_ptr<ControlPlane> local_control_;
  std::unique_ptr<NcclCollectives> local_;  // before local_control_ goes
  std::unique_ptr<DataTransport> cross_;
  ControlPlane* group_;
  // GPUs on which every host started NCCL (agreed once; until then, each use asks again).
  std::set<int> agreed_;
  DeviceBuffer shard_;
  std::vector<uint8_t> host_shard_;
};

}  // namespace smdist
