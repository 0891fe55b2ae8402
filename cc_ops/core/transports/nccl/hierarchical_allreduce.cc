#include "transports/nccl/hierarchical_allreduce.h"

namespace smdist {

HierarchicalNcclAllreduce::HierarchicalNcclAllreduce(const NcclLibrary* nccl, const CudaRuntime* cuda,
                                                     std::unique_ptr<ControlPlane> local_control,
                                                     std::unique_ptr<DataTransport> cross, ControlPlane* group,
                                                     std::string hostname)
    : cuda_(cuda),
      local_control_(std::move(local_control)),
      local_(std::make_unique<NcclCollectives>(nccl, cuda, local_control_.get(), std::move(hostname))),
      cross_(std::move(cross)),
      group_(group) {}

HierarchicalNcclAllreduce::~HierarchicalNcclAllreduce() {
  local_.reset();  // its communicator before the channel it was bootstrapped on
  cross_.reset();
  local_control_.reset();
}

bool HierarchicalNcclAllreduce::Enabled(const CollectiveWork& work) const {
  return work.type == CollectiveType::kAllreduce && local_->Enabled(work);
}

Status HierarchicalNcclAllreduce::UseDevice(const Device& device, void* stream) {
  // Each host starts NCCL among its own ranks; every rank of the group must
  // hear whether all hosts could, or hosts that could would go on alone.
  Status local = local_->UseDevice(device, stream);
  if (agreed_.count(device.id) != 0 || (!local.ok() && local.code() != StatusCode::kPreconditionFailed)) {
    return local;
  }
  std::vector<uint64_t> everywhere = {local.ok() ? 1u : 0u};
  SMDIST_RETURN_IF_ERROR(group_->AllreduceBits(&everywhere, /*bitwise_and=*/true));
  if (!local.ok()) return local;
  if (everywhere[0] == 0) {
    return Status::PreconditionFailed("NCCL could not start on another host's GPUs (that host's ranks say why)");
  }
  agreed_.insert(device.id);
  return Status::OK();
}

Status HierarchicalNcclAllreduce::Allreduce(const SpanStaging& staging, ReduceOp op) {
  const DataType dtype = staging.dtype();
  const size_t elem = DataTypeSize(dtype);
  const int64_t count = staging.count();
  void* const stream = local_->stream();
  // Many tensors are packed into the local transport's fusion buffer first.
  const std::vector<TensorSpan>& spans = staging.spans();
  const void* input = spans[0].input;
  void* output = spans[0].output;
  if (spans.size() > 1) {
    void* buffer = nullptr;
    SMDIST_RETURN_IF_ERROR(local_->FusionBuffer(count * elem, &buffer));
    int64_t offset = 0;
    for (const TensorSpan& s : spans) {
      SMDIST_RETURN_IF_ERROR(
          cuda_->CopyAsync(static_cast<uint8_t*>(buffer) + offset * elem, s.input, s.count * elem, stream));
      offset += s.count;
    }
    input = output = buffer;
  }
  const Topology& local = local_control_->topology();
  std::vector<int64_t> counts(local.size);
  for (int r = 0; r < local.size; ++r) counts[r] = count / local.size + (r < count % local.size ? 1 : 0);
  const int64_t mine = counts[local.rank];
  SMDIST_RETURN_IF_ERROR(shard_.Reserve(cuda_, local_->device(), std::max<int64_t>(mine, 1) * elem));
  // Scaling (Average's division too) is folded into the first reduction: the rest only sums.
  SMDIST_RETURN_IF_ERROR(local_->ScaledReduceScatter(input, shard_.data(), counts, dtype, op,
                                                     staging.prescale() * staging.postscale()));
  if (mine > 0) {
    host_shard_.resize(mine * elem);
    SMDIST_RETURN_IF_ERROR(cuda_->CopyAsync(host_shard_.data(), shard_.data(), mine * elem, stream));
    SMDIST_RETURN_IF_ERROR(cuda_->Synchronize(stream));
    SMDIST_RETURN_IF_ERROR(
        cross_->Allreduce(SpanStaging({{host_shard_.data(), host_shard_.data(), mine}}, dtype, dtype, 1.0, 1.0), op));
    // From pageable memory: the host buffer has been read when the call returns.
    SMDIST_RETURN_IF_ERROR(cuda_->CopyAsync(shard_.data(), host_shard_.data(), mine * elem, stream));
  }
  SMDIST_RETURN_IF_ERROR(local_->Allgatherv(shard_.data(), output, counts, dtype));
  if (spans.size() > 1) {
    int64_t offset = 0;
    for (const TensorSpan& s : spans) {
      SMDIST_RETURN_IF_ERROR(
          cuda_->CopyAsync(s.output, static_cast<uint8_t*>(output) + offset * elem, s.count * elem, stream));
      offset += s.count;
    }
  }
  return Status::OK();
}

}  // namespace smdist
