// NCCL, loaded when GPU collectives first need it (never linked), with the
// types of nccl.h that the engine uses spelled here: one build serves machines
// with and without NCCL. The values are NCCL's stable ABI (nccl.h, 2.x).
#pragma once

#include <cstddef>
#include <string>

#include "common/shared_library.h"
#include "common/status.h"
#include "common/types.h"

namespace smdist {

using NcclComm = void*;  // ncclComm_t
struct NcclUniqueId {
  char internal[128];
};
enum NcclDataType : int { kNcclInt8 = 0, kNcclUint8 = 1, kNcclInt32 = 2, kNcclInt64 = 4, kNcclFloat16 = 6,
                          kNcclFloat32 = 7, kNcclFloat64 = 8, kNcclBfloat16 = 9 };
enum NcclRedOp : int { kNcclSum = 0, kNcclProd = 1, kNcclMax = 2, kNcclMin = 3, kNcclAvg = 4 };

class NcclLibrary {
 public:
  // The process's NCCL, loaded on first use (SMDIST_NCCL_LIBRARY, else a
  // libnccl.so.2 already loaded, else one on the search path); null with
  // *why when there is none.
  static const NcclLibrary* Get(Status* why);

  // NCCL's element type for `dtype`; false where NCCL has none (16-bit
  // integers, bool).
  static bool TypeOf(DataType dtype, NcclDataType* out);
  // NCCL's reduction for `op`; false for none.
  static bool OpOf(ReduceOp op, NcclRedOp* out);

  // An error Status for a failed call, with NCCL's own words.
  Status Check(int result, const char* call) const;
  // "2.28.3": which NCCL was loaded.
  std::string Version() const;
  // The same as NCCL_VERSION_CODE (22803).
  int VersionCode() const;
  const std::string& library() const { return library_.path(); }

  int (*GetUniqueId)(NcclUniqueId*) = nullptr;
  int (*CommInitRank)(NcclComm*, int, NcclUniqueId, int) = nullptr;
  int (*CommDestroy)(NcclComm) = nullptr;
  int (*AllReduce)(const void*, void*, size_t, int, int, NcclComm, void*) = nullptr;
  int (*ReduceScatter)(const void*, void*, size_t, int, int, NcclComm, void*) = nullptr;
  int (*AllGather)(const void*, void*, size_t, int, NcclComm, void*) = nullptr;
  int (*Broadcast)(const void*, void*, size_t, int, int, NcclComm, void*) = nullptr;
  int (*Reduce)(const void*, void*, size_t, int, int, int, NcclComm, void*) = nullptr;
  int (*Send)(const void*, size_t, int, int, NcclComm, void*) = nullptr;
  int (*Recv)(void*, size_t, int, int, NcclComm, void*) = nullptr;
  int (*GroupStart)() = nullptr;
  int (*GroupEnd)() = nullptr;
  // ncclRedOpCreatePreMulSum: Sum of inputs each multiplied by a scalar
  // (prescaling and Average's division in the reduction itself).
  int (*RedOpCreatePreMulSum)(int*, void*, int, int, NcclComm) = nullptr;
  int (*RedOpDestroy)(int, NcclComm) = nullptr;

 private:
  Status Load();

  SharedLibrary library_;
  int (*get_version_)(int*) = nullptr;
  const char* (*get_error_string_)(int) = nullptr;
};

}  // namespace smdist
