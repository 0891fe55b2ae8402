// Framework-neutral element types, reduction ops and collective kinds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace smdist {

enum class DataType : int32_t {
  kUInt8 = 0,
  kInt8,
  kInt32,
  kInt64,
  kFloat16,
  kBFloat16,
  kFloat32,
  kFloat64,
  kBool,
  kUInt16,
  kInt16,
};

// Values match the Python constants in smdist_tf/reduce_ops.py.
enum class ReduceOp : int32_t {
  kAverage = 0,
  kSum = 1,
  kAdasum = 2,  // adasum_allreduce.h; allreduce only
  kMin = 3,
  kMax = 4,
  kProduct = 5,
};

enum class CollectiveType : int32_t {
  kAllreduce = 0,
  kAllgather,
  kBroadcast,
  kAlltoall,
  kReducescatter,
  kBarrier,
  // Horovod's join(): this rank has no more work; until every rank has
  // joined, the others' collectives complete without it.
  kJoin,
};

// What floating-point tensors of an allreduce travel as (Compression.fp16/bf16/int8).
enum class WireCompression : int32_t {
  kNone = 0,
  kFloat16,
  kBFloat16,
  // int8 blocks with an fp32 scale each, summed in fp32 (transports/mpi/int8_ring_allreduce.h).
  kInt8,
};

size_t DataTypeSize(DataType dtype);
// The dtype `dtype` travels as: the compressed type for other floating-point
// types, otherwise `dtype` itself.
DataType WireDataType(DataType dtype, WireCompression compression);
const char* WireCompressionName(WireCompression compression);
// The compression WireCompressionName calls `name`; false for an unknown name.
bool WireCompressionFromName(const std::string& name, WireCompression* compression);
const char* DataTypeName(DataType dtype);
const char* ReduceOpName(ReduceOp op);
const char* CollectiveTypeName(CollectiveType type);
bool IsFloatingPoint(DataType dtype);
bool IsValidReduceOp(int32_t op);

int64_t NumElements(const std::vector<int64_t>& shape);
std::string ShapeToString(const std::vector<int64_t>& shape);

}  // namespace smdist
