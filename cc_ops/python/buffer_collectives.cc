// Collectives on host buffers (NumPy arrays, anything with the buffer
// protocol), straight through the engine: the path tests take where there is
// no TensorFlow (the GPU machine), and the one device arrays will extend.
// Each call blocks until the collective completed on this rank.
#include "buffer_collectives.h"

#include <string>
#include <vector>

#include "common/tensor_entry.h"
#include "engine_calls.h"
#include "status_errors.h"

namespace py = pybind11;

namespace smdist_python {
namespace {

// The engine's element type for a buffer's struct-module format ("<f", "d", "q", ...).
smdist::DataType DataTypeOf(const py::buffer_info& b) {
  const char code = b.format.empty() ? '?' : b.format.back();
  const auto by_size = [&b](smdist::DataType four, smdist::DataType eight) {
    if (b.itemsize == 4) return four;
    if (b.itemsize == 8) return eight;
    throw py::value_error("unsupported integer size " + std::to_string(b.itemsize));
  };
  switch (code) {
    case 'e': return smdist::DataType::kFloat16;
    case 'f': return smdist::DataType::kFloat32;
    case 'd': return smdist::DataType::kFloat64;
    case 'b': return smdist::DataType::kInt8;
    case 'B': return smdist::DataType::kUInt8;
    case 'h': return smdist::DataType::kInt16;
    case 'H': return smdist::DataType::kUInt16;
    case 'i': case 'l': case 'q': return by_size(smdist::DataType::kInt32, smdist::DataType::kInt64);
    case '?': return smdist::DataType::kBool;
    default: throw py::value_error("unsupported buffer format '" + b.format + "'");
  }
}

// The shape of a C-contiguous buffer; anything else is refused.
std::vector<int64_t> ContiguousShape(const py::buffer_info& b) {
  int64_t stride = b.itemsize;
  for (int64_t d = b.ndim - 1; d >= 0; --d) {
    if (b.shape[d] > 1 && b.strides[d] != stride) throw py::value_error("the buffer must be C-contiguous");
    stride *= b.shape[d];
  }
  return std::vector<int64_t>(b.shape.begin(), b.shape.end());
}

}  // namespace

void DefineBufferCollectives(py::module_& m) {
  m.def(
      "_allreduce_buffer",
      [](py::buffer input, py::buffer output, const std::string& name, int op, double prescale, double postscale,
         int device, int process_set_id) {
        const py::buffer_info in = input.request();
        const py::buffer_info out = output.request(/*writable=*/true);
        smdist::TensorEntry e;
        e.dtype = DataTypeOf(in);
        e.shape = ContiguousShape(in);
        if (DataTypeOf(out) != e.dtype || ContiguousShape(out) != e.shape) {
          throw py::value_error("_allreduce_buffer: output must match the input's dtype and shape");
        }
        if (!smdist::IsValidReduceOp(op)) throw py::value_error("unknown reduce op " + std::to_string(op));
        e.name = name;
        e.process_set_id = process_set_id;
        e.type = smdist::CollectiveType::kAllreduce;
        e.input = in.ptr;
        e.output = out.ptr;
        e.reduce_op = static_cast<smdist::ReduceOp>(op);
        e.prescale = prescale;
        e.postscale = postscale;
        // Where the data is said to live (-1: the host; n: GPU n). Host buffers named as
        // GPU ones test what ranks are told when no transport reaches a device.
        e.device = smdist::Device{device};
        RaiseIfError(RunToCompletion({std::move(e)}));
      },
      py::arg("input"), py::arg("output"), py::arg("name"), py::arg("op"), py::arg("prescale") = 1.0,
      py::arg("postscale") = 1.0, py::arg("device") = -1, py::arg("process_set_id") = 0);
  m.def(
      "_broadcast_buffer",
      [](py::buffer buffer, int root_rank, const std::string& name, int process_set_id) {
        const py::buffer_info b = buffer.request(/*writable=*/true);
        smdist::TensorEntry e;
        e.name = name;
        e.process_set_id = process_set_id;
        e.type = smdist::CollectiveType::kBroadcast;
        e.dtype = DataTypeOf(b);
        e.shape = ContiguousShape(b);
        e.input = b.ptr;
        e.output = b.ptr;
        e.root_rank = root_rank;  // a world rank: the engine checks it against the set
        RaiseIfError(RunToCompletion({std::move(e)}));
      },
      py::arg("buffer"), py::arg("root_rank"), py::arg("name"), py::arg("process_set_id") = 0);
}

}  // namespace smdist_python
