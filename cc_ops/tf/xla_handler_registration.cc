// Registers the framework-free handlers of the smdist_collective custom call
// (cc_ops/xla/collective_handler.h) with TensorFlow's XLA, for the platforms
// this build lowers to: "Host" always, "CUDA" in the GPU variant.
#include "collective_call.h"
#include "collective_handler.h"
#include "xla/ffi/api/ffi.h"

namespace xla {
namespace ffi {
// XLA's FFI API inside this process (libtensorflow_cc exports it).
const XLA_FFI_Api* GetXlaFfiApi();
}  // namespace ffi
}  // namespace xla

XLA_FFI_REGISTER_HANDLER(xla::ffi::GetXlaFfiApi(), smdist::xla_call::kTarget, "Host", smdist_xla_collective_host);
#if GOOGLE_CUDA
// No traits: without XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE, XLA never
// captures the call into a CUDA graph (it must negotiate every time it runs).
XLA_FFI_REGISTER_HANDLER(xla::ffi::GetXlaFfiApi(), smdist::xla_call::kTarget, "CUDA", smdist_xla_collective_cuda);
#endif
