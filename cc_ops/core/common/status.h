// Status: the error type every engine call returns. Exceptions never cross
// the engine boundary; callers (TF kernels, pybind) translate codes.
#pragma once

#include <string>
#include <utility>

namespace smdist {

enum class StatusCode {
  kOk = 0,
  kUnknown,
  kInvalidArgument,
  kPreconditionFailed,  // cross-rank mismatch, use before init
  kAborted,             // engine shut down or stalled
};

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message)
      : code_(code), message_(std::move(message)) {}

  static Status OK() { return Status(); }
  static Status Unknown(std::string m) { return {StatusCode::kUnknown, std::move(m)}; }
  static Status InvalidArgument(std::string m) {
    return {StatusCode::kInvalidArgument, std::move(m)};
  }
  static Status PreconditionFailed(std::string m) {
    return {StatusCode::kPreconditionFailed, std::move(m)};
  }
  static Status Aborted(std::string m) { return {StatusCode::kAborted, std::move(m)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

#define SMDIST_RETURN_IF_ERROR(expr)       \
  do {                                     \
    ::smdist::Status _st = (expr);         \
    if (!_st.ok()) return _st;             \
  } while (0)

}  // namespace smdist
