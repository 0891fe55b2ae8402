#include "common/types.h"

#include <initializer_list>

namespace smdist {

size_t DataTypeSize(DataType dtype) {
  switch (dtype) {
    case DataType::kUInt8:
    case DataType::kInt8:
    case DataType::kBool:
      return 1;
    case DataType::kFloat16:
    case DataType::kBFloat16:
    case DataType::kUInt16:
    case DataType::kInt16:
      return 2;
    case DataType::kInt32:
    case DataType::kFloat32:
      return 4;
    case DataType::kInt64:
    case DataType::kFloat64:
      return 8;
  }
  return 0;
}

const char* DataTypeName(DataType dtype) {
  switch (dtype) {
    case DataType::kUInt8: return "uint8";
    case DataType::kInt8: return "int8";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
    case DataType::kFloat16: return "float16";
    case DataType::kBFloat16: return "bfloat16";
    case DataType::kFloat32: return "float32";
    case DataType::kFloat64: return "float64";
    case DataType::kBool: return "bool";
    case DataType::kUInt16: return "uint16";
    case DataType::kInt16: return "int16";
  }
  return "unknown";
}

DataType WireDataType(DataType dtype, WireCompression compression) {
  if (!IsFloatingPoint(dtype)) return dtype;
  switch (compression) {
    case WireCompression::kFloat16: return DataType::kFloat16;
    case WireCompression::kBFloat16: return DataType::kBFloat16;
    case WireCompression::kInt8: return DataType::kInt8;
    case WireCompression::kNone: break;
  }
  return dtype;
}

const char* WireCompressionName(WireCompression compression) {
  switch (compression) {
    case WireCompression::kNone: return "none";
    case WireCompression::kFloat16: return "fp16";
    case WireCompression::kBFloat16: return "bf16";
    case WireCompression::kInt8: return "int8";
  }
  return "unknown";
}

bool WireCompressionFromName(const std::string& name, WireCompression* compression) {
  for (WireCompression c : {WireCompression::kNone, WireCompression::kFloat16, WireCompression::kBFloat16,
                            WireCompression::kInt8}) {
    if (name == WireCompressionName(c)) {
      *compression = c;
      return true;
    }
  }
  return false;
}

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kAverage: return "Average";
    case ReduceOp::kSum: return "Sum";
    case ReduceOp::kAdasum: return "Adasum";
    case ReduceOp::kMin: return "Min";
    case ReduceOp::kMax: return "Max";
    case ReduceOp::kProduct: return "Product";
  }
  return "unknown";
}

const char* CollectiveTypeName(CollectiveType type) {
  switch (type) {
    case CollectiveType::kAllreduce: return "allreduce";
    case CollectiveType::kAllgather: return "allgather";
    case CollectiveType::kBroadcast: return "broadcast";
    case CollectiveType::kAlltoall: return "alltoall";
    case CollectiveType::kReducescatter: return "reducescatter";
    case CollectiveType::kBarrier: return "barrier";
    case CollectiveType::kJoin: return "join";
  }
  return "unknown";
}

bool IsFloatingPoint(DataType dtype) {
  return dtype == DataType::kFloat16 || dtype == DataType::kBFloat16 ||
         dtype == DataType::kFloat32 || dtype == DataType::kFloat64;
}

bool IsValidReduceOp(int32_t op) {
  return op >= 0 && op <= 5;
}

int64_t NumElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeToString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace smdist
