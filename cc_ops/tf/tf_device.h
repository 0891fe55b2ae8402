// Where a kernel's tensors live, told to the engine. One kernel class serves
// both devices; the device is chosen at registration. CPU kernels leave the
// entry's device on the host. GPU kernels, registered only in a build with
// GOOGLE_CUDA (`cc_ops/build.py --gpu`), fill in the GPU's ordinal and the
// cudaStream_t behind TensorFlow's compute stream, as an opaque pointer. That
// handle is all a kernel takes from CUDA: the engine orders its GPU work on
// that stream and calls `done` once the work is enqueued there (kernels stay
// thin: no CUDA, NCCL or MPI calls here).
#pragma once

#include "common/device.h"
#include "common/tensor_entry.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/types.h"

#if GOOGLE_CUDA
#include "tensorflow/core/framework/device_base.h"
#include "xla/stream_executor/stream.h"
#include "xla/stream_executor/stream_executor.h"
#endif

namespace smdist {
namespace tf_bridge {

// True for a kernel instantiated for a GPU device. Always false without
// GOOGLE_CUDA: no GPU kernel is registered then.
inline bool IsGpuKernel(tensorflow::OpKernelConstruction* c) {
#if GOOGLE_CUDA
  return c->device_type() == tensorflow::DeviceType(tensorflow::DEVICE_GPU);
#else
  (void)c;
  return false;
#endif
}

// Sets `e->device` and `e->stream` for a GPU kernel; leaves a host entry as it is.
// `e->ready_event` stays null: the work is ordered on the stream.
inline absl::Status PlaceOnDevice(bool gpu_kernel, tensorflow::OpKernelContext* ctx, TensorEntry* e) {
#if GOOGLE_CUDA
  if (gpu_kernel) {
    tensorflow::DeviceContext* dc = ctx->op_device_context();
    stream_executor::Stream* s = dc == nullptr ? nullptr : dc->stream();
    if (s == nullptr || s->platform_specific_handle().stream == nullptr) {
      return absl::InternalError("smdist_tf: GPU kernel of '" + ctx->op_kernel().name() +
                                 "' has no CUDA stream");
    }
    // The stream executor's ordinal is the CUDA device ordinal of this process
    // (what the engine selects), which can differ from TensorFlow's GPU id.
    const int ordinal = s->parent()->device_ordinal();
    if (ordinal < 0) {
      return absl::InternalError("smdist_tf: GPU kernel of '" + ctx->op_kernel().name() +
                                 "' runs on a stream with no device ordinal");
    }
    e->device = Device::Gpu(ordinal);
    e->stream = s->platform_specific_handle().stream;
  }
#else
  (void)gpu_kernel;
  (void)ctx;
  (void)e;
#endif
  return absl::OkStatus();
}

}  // namespace tf_bridge
}  // namespace smdist
