// Collectives on raw device pointers and a CUDA stream, straight through the
// engine: how the GPU data plane is driven and tested where TensorFlow is not
// installed (CuPy arrays on the GPU machine).
#pragma once

#include <pybind11/pybind11.h>

namespace smdist_python {

// Adds _allreduce_device, _allgather_device, _broadcast_device,
// _alltoall_device, _reducescatter_device and _dtype_codes to the runtime module.
void DefineDeviceCollectives(pybind11::module_& m);

}  // namespace smdist_python
