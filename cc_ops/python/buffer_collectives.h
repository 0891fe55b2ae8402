// Collectives on host buffers, straight through the engine without TensorFlow.
#pragma once

#include <pybind11/pybind11.h>

namespace smdist_python {

// Adds _allreduce_buffer and _broadcast_buffer to the runtime module.
void DefineBufferCollectives(pybind11::module_& m);

}  // namespace smdist_python
