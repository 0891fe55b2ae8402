// Conversions between TensorFlow and engine types, shared by the kernels.
#pragma once

#include <vector>

#include "common/status.h"
#include "common/types.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"

namespace smdist {
namespace tf_bridge {

inline bool ToEngineType(tensorflow::DataType dt, DataType* out) {
  switch (dt) {
    case tensorflow::DT_UINT8: *out = DataType::kUInt8; return true;
    case tensorflow::DT_INT8: *out = DataType::kInt8; return true;
    case tensorflow::DT_UINT16: *out = DataType::kUInt16; return true;
    case tensorflow::DT_INT16: *out = DataType::kInt16; return true;
    case tensorflow::DT_INT32: *out = DataType::kInt32; return true;
    case tensorflow::DT_INT64: *out = DataType::kInt64; return true;
    case tensorflow::DT_HALF: *out = DataType::kFloat16; return true;
    case tensorflow::DT_BFLOAT16: *out = DataType::kBFloat16; return true;
    case tensorflow::DT_FLOAT: *out = DataType::kFloat32; return true;
    case tensorflow::DT_DOUBLE: *out = DataType::kFloat64; return true;
    case tensorflow::DT_BOOL: *out = DataType::kBool; return true;
    default: return false;
  }
}

inline absl::Status ToTfStatus(const Status& s) {
  switch (s.code()) {
    case StatusCode::kOk: return absl::OkStatus();
    case StatusCode::kInvalidArgument: return absl::InvalidArgumentError(s.message());
    case StatusCode::kPreconditionFailed: return absl::FailedPreconditionError(s.message());
    case StatusCode::kAborted: return absl::AbortedError(s.message());
    case StatusCode::kUnknown: break;
  }
  return absl::UnknownError(s.message());
}

inline Status FromTfStatus(const absl::Status& s) {
  if (s.ok()) return Status::OK();
  return Status::InvalidArgument(std::string(s.message()));
}

inline std::vector<int64_t> ToDims(const tensorflow::TensorShape& shape) {
  std::vector<int64_t> dims;
  for (int i = 0; i < shape.dims(); ++i) dims.push_back(shape.dim_size(i));
  return dims;
}

inline tensorflow::TensorShape ToShape(const std::vector<int64_t>& dims) {
  tensorflow::TensorShape shape;
  for (int64_t d : dims) shape.AddDim(d);
  return shape;
}

}  // namespace tf_bridge
}  // namespace smdist
