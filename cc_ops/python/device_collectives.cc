// Pointers are integers (CuPy's `array.data.ptr`), streams too (`stream.ptr`;
// 0 is the default stream). Each call returns once its work is queued on the
// stream: the caller synchronizes the stream before it reads results, as it
// would after any other kernel. Outputs whose size only negotiation fixes
// (allgather, alltoall) come from `allocate(nbytes) -> pointer`, called on the
// engine thread.
#include "device_collectives.h"

#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "common/tensor_entry.h"
#include "engine_calls.h"
#include "status_errors.h"

namespace py = pybind11;

namespace smdist_python {
namespace {

using Allocate = std::function<uintptr_t(int64_t)>;

smdist::TensorEntry DeviceEntry(smdist::CollectiveType type, const std::string& name, int dtype,
                                std::vector<int64_t> shape, int device, uintptr_t stream, int process_set_id) {
  if (dtype < 0 || dtype > static_cast<int>(smdist::DataType::kInt16)) {
    throw py::value_error("unknown dtype code " + std::to_string(dtype));
  }
  if (device < 0) throw py::value_error("device must be a GPU ordinal (0, 1, ...)");
  smdist::TensorEntry e;
  e.type = type;
  e.name = name;
  e.dtype = static_cast<smdist::DataType>(dtype);
  e.shape = std::move(shape);
  e.device = smdist::Device::Gpu(device);
  e.stream = reinterpret_cast<void*>(stream);
  e.process_set_id = process_set_id;
  return e;
}

// allocate_output through the Python allocator (with the GIL: the engine thread holds none).
std::function<smdist::Status(const std::vector<int64_t>&, void**)> AllocateThrough(Allocate allocate,
                                                                                    smdist::DataType dtype) {
  return [allocate, dtype](const std::vector<int64_t>& shape, void** data) {
    const int64_t bytes = smdist::NumElements(shape) * static_cast<int64_t>(smdist::DataTypeSize(dtype));
    py::gil_scoped_acquire gil;
    try {
      *data = reinterpret_cast<void*>(allocate(bytes));
    } catch (const std::exception& err) {
      return smdist::Status::Unknown(std::string("allocate failed: ") + err.what());
    }
    return smdist::Status::OK();
  };
}

void CheckOp(int op) {
  if (!smdist::IsValidReduceOp(op)) throw py::value_error("unknown reduce op " + std::to_string(op));
}

}  // namespace

void DefineDeviceCollectives(py::module_& m) {
  py::dict codes;
  for (int d = 0; d <= static_cast<int>(smdist::DataType::kInt16); ++d) {
    codes[py::str(smdist::DataTypeName(static_cast<smdist::DataType>(d)))] = d;
  }
  m.attr("_dtype_codes") = codes;

  m.def(
      "_allreduce_device",
      [](const std::vector<uintptr_t>& inputs, const std::vector<uintptr_t>& outputs,
         const std::vector<int64_t>& counts, int dtype, const std::vector<std::string>& names, int op,
         double prescale, double postscale, int compression, int device, uintptr_t stream, int process_set_id) {
        if (inputs.size() != outputs.size() || inputs.size() != counts.size() || inputs.size() != names.size() ||
            inputs.empty()) {
          throw py::value_error("_allreduce_device: inputs, outputs, counts and names must be equally long, not empty");
        }
        CheckOp(op);
        if (compression < 0 || compression > static_cast<int>(smdist::WireCompression::kInt8)) {
          throw py::value_error("unknown compression " + std::to_string(compression));
        }
        std::vector<smdist::TensorEntry> entries;
        for (size_t i = 0; i < inputs.size(); ++i) {
          smdist::TensorEntry e = DeviceEntry(smdist::CollectiveType::kAllreduce, names[i], dtype, {counts[i]}, device,
                                              stream, process_set_id);
          e.input = reinterpret_cast<const void*>(inputs[i]);
          e.output = reinterpret_cast<void*>(outputs[i]);
          e.reduce_op = static_cast<smdist::ReduceOp>(op);
          e.prescale = prescale;
          e.postscale = postscale;
          e.compression = static_cast<smdist::WireCompression>(compression);
          entries.push_back(std::move(e));
        }
        RaiseIfError(RunToCompletion(std::move(entries)));
      },
      py::arg("inputs"), py::arg("outputs"), py::arg("counts"), py::arg("dtype"), py::arg("names"), py::arg("op"),
      py::arg("prescale") = 1.0, py::arg("postscale") = 1.0, py::arg("compression") = 0, py::arg("device") = 0,
      py::arg("stream") = 0, py::arg("process_set_id") = 0);

  m.def(
      "_allgather_device",
      [](uintptr_t input, int64_t rows, int64_t row_elements, int dtype, const std::string& name, Allocate allocate,
         int device, uintptr_t stream, int process_set_id) {
        smdist::TensorEntry e = DeviceEntry(smdist::CollectiveType::kAllgather, name, dtype, {rows, row_elements},
                                            device, stream, process_set_id);
        e.input = reinterpret_cast<const void*>(input);
        auto gathered_rows = std::make_shared<int64_t>(0);
        auto allocate_device = AllocateThrough(std::move(allocate), e.dtype);
        e.allocate_output = [allocate_device, gathered_rows](const std::vector<int64_t>& shape, void** data) {
          *gathered_rows = shape[0];
          return allocate_device(shape, data);
        };
        RaiseIfError(RunToCompletion({std::move(e)}));
        return *gathered_rows;
      },
      py::arg("input"), py::arg("rows"), py::arg("row_elements"), py::arg("dtype"), py::arg("name"),
      py::arg("allocate"), py::arg("device") = 0, py::arg("stream") = 0, py::arg("process_set_id") = 0);

  m.def(
      "_broadcast_device",
      [](uintptr_t input, uintptr_t output, int64_t count, int dtype, int root_rank, const std::string& name,
         int device, uintptr_t stream, int process_set_id) {
        smdist::TensorEntry e =
            DeviceEntry(smdist::CollectiveType::kBroadcast, name, dtype, {count}, device, stream, process_set_id);
        e.input = reinterpret_cast<const void*>(input);
        e.output = reinterpret_cast<void*>(output);
        e.root_rank = root_rank;
        RaiseIfError(RunToCompletion({std::move(e)}));
      },
      py::arg("input"), py::arg("output"), py::arg("count"), py::arg("dtype"), py::arg("root_rank"),
      py::arg("name"), py::arg("device") = 0, py::arg("stream") = 0, py::arg("process_set_id") = 0);

  m.def(
      "_alltoall_device",
      [](uintptr_t input, const std::vector<int64_t>& splits, int64_t row_elements, int dtype,
         const std::string& name, Allocate allocate, int device, uintptr_t stream, int process_set_id) {
        int64_t rows = 0;
        for (int64_t s : splits) rows += s;
        smdist::TensorEntry e = DeviceEntry(smdist::CollectiveType::kAlltoall, name, dtype, {rows, row_elements},
                                            device, stream, process_set_id);
        e.input = reinterpret_cast<const void*>(input);
        e.splits = splits;
        e.allocate_output = AllocateThrough(std::move(allocate), e.dtype);
        auto received = std::make_shared<std::vector<int64_t>>();
        e.set_received_splits = [received](const std::vector<int64_t>& r) { *received = r; };
        RaiseIfError(RunToCompletion({std::move(e)}));
        return *received;
      },
      py::arg("input"), py::arg("splits"), py::arg("row_elements"), py::arg("dtype"), py::arg("name"),
      py::arg("allocate"), py::arg("device") = 0, py::arg("stream") = 0, py::arg("process_set_id") = 0);

  m.def(
      "_reducescatter_device",
      [](uintptr_t input, uintptr_t output, int64_t rows, int64_t row_elements, int dtype, const std::string& name,
         int op, double prescale, double postscale, int device, uintptr_t stream, int process_set_id) {
        CheckOp(op);
        smdist::TensorEntry e = DeviceEntry(smdist::CollectiveType::kReducescatter, name, dtype, {rows, row_elements},
                                            device, stream, process_set_id);
        e.input = reinterpret_cast<const void*>(input);
        e.output = reinterpret_cast<void*>(output);
        e.reduce_op = static_cast<smdist::ReduceOp>(op);
        e.prescale = prescale;
        e.postscale = postscale;
        RaiseIfError(RunToCompletion({std::move(e)}));
      },
      py::arg("input"), py::arg("output"), py::arg("rows"), py::arg("row_elements"), py::arg("dtype"),
      py::arg("name"), py::arg("op"), py::arg("prescale") = 1.0, py::arg("postscale") = 1.0, py::arg("device") = 0,
      py::arg("stream") = 0, py::arg("process_set_id") = 0);
}

}  // namespace smdist_python
