#include "transports/nccl/nccl_library.h"

#include <memory>
#include <mutex>

namespace smdist {

const NcclLibrary* NcclLibrary::Get(Status* why) {
  static std::once_flag once;
  // Never freed: device buffers and communicators released at process exit,
  // after static destructors ran, still call into the library.
  static NcclLibrary* nccl = nullptr;
  static Status load_status;
  std::call_once(once, [] {
    auto n = std::make_unique<NcclLibrary>();
    load_status = n->Load();
    if (load_status.ok()) nccl = n.release();
  });
  if (nccl == nullptr && why != nullptr) *why = load_status;
  return nccl;
}

Status NcclLibrary::Load() {
  SMDIST_RETURN_IF_ERROR(SharedLibrary::Open("SMDIST_NCCL_LIBRARY", {"libnccl.so.2", "libnccl.so"}, &library_));
  SMDIST_RETURN_IF_ERROR(library_.Function("ncclGetVersion", &get_version_));
  SMDIST_RETURN_IF_ERROR(library_.Function("ncclGetErrorString", &get_error_string_));
  SMDIST_RETURN_IF_ERROR(library_.Function("ncclGetUniqueId", &GetUniqueId));
  SMDIST_RETURN_IF_ERROR(library_.Function("ncclCommInitRank", &CommInitRank));
  SMDIST_RETURN_IF_ERROR(library_.Function("ncclCommDestroy", &CommDestroy));
  SMDIST_RETURN_IF_ERROR(library_.Function("ncclAllReduce", &AllReduce));
  SMDIST_RETURN_IF_ERROR(library_.Function("ncclReduceScatter", &ReduceScatter));
  SMDIST_RETURN_IF_ERROR(library_.Function("ncclAllGather", &AllGather));
  SMDIST_RETURN_IF_ERROR(library_.Function("ncclBroadcast", &Broadcast));
  SMDIST_RETURN_IF_ERROR(library_.Function("ncclReduce", &Reduce));
  SMDIST_RETURN_IF_ERROR(library_.Function("ncclSend", &Send));
  SMDIST_RETURN_IF_ERROR(library_.Function("ncclRecv", &Recv));
  SMDIST_RETURN_IF_ERROR(library_.Function("ncclGroupStart", &GroupStart));
  SMDIST_RETURN_IF_ERROR(library_.Function("ncclGroupEnd", &GroupEnd));
  SMDIST_RETURN_IF_ERROR(library_.Function("ncclRedOpCreatePreMulSum", &RedOpCreatePreMulSum));
  SMDIST_RETURN_IF_ERROR(library_.Function("ncclRedOpDestroy", &RedOpDestroy));
  int version = 0;
  SMDIST_RETURN_IF_ERROR(Check(get_version_(&version), "ncclGetVersion"));
  // Send/recv, bfloat16 and ncclAvg/PreMulSum arrived by 2.11.
  if (version < 21100) {
    return Status::PreconditionFailed(library_.path() + " is NCCL " + Version() + "; smdist_tf needs 2.11 or newer");
  }
  return Status::OK();
}

bool NcclLibrary::TypeOf(DataType dtype, NcclDataType* out) {
  switch (dtype) {
    case DataType::kInt8: *out = kNcclInt8; return true;
    case DataType::kUInt8: *out = kNcclUint8; return true;
    case DataType::kInt32: *out = kNcclInt32; return true;
    case DataType::kInt64: *out = kNcclInt64; return true;
    case DataType::kFloat16: *out = kNcclFloat16; return true;
    case DataType::kBFloat16: *out = kNcclBfloat16; return true;
    case DataType::kFloat32: *out = kNcclFloat32; return true;
    case DataType::kFloat64: *out = kNcclFloat64; return true;
    case DataType::kBool: case DataType::kInt16: case DataType::kUInt16: return false;
  }
  return false;
}

bool NcclLibrary::OpOf(ReduceOp op, NcclRedOp* out) {
  switch (op) {
    case ReduceOp::kSum: *out = kNcclSum; return true;
    case ReduceOp::kProduct: *out = kNcclProd; return true;
    case ReduceOp::kMax: *out = kNcclMax; return true;
    case ReduceOp::kMin: *out = kNcclMin; return true;
    case ReduceOp::kAverage: *out = kNcclAvg; return true;
  }
  return false;
}

Status NcclLibrary::Check(int result, const char* call) const {
  if (result == 0) return Status::OK();
  return Status::Unknown(std::string(call) + " failed: " + get_error_string_(result) + " (NCCL " + Version() +
                         ", error " + std::to_string(result) + ")");
}

int NcclLibrary::VersionCode() const {
  int v = 0;
  return get_version_(&v) == 0 ? v : 0;
}

std::string NcclLibrary::Version() const {
  const int v = VersionCode();
  if (v == 0) return "?";
  // 2.9 and later encode major*10000 + minor*100 + patch.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

}  // namespace smdist
