#include "transports/nccl/nccl_collectives.h"

#include <cstring>
#include <set>

#include "common/half.h"

namespace smdist {
namespace {

// Bytes of the bootstrap reply: a verdict byte, then the unique id or an error.
constexpr uint8_t kBootstrapOk = 1;

// Whether NCCL reduces `work` as it lies: its element type, no conversion on
// the wire, and scaling NCCL can fold in (PreMulSum: Sum and Average of
// floating-point tensors).
bool ReducibleInPlace(const CollectiveWork& work) {
  if (work.op == ReduceOp::kAdasum) return false;  // host-staged (adasum_allreduce.h)
  NcclDataType type;
  if (!NcclLibrary::TypeOf(work.dtype, &type) || work.wire != work.dtype) return false;
  const bool scaled = work.prescaled || work.postscaled;
  if (!IsFloatingPoint(work.dtype)) return !scaled && work.op != ReduceOp::kAverage;
  return !scaled || work.op == ReduceOp::kSum || work.op == ReduceOp::kAverage;
}

// The PreMulSum scalar, in the tensors' own type.
void ScalarOf(DataType dtype, double factor, uint8_t out[8]) {
  if (dtype == DataType::kFloat64) {
    std::memcpy(out, &factor, sizeof(double));
  } else if (dtype == DataType::kFloat32) {
    const float f = static_cast<float>(factor);
    std::memcpy(out, &f, sizeof(float));
  } else {
    const uint16_t h = dtype == DataType::kFloat16 ? FloatToHalf(static_cast<float>(factor))
                                                   : FloatToBFloat16(static_cast<float>(factor));
    std::memcpy(out, &h, sizeof(uint16_t));
  }
}

}  // namespace

NcclCollectives::NcclCollectives(const NcclLibrary* nccl, const CudaRuntime* cuda, ControlPlane* control,
                                 std::string hostname)
    : nccl_(nccl), cuda_(cuda), control_(control), hostname_(std::move(hostname)) {}

NcclCollectives::~NcclCollectives() {
  for (auto& [device, on] : devices_) {
    if (cuda_->SetDevice(device).ok() && on.comm != nullptr) nccl_->CommDestroy(on.comm);
  }
}

bool NcclCollectives::Enabled(const CollectiveWork& work) const {
  if (work.device.is_cpu()) return false;
  switch (work.type) {
    case CollectiveType::kAllreduce:
      return ReducibleInPlace(work);
    case CollectiveType::kReducescatter:
      return ReducibleInPlace(work) && !work.prescaled && !work.postscaled;
    case CollectiveType::kAllgather:
    case CollectiveType::kBroadcast:
    case CollectiveType::kAlltoall:
      return true;  // moved as bytes: every element type
    case CollectiveType::kBarrier:
    case CollectiveType::kJoin:
      return false;
  }
  return false;
}

Status NcclCollectives::UseDevice(const Device& device, void* stream) {
  device_ = device.id;
  stream_ = stream;
  OnDevice& on = devices_[device_];
  if (on.comm == nullptr) return CreateCommunicator(&on.comm);
  return cuda_->SetDevice(device_);
}

Status NcclCollectives::Current(OnDevice** out) {
  OnDevice& on = devices_[device_];
  if (on.comm == nullptr) return Status::Unknown("internal error: NCCL used before UseDevice()");
  *out = &on;
  return Status::OK();
}

Status NcclCollectives::CreateCommunicator(NcclComm* out) {
  const Topology& topo = control_->topology();
  // NCCL refuses two ranks on one GPU, and a refusal inside ncclCommInitRank
  // reaches the ranks at different times: rank 0 checks which GPU each rank
  // has first and tells every rank the same answer.
  std::string bus_id;
  Status s = cuda_->SetDevice(device_);
  if (s.ok()) s = cuda_->PciBusId(device_, &bus_id);
  const std::string mine = s.ok() ? hostname_ + " " + bus_id : "!" + s.message();
  std::vector<uint8_t> mine_bytes(mine.begin(), mine.end());
  std::vector<std::vector<uint8_t>> gathered;
  SMDIST_RETURN_IF_ERROR(control_->GatherToRoot(mine_bytes, &gathered));
  std::vector<uint8_t> reply;
  if (topo.rank == 0) {
    std::string error;
    std::map<std::string, int> owner;
    for (int r = 0; r < static_cast<int>(gathered.size()) && error.empty(); ++r) {
      const std::string gpu(gathered[r].begin(), gathered[r].end());
      if (!gpu.empty() && gpu[0] == '!') {
        error = "rank " + std::to_string(r) + " cannot tell which GPU it uses: " + gpu.substr(1);
      } else if (!owner.emplace(gpu, r).second) {
        error = "ranks " + std::to_string(owner[gpu]) + " and " + std::to_string(r) + " of this group share one GPU (" +
                gpu + "), which NCCL refuses: give each rank its own GPU (CUDA_VISIBLE_DEVICES or the local rank), "
                "or set SMDIST_GPU_OPERATIONS=MPI to stage GPU tensors through host memory";
      }
    }
    NcclUniqueId id;
    if (error.empty()) {
      Status got = nccl_->Check(nccl_->GetUniqueId(&id), "ncclGetUniqueId");
      if (!got.ok()) error = got.message();
    }
    if (error.empty()) {
      reply.push_back(kBootstrapOk);
      reply.insert(reply.end(), id.internal, id.internal + sizeof(id.internal));
    } else {
      reply.push_back(0);
      reply.insert(reply.end(), error.begin(), error.end());
    }
  }
  SMDIST_RETURN_IF_ERROR(control_->BroadcastFromRoot(&reply));
  if (reply.empty() || reply[0] != kBootstrapOk || reply.size() != 1 + sizeof(NcclUniqueId)) {
    return Status::PreconditionFailed("NCCL cannot start on GPU:" + std::to_string(device_) + ": " +
                                      std::string(reply.begin() + (reply.empty() ? 0 : 1), reply.end()));
  }
  NcclUniqueId id;
  std::memcpy(id.internal, reply.data() + 1, sizeof(id.internal));
  // From here a failure reaches the ranks at different times: it stops the engine.
  Status init = nccl_->Check(nccl_->CommInitRank(out, topo.size, id, topo.rank), "ncclCommInitRank");
  if (!init.ok()) *out = nullptr;
  return init.ok() ? init : Status::Unknown(init.message());
}

template <typename F>
Status NcclCollectives::WithOp(ReduceOp op, DataType dtype, double factor, NcclComm comm, F&& f) {
  NcclRedOp plain;
  if (!NcclLibrary::OpOf(op, &plain)) return Status::InvalidArgument("NCCL has no reduction for this op");
  if (factor == 1.0) return f(static_cast<int>(plain));
  int scaled = 0;
  uint8_t scalar[8] = {0};
  ScalarOf(dtype, factor, scalar);
  NcclDataType type;
  NcclLibrary::TypeOf(dtype, &type);
  constexpr int kScalarHostImmediate = 1;
  SMDIST_RETURN_IF_ERROR(nccl_->Check(nccl_->RedOpCreatePreMulSum(&scaled, scalar, type, kScalarHostImmediate, comm),
                                      "ncclRedOpCreatePreMulSum"));
  Status s = f(scaled);
  // Released once the calls that use it have returned (NCCL allows it then).
  nccl_->RedOpDestroy(scaled, comm);
  return s;
}

Status NcclCollectives::Allreduce(const SpanStaging& staging, ReduceOp op) {
  OnDevice* on = nullptr;
  SMDIST_RETURN_IF_ERROR(Current(&on));
  NcclDataType type;
  NcclLibrary::TypeOf(staging.dtype(), &type);
  const size_t elem = DataTypeSize(staging.dtype());
  const std::vector<TensorSpan>& spans = staging.spans();
  // Prescaling and postscaling (Average's division too) fold into one factor:
  // only Sum takes one (Enabled).
  const double factor = staging.prescale() * staging.postscale();
  return WithOp(op, staging.dtype(), factor, on->comm, [&](int nccl_op) -> Status {
    if (spans.size() == 1) {
      return nccl_->Check(nccl_->AllReduce(spans[0].input, spans[0].output, spans[0].count, type, nccl_op, on->comm,
                                           stream_), "ncclAllReduce");
    }
    SMDIST_RETURN_IF_ERROR(on->fusion.Reserve(cuda_, device_, staging.count() * elem));
    auto* buffer = static_cast<uint8_t*>(on->fusion.data());
    int64_t offset = 0;
    for (const TensorSpan& s : spans) {
      SMDIST_RETURN_IF_ERROR(cuda_->CopyAsync(buffer + offset * elem, s.input, s.count * elem, stream_));
      offset += s.count;
    }
    SMDIST_RETURN_IF_ERROR(nccl_->Check(
        nccl_->AllReduce(buffer, buffer, staging.count(), type, nccl_op, on->comm, stream_), "ncclAllReduce"));
    offset = 0;
    for (const TensorSpan& s : spans) {
      SMDIST_RETURN_IF_ERROR(cuda_->CopyAsync(s.output, buffer + offset * elem, s.count * elem, stream_));
      offset += s.count;
    }
    return Status::OK();
  });
}

Status NcclCollectives::Allgatherv(const void* send, void* recv, const std::vector<int64_t>& counts,
                                   DataType dtype) {
  OnDevice* on = nullptr;
  SMDIST_RETURN_IF_ERROR(Current(&on));
  const size_t elem = DataTypeSize(dtype);
  bool even = true;
  for (int64_t c : counts) even = even && c == counts[0];
  if (even) {
    return nccl_->Check(nccl_->AllGather(send, recv, counts[0] * elem, kNcclUint8, on->comm, stream_),
                        "ncclAllGather");
  }
  // Ragged: each rank's block is a broadcast from it, all in one group.
  const int me = control_->topology().rank;
  auto* out = static_cast<uint8_t*>(recv);
  SMDIST_RETURN_IF_ERROR(nccl_->Check(nccl_->GroupStart(), "ncclGroupStart"));
  Status s;
  int64_t offset = 0;
  for (int r = 0; r < static_cast<int>(counts.size()) && s.ok(); ++r) {
    const size_t bytes = counts[r] * elem;
    if (bytes > 0) {
      s = nccl_->Check(nccl_->Broadcast(r == me ? send : out + offset, out + offset, bytes, kNcclUint8, r, on->comm,
                                        stream_), "ncclBroadcast");
    }
    offset += bytes;
  }
  Status ended = nccl_->Check(nccl_->GroupEnd(), "ncclGroupEnd");
  return s.ok() ? ended : s;
}

Status NcclCollectives::Broadcast(const void* input, void* output, int64_t count, DataType dtype, int root) {
  OnDevice* on = nullptr;
  SMDIST_RETURN_IF_ERROR(Current(&on));
  const void* send = control_->topology().rank == root ? input : output;
  return nccl_->Check(nccl_->Broadcast(send, output, count * DataTypeSize(dtype), kNcclUint8, root, on->comm,
                                       stream_), "ncclBroadcast");
}

Status NcclCollectives::Alltoallv(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                                  const std::vector<int64_t>& recv_counts, DataType dtype) {
  OnDevice* on = nullptr;
  SMDIST_RETURN_IF_ERROR(Current(&on));
  const size_t elem = DataTypeSize(dtype);
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  SMDIST_RETURN_IF_ERROR(nccl_->Check(nccl_->GroupStart(), "ncclGroupStart"));
  Status s;
  int64_t sent = 0, received = 0;
  for (int r = 0; r < static_cast<int>(send_counts.size()) && s.ok(); ++r) {
    const size_t send_bytes = send_counts[r] * elem, recv_bytes = recv_counts[r] * elem;
    if (send_bytes > 0) {
      s = nccl_->Check(nccl_->Send(in + sent, send_bytes, kNcclUint8, r, on->comm, stream_), "ncclSend");
    }
    if (s.ok() && recv_bytes > 0) {
      s = nccl_->Check(nccl_->Recv(out + received, recv_bytes, kNcclUint8, r, on->comm, stream_), "ncclRecv");
    }
    sent += send_bytes;
    received += recv_bytes;
  }
  Status ended = nccl_->Check(nccl_->GroupEnd(), "ncclGroupEnd");
  return s.ok() ? ended : s;
}

Status NcclCollectives::FusionBuffer(size_t bytes, void** out) {
  OnDevice* on = nullptr;
  SMDIST_RETURN_IF_ERROR(Current(&on));
  SMDIST_RETURN_IF_ERROR(on->fusion.Reserve(cuda_, device_, bytes));
  *out = on->fusion.data();
  return Status::OK();
}

Status NcclCollectives::ReduceScatter(const void* send, void* recv, const std::vector<int64_t>& recv_counts,
                                      DataType dtype, ReduceOp op) {
  return ScaledReduceScatter(send, recv, recv_counts, dtype, op, 1.0);
}

Status NcclCollectives::ScaledReduceScatter(const void* send, void* recv, const std::vector<int64_t>& recv_counts,
                                            DataType dtype, ReduceOp op, double factor) {
  OnDevice* on = nullptr;
  SMDIST_RETURN_IF_ERROR(Current(&on));
  NcclDataType type;
  NcclLibrary::TypeOf(dtype, &type);
  const size_t elem = DataTypeSize(dtype);
  bool even = true;
  for (int64_t c : recv_counts) even = even && c == recv_counts[0];
  return WithOp(op, dtype, factor, on->comm, [&](int nccl_op) -> Status {
    if (even) {
      return nccl_->Check(nccl_->ReduceScatter(send, recv, recv_counts[0], type, nccl_op, on->comm, stream_),
                          "ncclReduceScatter");
    }
    // Uneven blocks: block r is a reduce to rank r, all in one group.
    const int me = control_->topology().rank;
    const auto* in = static_cast<const uint8_t*>(send);
    SMDIST_RETURN_IF_ERROR(nccl_->Check(nccl_->GroupStart(), "ncclGroupStart"));
    Status s;
    int64_t offset = 0;
    for (int r = 0; r < static_cast<int>(recv_counts.size()) && s.ok(); ++r) {
      if (recv_counts[r] > 0) {
        s = nccl_->Check(nccl_->Reduce(in + offset * elem, r == me ? recv : nullptr, recv_counts[r], type, nccl_op, r,
                                       on->comm, stream_), "ncclReduce");
      }
      offset += recv_counts[r];
    }
    Status ended = nccl_->Check(nccl_->GroupEnd(), "ncclGroupEnd");
    return s.ok() ? ended : s;
  });
}

}  // namespace smdist
