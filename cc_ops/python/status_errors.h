// Engine status to Python exception, at the binding boundary: RuntimeError,
// or ValueError for bad arguments.
#pragma once

#include <pybind11/pybind11.h>

#include <stdexcept>

#include "common/status.h"

namespace smdist_python {

inline void RaiseIfError(const smdist::Status& s) {
  if (s.ok()) return;
  if (s.code() == smdist::StatusCode::kInvalidArgument) throw pybind11::value_error(s.message());
  throw std::runtime_error(s.message());
}

}  // namespace smdist_python
